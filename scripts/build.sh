#!/usr/bin/env bash
# Configures and builds kvpush into build/ (RelWithDebInfo). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
ninja -C "$BUILD_DIR" -j"${JOBS:-$(nproc)}"
