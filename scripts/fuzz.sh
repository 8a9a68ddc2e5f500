#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (-fsanitize=fuzzer + address,undefined; the libraries get
# fuzzer-no-link coverage) into build-fuzz/ and runs each target for FUZZ_SECONDS (default 60).
#
#   scripts/fuzz.sh                      # every target, 60 s each
#   FUZZ_SECONDS=300 scripts/fuzz.sh gguf_fuzz
#
# Corpora grow in $BUILD_DIR/fuzz-corpus/<target>/ (seeded by fuzz_seeds); crashes land in
# $BUILD_DIR/fuzz-artifacts/<target>/ and make the script fail.
# To add a target: list it in fuzz/CMakeLists.txt and in TARGETS below (a seed directory
# <target>/ from fuzz_seeds is optional).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(gguf_fuzz spm_encode_fuzz bpe_encode_fuzz request_json_fuzz pd_message_fuzz)
# Per-target libFuzzer options (max input length etc.).
declare -A OPTIONS=(
  [gguf_fuzz]="-max_len=65536 -rss_limit_mb=4096"
  [spm_encode_fuzz]="-max_len=4096"
  [bpe_encode_fuzz]="-max_len=4096"
  [request_json_fuzz]="-max_len=8192 -dict=fuzz/request_json.dict"
  [pd_message_fuzz]="-max_len=4096"
)

if [[ $# -gt 0 ]]; then TARGETS=("$@"); fi
BUILD_DIR=${BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-2}

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" -DKVPUSH_SANITIZE=address,undefined \
  -DKVPUSH_BUILD_FUZZ=ON -DKVPUSH_BUILD_TESTS=OFF -DKVPUSH_BUILD_BENCH=OFF >/dev/null
ninja -C "$BUILD_DIR" -j"$JOBS" fuzz_seeds "${TARGETS[@]}"

SEEDS="$BUILD_DIR/fuzz-seeds"
"$BUILD_DIR/fuzz/fuzz_seeds" "$SEEDS"

status=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD_DIR/fuzz-corpus/$t"
  artifacts="$BUILD_DIR/fuzz-artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seed_dir=()
  [[ -d "$SEEDS/$t" ]] && seed_dir=("$SEEDS/$t")
  echo "== $t: ${FUZZ_SECONDS}s"
  if ! "$BUILD_DIR/fuzz/$t" ${OPTIONS[$t]:-} -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$corpus" "${seed_dir[@]}" 2>"$BUILD_DIR/fuzz-$t.log"; then
    echo "!! $t found a problem: see $BUILD_DIR/fuzz-$t.log and $artifacts/"
    tail -40 "$BUILD_DIR/fuzz-$t.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$BUILD_DIR/fuzz-$t.log" || true
    echo "   corpus: $(ls "$corpus" | wc -l) inputs"
  fi
done
exit $status
