#!/usr/bin/env bash
# The test suite: set up (first run only), lint (ruff, import contracts), then run pytest (real Ray,
# real vLLM CPU engines). Arguments go to pytest:
#
#   bash scripts/test.sh                   everything (integration tests take a while)
#   bash scripts/test.sh tests/unit        the fast tests only: no Ray cluster, no vLLM engine, < 1 min
#   bash scripts/test.sh tests/integration/test_serve_tp.py -k tp2
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -ra --durations=40 "$@"
