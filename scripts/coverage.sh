#!/usr/bin/env bash
# Line coverage of src/connector by the connector's unit tests alone (no processes: the
# TransferCore state-machine tests, the message/handshake/config/kv_transfer_params/peer-auth
# tests and the two in-process PdConnector tests over loopback), with gcov + gcovr (Debian: apt-get install gcovr).
#
#   scripts/coverage.sh            -> build-cov/, prints the per-file table and the total
#   CORE_ONLY=1 scripts/coverage.sh -> only connector_transfer_core_test (fake clock, no threads)
#
# The report also goes to $BUILD_DIR/coverage-connector.txt (and .json for scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cov}
command -v gcovr >/dev/null || { echo "coverage: gcovr not found (apt-get install gcovr)" >&2; exit 2; }
cmake -S . -B "$BUILD_DIR" -G Ninja -DKVPUSH_BUILD_TESTS=ON -DKVPUSH_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="--coverage -O0" \
  -DCMAKE_EXE_LINKER_FLAGS="--coverage" "$@" >/dev/null
targets=(connector_transfer_core_test)
if [ -z "${CORE_ONLY:-}" ]; then
  targets+=(connector_messages_test connector_handshake_test connector_config_test
            connector_peer_auth_test
            connector_pd_handshake_test connector_pd_integrity_test)
fi
ninja -C "$BUILD_DIR" -j"${JOBS:-$(nproc)}" "${targets[@]}"
find "$BUILD_DIR" -name '*.gcda' -delete
regex=$(IFS='|'; echo "${targets[*]}")
# Run the binaries directly (ctest names tests by GoogleTest case, not by binary).
for t in "${targets[@]}"; do
  "$BUILD_DIR/tests/connector/$t" --gtest_brief=1 >/dev/null || { echo "coverage: $t failed" >&2; exit 1; }
done
echo "coverage: ran ${regex//|/, }"
gcovr --root . --filter 'src/connector/' --object-directory "$BUILD_DIR" \
  --exclude-directories "$BUILD_DIR/CMakeFiles" \
  --txt "$BUILD_DIR/coverage-connector.txt" --json-summary "$BUILD_DIR/coverage-connector.json" \
  --print-summary
cat "$BUILD_DIR/coverage-connector.txt"
