#!/usr/bin/env bash
# The test suite: set up (first run only), lint (ruff, import contracts), then run pytest (real Ray,
# real vLLM CPU engines). Arguments go to pytest:
#
#   bash scripts/test.sh                   everything (integration tests take a while)
#   bash scripts/test.sh tests/unit        the fast tests only: no Ray cluster, no vLLM engine, < 1 min
#   bash scripts/test.sh tests/integration/test_serve_app.py -k tp2
#
# Everything (no arguments) runs in two passes. First the test modules in parallel, one module per
# pytest-xdist worker (a module's fixtures own its Ray cluster and engines, so a module never spans two
# workers; most of a module's time is waiting on engine start-up and HTTP, which overlaps well), the
# longest (`slow`) modules first (tests/conftest.py orders them). Then,
# alone on the machine, the modules marked `serial`: timing under load, or default Ray ports.
# SPECEXIT_TEST_WORKERS sets the number of workers (default 2; 1 runs everything in one process).
# SPECEXIT_TEST_PROFILE=1 writes where the time went (per module, per fixture setup, every Ray cluster, vLLM
# engine and Serve application started, and how long each start took) to runs/test-profile/profile.json
# (tests/support/suite_profile.py; a folder instead of 1 puts it there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
pytest=(.venv/bin/python -m pytest -q -ra)
profile=(.venv/bin/python tests/support/suite_profile.py)
export SPECEXIT_TEST_PROFILE_COMMAND="bash scripts/test.sh $*"
"${profile[@]}" reset
if [ $# -gt 0 ]; then
  SPECEXIT_TEST_PASS=args exec "${pytest[@]}" --durations=20 "$@"
fi
workers="${SPECEXIT_TEST_WORKERS:-2}"
status=0
if [ "$workers" -le 1 ]; then
  SPECEXIT_TEST_PASS=one "${pytest[@]}" --durations=40 || status=$?
else
  SPECEXIT_TEST_PASS=parallel "${pytest[@]}" --durations=40 -n "$workers" --dist loadfile --no-loadscope-reorder \
    -m "not serial" || status=$?
  SPECEXIT_TEST_PASS=serial "${pytest[@]}" --durations=10 -m serial || status=$((status ? status : $?))
fi
exit "$status"
