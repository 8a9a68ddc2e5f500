#!/usr/bin/env bash
# Builds and runs the tests under sanitizers, each in its own build folder:
#   scripts/sanitize.sh address   -> build-asan  (-fsanitize=address,undefined), all tests
#   scripts/sanitize.sh thread    -> build-tsan  (-fsanitize=thread), the threaded layers' tests
# Default: both.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(address thread)
for m in "${modes[@]}"; do
  case "$m" in
    address)
      BUILD_DIR=build-asan scripts/build.sh -DKVPUSH_SANITIZE=address,undefined -DKVPUSH_BUILD_BENCH=OFF \
        -DCMAKE_BUILD_TYPE=Debug
      (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --output-on-failure --timeout 900 -j2) ;;
    thread)
      BUILD_DIR=build-tsan scripts/build.sh -DKVPUSH_SANITIZE=thread -DKVPUSH_BUILD_BENCH=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo
      supp="$PWD/tests/tsan.supp"
      (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$supp" \
        ctest --output-on-failure --timeout 900 -j2 -L 'xfer|engine|server') ;;
    *) echo "unknown mode $m (address|thread)" >&2; exit 2 ;;
  esac
done
