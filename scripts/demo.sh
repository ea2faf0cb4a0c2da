#!/usr/bin/env bash
# The main job: set up (first run only) and run the end-to-end demo on the built-in toy model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/specexit demo "$@"
