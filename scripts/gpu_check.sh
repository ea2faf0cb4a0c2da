#!/usr/bin/env bash
# The GPU acceptance check (docs/runbook.md, "GPU acceptance check"): parity with the reference engine
# under GPU engine modes (CUDA graphs, async scheduling), the hook at Qwen3-4B's real shape with TP up
# to 2 in bf16, and the Serve endpoint on GPUs. Under ten minutes; writes JSON; exit 1 if a stage failed.
#
#   bash scripts/gpu_check.sh --out gpu_check.json
#   bash scripts/gpu_check.sh --smoke --out /tmp/gpu_check.json     # the same flow on the CPU build
#
# Needs the GPU stack (`SPECEXIT_STACK=gpu bash scripts/setup.sh`: the official `vllm` 0.32.x CUDA
# wheel). No network: the target is randomly initialised, the tokenizer ships in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 600 "$PY" scripts/gpu_check.py "$@"
