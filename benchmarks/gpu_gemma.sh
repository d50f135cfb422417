#!/usr/bin/env bash
# Issue 38's Gemma-2-2B-shaped attribution-graph bench (benchmarks/bench_graph_gemma.py) on a GPU
# machine with no network, from the project's root:
#
#   STEP=build bash benchmarks/gpu_gemma.sh   # builds the full-size bench (~9 GB) into SCRATCH
#   STEP=1024 bash benchmarks/gpu_gemma.sh    # 1,024 positions capped at 8,192 (target <= 60 s)
#   STEP=8192 bash benchmarks/gpu_gemma.sh    # 8,192 positions capped at 8,192 features (<= 10 min)
#
# one call each, on the same warm machine (the bench stays in SCRATCH); a smoke test of the whole
# path first, in about a minute: SCALE=0.05 SCRATCH=/tmp/gemma-small CASES=256:0:60 bash ...
#
# The wheels the machine lacks (TransformerLens 4.3 and its few dependencies) come from the shared
# gpu-graph-bench's fetch_wheels.sh, copied to .gpu-bench/ beside the project (docs/graphs.md, "GPU
# bench"); they are installed once into SITE with pip --no-index --no-deps --target. Settings: OUT
# (results: gemma_graph.json, run.log; default $OUT or .gemma-out), SCRATCH (the bench, default
# /tmp/gemma-bench: kept between calls on a warm machine), SITE, WHEELS (wheel folders), INTERP_SRC
# (the interp source imported, default this checkout), SCALE (1), DEVICE (cuda), CASES (overrides
# STEP's), EXTRA (more options for the bench, e.g. "--max-bytes 70GB" or "--batch 64"), PY.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/.gemma-out}" SCRATCH="${SCRATCH:-/tmp/gemma-bench}" SITE="${SITE:-/tmp/gemma-site}"
WHEELS="${WHEELS:-$ROOT/.gpu-bench/wheels-common $ROOT/.gpu-bench/wheels-interp}"
INTERP_SRC="${INTERP_SRC:-$ROOT}" PY="${PY:-python3}" STEP="${STEP:-build}"
case "$STEP" in  # N_POS:MAX_FEATURE_NODES:TARGET_S:LIMIT_S (the limit: loading included)
  build) DEFAULT_CASES="" ;;
  1024) DEFAULT_CASES="1024:8192:60:420" ;;
  8192) DEFAULT_CASES="8192:8192:600:590" ;;
  all) DEFAULT_CASES="1024:8192:60:420,8192:8192:600:900" ;;
  *) echo "STEP must be build, 1024, 8192 or all, got $STEP" >&2; exit 2 ;;
esac
CASES="${CASES:-$DEFAULT_CASES}"
mkdir -p "$OUT"
echo "== gemma graph bench, $(date -u '+%F %T UTC'), step $STEP, cases $CASES, scale ${SCALE:-1}"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | sed 's/^/  /'
echo "== disk: $(df -h "$(dirname "$SCRATCH")" | awk 'NR==2{print $4}') free for $SCRATCH; RAM $(free -g | awk '/^Mem/{print $7}') GiB available"
if [ ! -f "$SITE/.installed" ]; then
  wheels=()
  for d in $WHEELS; do [ -d "$d" ] && wheels+=("$d"/*.whl); done
  if [ ${#wheels[@]} -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}" || {
      echo "FAILED: installing ${#wheels[@]} wheels into $SITE"; exit 1; }
    touch "$SITE/.installed"
  fi
fi
export PYTHONPATH="$INTERP_SRC:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import interp, transformer_lens, transformers, torch; print('  interp', interp.__version__, interp.__file__,
'| transformers', transformers.__version__, '| torch', torch.__version__, torch.cuda.is_available())" || exit 1
# shellcheck disable=SC2086
"$PY" "$ROOT/benchmarks/bench_graph_gemma.py" "$OUT" --bench "$SCRATCH" --scale "${SCALE:-1}" \
  --device "${DEVICE:-cuda}" --cases "$CASES" ${EXTRA:-} 2>&1 | tee -a "$OUT/console.log"
echo "== results: $OUT/gemma_graph.json; each step's output: $OUT/run.log"
