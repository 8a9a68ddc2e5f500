#!/usr/bin/env bash
# Decode throughput and resident memory per weight storage type: for each of f32, f16, bf16, q8_0,
# q6_k and q4_k, writes a random model of the same shape (default: dim 1024, 8 layers, 16/8 heads,
# hidden 2816, vocab 32000, separate classifier; seed 1) and runs kvpush_model_dtype_bench on it in
# its own process (VmRSS, decode tok/s, read bandwidth and the bound, measured in that process).
#
#   bench/model_dtype.sh            # BUILD_DIR=build, RESULTS_DIR=bench-results/model-dtype
#   DTYPES="q8_0 q4_k" REPS=5 bench/model_dtype.sh
# Writes $RESULTS_DIR/<dtype>.json and prints one row per type. Figures: docs/benchmarks/model.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
RESULTS_DIR=${RESULTS_DIR:-bench-results/model-dtype}
MODELS_DIR=${MODELS_DIR:-$RESULTS_DIR/models}
DTYPES=${DTYPES:-f32 f16 bf16 q8_0 q6_k q4_k}
REPS=${REPS:-3}
STEPS=${STEPS:-16}
SHAPE=${SHAPE:---dim 1024 --layers 8 --heads 16 --kv-heads 8 --hidden 2816 --vocab 32000}

ninja -C "$BUILD_DIR" -j"${JOBS:-2}" kvpush_model_dtype_bench >/dev/null
BENCH="$BUILD_DIR/bench/model/kvpush_model_dtype_bench"
mkdir -p "$RESULTS_DIR" "$MODELS_DIR"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for t in $DTYPES; do
  model="$MODELS_DIR/$t.gguf"
  [[ -f "$model" ]] || "$BENCH" --gen "$model" --dtype "$t" $SHAPE
  "$BENCH" --model "$model" --context 64 --decode-steps "$STEPS" --reps "$REPS" \
    --json "$RESULTS_DIR/$t.json"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
