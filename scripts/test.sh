#!/usr/bin/env bash
# The test suite: set up (first run only), lint (ruff, import contracts), then run pytest (real Ray,
# real vLLM CPU engines). Arguments go to pytest:
#
#   bash scripts/test.sh                   everything (integration tests take a while)
#   bash scripts/test.sh tests/unit        the fast tests only: no Ray cluster, no vLLM engine, < 1 min
#   bash scripts/test.sh tests/integration/test_serve_tp.py -k tp2
#
# Everything (no arguments) runs in two passes. First the test modules in parallel, one module per
# pytest-xdist worker (a module's fixtures own its Ray cluster and engines, so a module never spans two
# workers; most of a module's time is waiting on engine start-up and HTTP, which overlaps well), the
# longest (`slow`) modules first (tests/conftest.py orders them). Then,
# alone on the machine, the modules marked `serial`: timing under load, or default Ray ports.
# SPECEXIT_TEST_WORKERS sets the number of workers (default 2; 1 runs everything in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
pytest=(.venv/bin/python -m pytest -q -ra)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" --durations=20 "$@"
fi
workers="${SPECEXIT_TEST_WORKERS:-2}"
if [ "$workers" -le 1 ]; then
  exec "${pytest[@]}" --durations=40
fi
status=0
"${pytest[@]}" --durations=40 -n "$workers" --dist loadfile --no-loadscope-reorder -m "not serial" || status=$?
"${pytest[@]}" --durations=10 -m serial || status=$((status ? status : $?))
exit "$status"
