#!/usr/bin/env bash
# The test suite: set up (first run only), then run pytest (real Ray, real vLLM CPU engines).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -ra "$@"
