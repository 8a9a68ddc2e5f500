#!/usr/bin/env bash
# Runs clang-tidy (config: .clang-tidy) over kvpush's own sources using build/compile_commands.json.
# Usage: scripts/tidy.sh [files...]   (default: every .cc under src/ and apps/)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
[ -f "$BUILD_DIR/compile_commands.json" ] || scripts/build.sh
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(git ls-files 'src/*.cc' 'apps/*.cc'); fi
# -quiet prints only findings; WarningsAsErrors in .clang-tidy makes any finding fail.
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -quiet -p "$BUILD_DIR" 2>/dev/null
echo "clang-tidy: clean (${#files[@]} files)"
