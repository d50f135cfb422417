#!/usr/bin/env bash
# Issue 38's GPU figures in one device call, every step's output in its own file under $OUT (a
# call cut off at its limit still brings back what finished). From the project's root on a GPU
# machine with no network, with the shared gpu-graph-bench copied to .gpu-bench/ and its wheels
# fetched (docs/graphs.md, "GPU bench"):
#
#   INTERP_SRC=$PWD bash benchmarks/gpu_session.sh          # ~9 minutes: TOTAL seconds in all
#
# Steps, most important first, each under its own timeout and skipped when too little time is
# left: experiments/cuda_check.py; the 12-layer GPT-2-small bench against circuit-tracer (24, 128,
# 512 capped and 1,024 capped positions); interp alone at 4,096 positions capped at 8,192; the
# memory grid on CUDA (estimate against max_memory_allocated). The Gemma-2-2B-shaped bench has its
# own script (benchmarks/gpu_gemma.sh: build, then 1,024, then 8,192 positions, a call each).
# Settings: OUT (default .gpu-out), TOTAL (default 540), CASES (the GPT-2 bench's), SITE.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/.gpu-out}" SITE="${SITE:-/tmp/gpu-site}" T0=$(date +%s)
mkdir -p "$OUT"
left() { echo $((T0 + ${TOTAL:-540} - $(date +%s))); }
step() {  # step NAME SECONDS COMMAND...: run COMMAND into $OUT/NAME.log if SECONDS are left
  local name=$1 want=$2
  shift 2
  if [ "$(left)" -lt "$want" ]; then
    echo "== $name: skipped ($(left) s left, wants $want)" | tee -a "$OUT/summary.log"
    return
  fi
  echo "== $name ($(left) s left)" | tee -a "$OUT/summary.log"
  timeout "$want" "$@" >"$OUT/$name.log" 2>&1
  echo "   rc $? after $(($(date +%s) - T0)) s" | tee -a "$OUT/summary.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
  .gpu-bench/wheels-common/*.whl .gpu-bench/wheels-interp/*.whl >"$OUT/install.log" 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$ROOT:$SITE" PYTHONUNBUFFERED=1
step cuda_check 70 python3 experiments/cuda_check.py --device cuda --out "$OUT/cuda_check"
step gpt2_bench 330 env BUDGET_S=320 BENCH_NCTX=4096 OUT="$OUT/bench" INTERP_SRC="$ROOT" \
  SCRATCH=/tmp/gpu_graph_scratch \
  CASES="${CASES:-A:24:3072:256:0:40,C:128:3072:128:0:70,E:512:3072:256:8192:90,F:1024:3072:64:8192:150?}" \
  bash .gpu-bench/run.sh
B=/tmp/gpu_graph_scratch/bench-3072-L12
step interp_4096 100 python3 .gpu-bench/interp_run.py "$B" 4096 64 /tmp/none --device cuda \
  --max-feature-nodes 8192
step memory_grid 120 python3 benchmarks/bench_graph_memory.py --device cuda --kinds per-layer \
  --dtypes float32,bfloat16 --positions 64,512,2048 --uncapped-up-to 512 --cap 256
{
  grep -hE "agree|differ|crash" "$OUT/cuda_check.log" | grep -v ": agrees" | tail -3
  grep -hE "^  \{|CASE" "$OUT/gpt2_bench.log" | cut -c1-600
  grep -h "^{" "$OUT/interp_4096.log" | cut -c1-600
  tail -12 "$OUT/memory_grid.log"
} >>"$OUT/summary.log" 2>/dev/null
cat "$OUT/summary.log"
echo "== done in $(($(date +%s) - T0)) s; every step's output is in $OUT"
