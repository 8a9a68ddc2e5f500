#!/usr/bin/env bash
# Model throughput: prefill and decode tokens/s of the llama CPU executor (LlamaExecutor, called
# directly, no engine/HTTP) for stories260K and for the `kvpush gen-model` default model, at batch 1
# and 32, with the decode memory-bandwidth bound measured in the same run.
#
#   bench/model_throughput.sh            # RESULTS_DIR=bench-results/model, REPS=7
# Writes $RESULTS_DIR/<model>.json and prints one table per model. Figures: docs/benchmarks/model.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
RESULTS_DIR=${RESULTS_DIR:-bench-results/model}
REPS=${REPS:-7}
MODELS_DIR=${MODELS_DIR:-../shared/models}
GEMM=${GEMM:-fixed}

cmake -S . -B "$BUILD_DIR" -G Ninja -DKVPUSH_BUILD_BENCH=ON >/dev/null
ninja -C "$BUILD_DIR" -j"${JOBS:-2}" kvpush_model_bench
BENCH="$BUILD_DIR/bench/model/kvpush_model_bench"
mkdir -p "$RESULTS_DIR"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ -f "$MODELS_DIR/stories260K.gguf" ]]; then
  "$BENCH" --model "$MODELS_DIR/stories260K.gguf" --label stories260K --gemm "$GEMM" \
    --batches 1,32 --prompt-batch1 512 --prompt-batchn 64 --context 128 --decode-steps 32 \
    --reps "$REPS" --json "$RESULTS_DIR/stories260K.json"
else
  echo "stories260K.gguf not found in $MODELS_DIR (see ../shared/models/README.md); skipped"
fi
echo
"$BENCH" --model random --label gen-model-default --gemm "$GEMM" \
  --batches 1,32 --prompt-batch1 512 --prompt-batchn 64 --context 128 --decode-steps 16 \
  --reps "$REPS" --json "$RESULTS_DIR/gen-model-default.json"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
