#!/usr/bin/env bash
# What a lent GPU machine with PyTorch and transformers alone (no vLLM, no network) measures for this
# project, in one run of under ten minutes, each part writing its JSON as it goes:
#   1. draft training memory and time at the GPU recipes' real shapes (scripts/gpu_train_probe.py;
#      docs/runbook.md, "Draft training memory and time");
#   2. TokenSwift's faithful engine at 1K, 4K and 16K generated tokens on the long writer
#      (scripts/gpu_longgen.py; docs/longgen.md, "On a GPU").
#
#   bash scripts/gpu_lent_check.sh OUTDIR             # the GPU machine
#   SMOKE=1 bash scripts/gpu_lent_check.sh /tmp/lent  # the same flow on CPU, tiny shapes
#
# Where pydantic is missing (the lent image), the wheels carried in .whl/ (pydantic and its dependencies;
# docs/runbook.md) are installed into /tmp/site first. Exit 1 if a part failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: bash scripts/gpu_lent_check.sh OUTDIR}
PY=${PYTHON:-python3}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ! "$PY" -c "import pydantic" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
smoke=()
[ -n "${SMOKE:-}" ] && smoke=(--smoke)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUTDIR/nvidia_smi.csv" 2>&1 || true
rc=0
total=${TOTAL_S:-560} # the whole run; the training probe gets at most PROBE_S of it, the long generation the rest
timeout "${PROBE_S:-250}" "$PY" scripts/gpu_train_probe.py "${smoke[@]}" --warmup 1 --steps 3 \
  --out "$OUTDIR/gpu_train_probe.json" 2>&1 | tee "$OUTDIR/gpu_train_probe.log" || rc=1
left=$((total - SECONDS))
# the rows' budget leaves ~100 s for training the heads and a margin; a length that would not fit is skipped
timeout "$left" "$PY" scripts/gpu_longgen.py "${smoke[@]}" --budget-s $((left > 160 ? left - 100 : 60)) \
  --out "$OUTDIR/gpu_longgen.json" 2>&1 | tee "$OUTDIR/gpu_longgen.log" || rc=1
echo "gpu_lent_check: ${SECONDS} s, rc $rc"
exit $rc
