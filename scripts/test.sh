#!/usr/bin/env bash
# The test command (README.md): installs what is missing, builds, runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
scripts/build.sh -DKVPUSH_BUILD_TESTS=ON -DKVPUSH_BUILD_BENCH=ON
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j"${CTEST_JOBS:-2}"
