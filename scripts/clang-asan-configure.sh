#!/usr/bin/env bash
# Configures DIR (default build-fuzz) as the one clang + ASan/UBSan build tree that both the
# libFuzzer targets (scripts/fuzz.sh) and the sanitized unit tests of the CI gate
# (scripts/sanitize.sh address with CLANG_ASAN_DIR) build in, so the gate compiles the libraries
# under ASan once, not twice (a second, gcc ASan tree took 735 s from scratch on a 2-core machine; 239 s here).
# Every library is compiled with -fsanitize=fuzzer-no-link (coverage for libFuzzer; inert in a
# gtest binary, whose ASan runtime provides the hooks); fuzz targets link -fsanitize=fuzzer.
# Nothing is built here: callers name their targets to ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-fuzz}
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" -DKVPUSH_SANITIZE=address,undefined \
  -DKVPUSH_BUILD_FUZZ=ON -DKVPUSH_BUILD_TESTS=ON -DKVPUSH_BUILD_BENCH=OFF >/dev/null
