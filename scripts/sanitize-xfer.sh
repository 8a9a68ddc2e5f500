#!/usr/bin/env bash
# Builds the transfer engine's tests with ThreadSanitizer and with AddressSanitizer+UBSan in their
# own build folders and runs the "xfer" ctest label in each (docs/xfer.md, "Sanitizers").
#   scripts/sanitize-xfer.sh            # both
#   scripts/sanitize-xfer.sh thread     # TSan only
#   scripts/sanitize-xfer.sh address    # ASan+UBSan only
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
JOBS="${JOBS:-2}"
TARGETS=(xfer_metadata_test xfer_agent_loopback_test xfer_multiprocess_test xfer_test_peer)
modes=("${1:-thread}")
if [ $# -eq 0 ]; then modes=(thread address); fi
for mode in "${modes[@]}"; do
  case "$mode" in
    thread) dir="$ROOT/build-xfer-tsan"; san="thread" ;;
    address) dir="$ROOT/build-xfer-asan"; san="address,undefined" ;;
    *) echo "unknown mode $mode (thread|address)"; exit 2 ;;
  esac
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVPUSH_SANITIZE="$san" -DKVPUSH_BUILD_BENCH=OFF >/dev/null
  ninja -C "$dir" -j"$JOBS" "${TARGETS[@]}"
  # UCX is not built with TSan: races inside libucs/libuct/libucp (its own async thread) are
  # suppressed; everything in kvpush code is checked. ASan: UCX's memory hooks conflict with ASan's
  # allocator interception, so they are turned off (UCX_MEM_MALLOC_HOOKS/EVENTS=no).
  export TSAN_OPTIONS="suppressions=$ROOT/tests/xfer/tsan.supp halt_on_error=1 second_deadlock_stack=1"
  export ASAN_OPTIONS="detect_leaks=1"
  export LSAN_OPTIONS="suppressions=$ROOT/tests/xfer/lsan.supp"
  export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
  export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no UCX_HANDLE_ERRORS=none
  (cd "$dir" && ctest -L xfer --output-on-failure -j1)
  echo "sanitize-xfer: $mode OK"
done
