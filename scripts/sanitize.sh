#!/usr/bin/env bash
# Builds and runs the tests under sanitizers, each mode in its own build folder:
#   scripts/sanitize.sh address   -> build-asan: -fsanitize=address,undefined, every test
#   scripts/sanitize.sh thread    -> build-tsan: -fsanitize=thread, the threaded layers' tests
#                                    (ctest labels xfer|engine|server|client|connector|router|pd)
# Default: both. LABELS=<ctest regex> narrows either mode (e.g. LABELS=xfer).
# TARGETS="<test binaries>" builds only those binaries and runs them directly (no ctest), e.g.
# the connector's state machine in the CI gate (scripts/test.sh):
#   TARGETS="connector_transfer_core_test connector_messages_test" scripts/sanitize.sh address
# With CLANG_ASAN_DIR=<dir> (address mode, TARGETS only) they are built in the fuzz targets'
# clang ASan/UBSan tree (scripts/clang-asan-configure.sh) instead of build-asan.
# Suppressions (third-party libraries only): tests/tsan.supp, tests/lsan.supp.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(address thread)
# UCX's malloc hooks fight the sanitizers' allocator interception; turn them off. UCX's own
# SIGSEGV handler would hide sanitizer reports.
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no UCX_HANDLE_ERRORS=none
export TSAN_OPTIONS="suppressions=$ROOT/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1"
export ASAN_OPTIONS="detect_leaks=1"
export LSAN_OPTIONS="suppressions=$ROOT/tests/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
for m in "${modes[@]}"; do
  case "$m" in
    address) dir=build-asan; san=address,undefined; labels=${LABELS:-.} ;;
    thread) dir=build-tsan; san=thread; labels=${LABELS:-xfer|engine|server|client|connector|router|pd} ;;
    *) echo "unknown mode $m (address|thread)" >&2; exit 2 ;;
  esac
  if [ -n "${TARGETS:-}" ]; then
    read -r -a targets <<<"$TARGETS"
    if [ "$m" = address ] && [ -n "${CLANG_ASAN_DIR:-}" ]; then
      # The fuzz targets' clang ASan/UBSan tree: its libraries are compiled once for both.
      dir=$CLANG_ASAN_DIR
      scripts/clang-asan-configure.sh "$dir"
    else
      cmake -S . -B "$dir" -G Ninja -DKVPUSH_SANITIZE=$san -DKVPUSH_BUILD_BENCH=OFF \
        -DKVPUSH_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    fi
    ninja -C "$dir" -j"${JOBS:-$(nproc)}" "${targets[@]}"
    for t in "${targets[@]}"; do
      bin=$(find "$dir/tests" -type f -name "$t" -perm -u+x | head -n1)
      [ -n "$bin" ] || { echo "sanitize: no test binary $t" >&2; exit 2; }
      "$bin" --gtest_brief=1 || { echo "sanitize: $m: $t failed" >&2; exit 1; }
    done
  else
    BUILD_DIR=$dir scripts/build.sh -DKVPUSH_SANITIZE=$san -DKVPUSH_BUILD_BENCH=OFF \
      -DKVPUSH_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
    (cd "$dir" && ctest --output-on-failure --timeout 900 -j"${CTEST_JOBS:-2}" -L "$labels")
  fi
  echo "sanitize: $m clean"
done
