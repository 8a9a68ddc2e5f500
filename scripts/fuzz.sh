#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (-fsanitize=fuzzer + address,undefined; the libraries get
# fuzzer-no-link coverage) into build-fuzz/ and runs each target for FUZZ_SECONDS (default 60).
#
#   scripts/fuzz.sh                      # every target, 60 s each ("all" says the same)
#   FUZZ_SECONDS=300 scripts/fuzz.sh gguf_fuzz
#   FUZZ_SECONDS=15 FUZZ_PARALLEL=2 scripts/fuzz.sh all   # what scripts/test.sh (CI) runs
#
# Corpora grow in $BUILD_DIR/fuzz-corpus/<target>/ (seeded by fuzz_seeds); a crash, leak, sanitizer
# report, timeout or abort()ed property lands in $BUILD_DIR/fuzz-artifacts/<target>/, is printed
# (path and base64, so a CI log alone reproduces it: base64 -d > crash; build-fuzz/fuzz/<target>
# crash) and makes the script fail. FUZZ_PARALLEL targets run at once (default 1).
# To add a target: list it in fuzz/CMakeLists.txt and in TARGETS below (a seed directory
# <target>/ from fuzz_seeds is optional; docs/fuzzing.md lists what each target asserts).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(gguf_fuzz spm_encode_fuzz bpe_encode_fuzz request_json_fuzz pd_message_fuzz block_list_fuzz
  xfer_metadata_fuzz notification_frame_fuzz eager_frame_fuzz handshake_fuzz transfer_status_fuzz
  kv_transfer_params_fuzz sse_fuzz
  prompt_list_fuzz client_body_fuzz discovery_fuzz request_head_fuzz)
# Per-target libFuzzer options (max input length etc.).
declare -A OPTIONS=(
  [gguf_fuzz]="-max_len=65536 -rss_limit_mb=4096"
  [spm_encode_fuzz]="-max_len=4096"
  [bpe_encode_fuzz]="-max_len=4096"
  [request_json_fuzz]="-max_len=8192 -dict=fuzz/request_json.dict"
  [pd_message_fuzz]="-max_len=4096"
  [block_list_fuzz]="-max_len=4096"
  [xfer_metadata_fuzz]="-max_len=16384"
  [notification_frame_fuzz]="-max_len=8192"
  [eager_frame_fuzz]="-max_len=8192"
  [handshake_fuzz]="-max_len=8192 -dict=fuzz/handshake.dict"
  [transfer_status_fuzz]="-max_len=8192 -dict=fuzz/transfer_status.dict"
  [kv_transfer_params_fuzz]="-max_len=8192 -dict=fuzz/kv_transfer_params.dict"
  [sse_fuzz]="-max_len=8192"
  [prompt_list_fuzz]="-max_len=8192 -dict=fuzz/prompt_list.dict"
  [client_body_fuzz]="-max_len=8192 -dict=fuzz/request_json.dict"
)

if [[ $# -gt 0 && "$*" != all ]]; then TARGETS=("$@"); fi
BUILD_DIR=${BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-2}
FUZZ_PARALLEL=${FUZZ_PARALLEL:-1}
# FUZZ_RUNS=N: N inputs per target from libFuzzer seed 1 instead of FUZZ_SECONDS — the same
# inputs on every machine, so a gate fails for a finding in its inputs, never at random.
if [[ -n "${FUZZ_RUNS:-}" ]]; then BOUND=(-runs="$FUZZ_RUNS" -seed=1); else
  BOUND=(-max_total_time="$FUZZ_SECONDS"); fi

# The clang ASan/UBSan tree, shared with the sanitized unit tests of the CI gate.
scripts/clang-asan-configure.sh "$BUILD_DIR"
ninja -C "$BUILD_DIR" -j"$JOBS" fuzz_seeds "${TARGETS[@]}"

SEEDS="$BUILD_DIR/fuzz-seeds"
"$BUILD_DIR/fuzz/fuzz_seeds" "$SEEDS"

# Runs one target; its report goes to $BUILD_DIR/fuzz-<target>.out (printed in order below).
run_target() {
  local t=$1 corpus="$BUILD_DIR/fuzz-corpus/$1" artifacts="$BUILD_DIR/fuzz-artifacts/$1"
  local out="$BUILD_DIR/fuzz-$1.out" log="$BUILD_DIR/fuzz-$1.log"
  mkdir -p "$corpus" "$artifacts"
  local seed_dir=()
  [[ -d "$SEEDS/$t" ]] && seed_dir=("$SEEDS/$t")
  {
    echo "== $t: ${BOUND[*]}"
    # -timeout: one input running this long is a finding (a hang), not a stalled CI job.
    if ! "$BUILD_DIR/fuzz/$t" ${OPTIONS[$t]:-} "${BOUND[@]}" -timeout=30 \
        -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "$corpus" "${seed_dir[@]}" 2>"$log"; then
      echo "!! $t found a problem: see $log and $artifacts/"
      tail -40 "$log"
      for f in "$artifacts"/*; do
        [[ -f "$f" ]] || continue
        echo "!! input $f ($(stat -c %s "$f") bytes), base64:"
        head -c 65536 "$f" | base64 -w 0
        echo
      done
      echo "!! FAILED"
    else
      grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
      echo "   corpus: $(ls "$corpus" | wc -l) inputs"
    fi
  } >"$out" 2>&1
}

pids=()
for t in "${TARGETS[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $FUZZ_PARALLEL ]]; do wait -n || true; done
  run_target "$t" &
  pids+=($!)
done
wait "${pids[@]}" || true

status=0
for t in "${TARGETS[@]}"; do
  cat "$BUILD_DIR/fuzz-$t.out"
  if grep -q "^!! FAILED" "$BUILD_DIR/fuzz-$t.out"; then status=1; fi
done
exit $status
