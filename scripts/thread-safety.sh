#!/usr/bin/env bash
# Checks the lock rules written as Clang thread-safety annotations (src/common/thread_annotations.h:
# GUARDED_BY, REQUIRES, EXCLUDES, ...) by compiling the annotated translation units with clang++
# -fsyntax-only -Wthread-safety -Werror=thread-safety, with the flags of build/compile_commands.json
# (the compiler swapped for clang++). Compile only, nothing is linked; about a second per file.
# Usage: scripts/thread-safety.sh [files...]
#   default: every .cc under src/ and tests/ that holds annotated code: it takes a MutexLock or
#   states AssertHeld, includes a backend's *_internal.h, or its own header includes
#   common/mutex.h or xfer/progress_shell.h; and every .cc under src/ that includes a src/ header
#   which does (its inline lock code is compiled there). Today: the transfer agent and its
#   backends, the connector shell, peers, peer auth, discovery, the engine's queue and output
#   channels, the HTTP front door, the server and the router.
# BUILD_DIR (default build) must hold compile_commands.json (scripts/build.sh exports it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
CLANGXX=${CLANGXX:-clang++}
command -v "$CLANGXX" >/dev/null || { echo "thread-safety: $CLANGXX not found" >&2; exit 1; }
[ -f "$BUILD_DIR/compile_commands.json" ] || scripts/build.sh -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
exec python3 - "$BUILD_DIR/compile_commands.json" "$CLANGXX" "$@" <<'PY'
import json, os, re, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

db_path, clangxx, files = sys.argv[1], sys.argv[2], sys.argv[3:]
root = os.getcwd()
annotated_header = re.compile(r'#include "(common/mutex\.h|xfer/progress_shell\.h)"')
annotated_code = re.compile(r'\bMutexLock\b|\bAssertHeld\(|#include "[a-z_/]*_internal\.h"')

# src/ headers that declare annotated state (they include common/mutex.h or the progress shell):
# a source file under src/ that includes one compiles that header's inline lock code too.
annotated_src_headers = set()
for d, _, names in os.walk("src"):
    for n in names:
        if n.endswith(".h"):
            path = os.path.join(d, n)
            if annotated_header.search(open(path, errors="replace").read()):
                annotated_src_headers.add(os.path.relpath(path, "src"))
project_include = re.compile(r'#include "([a-z_]+/[a-z_0-9]+\.h)"')

def includes_annotations(cc):
    text = open(cc, errors="replace").read()
    if annotated_code.search(text) or annotated_header.search(text):
        return True
    h = cc[:-3] + ".h"
    if os.path.exists(h) and annotated_header.search(open(h, errors="replace").read()):
        return True
    return cc.startswith("src/") and any(
        inc in annotated_src_headers for inc in project_include.findall(text))

db = {}
for e in json.load(open(db_path)):
    path = os.path.normpath(os.path.join(e["directory"], e["file"]))
    db[os.path.relpath(path, root)] = e
if not files:
    files = sorted(f for f in db if (f.startswith("src/") or f.startswith("tests/"))
                   and f.endswith(".cc") and includes_annotations(f))
missing = [f for f in files if os.path.normpath(f) not in db]
if missing:
    sys.exit("thread-safety: not in %s (not built with this configuration?): %s"
             % (db_path, " ".join(missing)))

def command(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [clangxx], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        # The build's own warning flags are GCC's; only the thread-safety ones matter here.
        if a in ("-c", "-MD", "-MMD") or a.startswith("-fsanitize") or a.startswith("-W"):
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]

def check(f):
    e = db[os.path.normpath(f)]
    r = subprocess.run(command(e), cwd=e["directory"], capture_output=True, text=True)
    return f, r.returncode, r.stderr

failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for f, rc, err in pool.map(check, files):
        if rc != 0:
            failed += 1
            sys.stderr.write("thread-safety: %s\n%s" % (f, err))
if failed:
    sys.exit("thread-safety: %d of %d files fail" % (failed, len(files)))
print("thread-safety: clean (%d files: %s)" % (len(files), " ".join(files)))
PY
