#!/usr/bin/env bash
# The main job (README.md): installs what is missing, builds, runs `kvpush demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
scripts/build.sh -DKVPUSH_BUILD_TESTS=OFF -DKVPUSH_BUILD_BENCH=OFF
exec "${BUILD_DIR:-build}/apps/kvpush" demo "$@"
