#!/usr/bin/env python3
"""Runs every `sh` block of README.md's "Using it" section as written (issue 23: the quick start
works as pasted).

Each block runs in bash (`set -e`) from a scratch folder that holds `build/apps/kvpush` (a link to
the binary under test) and `../shared/models` (a link to the models), so the README's relative
paths resolve; `curl` fails on an HTTP error status (the block's output is checked too: no
OpenAI error object). Servers a block starts in the background are stopped when it ends. The two
top-level commands (scripts/demo.sh, scripts/test.sh) are not run here: CI runs the second, and
apps_demo_runs_end_to_end the first's job. Python 3 standard library only; exit 77 (skipped)
without the model.

    tests/apps/readme_blocks_test.py --readme README.md --kvpush build/apps/kvpush \\
        --models ../shared/models
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PRELUDE = r"""set -euo pipefail
curl() { command curl --fail-with-body --max-time 120 "$@"; echo; }
"""


def blocks(readme):
    text = open(readme).read()
    start = text.index("## Using it")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```sh\n(.*?)```", text[start:end], re.S)


def run_block(i, code, cwd, timeout):
    script = PRELUDE + code
    # A file, not a pipe: the block's background servers keep their stdout open after it ends.
    with tempfile.TemporaryFile(mode="w+") as log:
        p = subprocess.Popen(["bash", "-c", script], cwd=cwd, stdout=log,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        # The block's background servers share its session: stop them, then read what all wrote.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            if sig == signal.SIGTERM:
                time.sleep(2)
        p.wait()
        log.seek(0)
        out = log.read()
    ok = rc == 0 and '"error":' not in out
    print("readme block %d: %s (exit %s)" % (i, "ok" if ok else "FAILED", rc))
    if not ok:
        print("---- block %d:\n%s---- output:\n%s" % (i, code, out[-6000:]))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", required=True)
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--timeout-s", type=float, default=240)
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.models, "stories260K.gguf")):
        print("readme_blocks: SKIPPED: no stories260K.gguf in %s" % args.models)
        return 77
    root = tempfile.mkdtemp(prefix="kvpush-readme-")
    try:
        work = os.path.join(root, "work")
        os.makedirs(os.path.join(work, "build", "apps"))
        os.makedirs(os.path.join(root, "shared"))
        os.symlink(os.path.abspath(args.kvpush), os.path.join(work, "build", "apps", "kvpush"))
        os.symlink(os.path.abspath(args.models), os.path.join(root, "shared", "models"))
        found = blocks(args.readme)
        if not found:
            print("readme_blocks: no sh block under 'Using it'")
            return 1
        results = [run_block(i, b, work, args.timeout_s) for i, b in enumerate(found)]
        return 0 if all(results) else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
