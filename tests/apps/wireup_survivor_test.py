#!/usr/bin/env python3
"""A decode instance survives its peer dying while their KV connection wires up (issue 49 item 4;
docs/xfer.md "Wire-up").

A colocated reference, P, D1 and D2 (--backend, ucx:tcp by default) behind a router, on a
generated model. `--reps` times: a seeded stream runs on one D; after 30 events the router is asked
to move it (POST /admin/migrate: the other D, the target, and the source handshake and wire up
their KV connection while the move's first round starts) and the source is SIGKILLed, `delay`
sweeping 0..--max-delay-ms after the ask, or (--at-handshake) after the source logged its
handshake with the target, which lands the kill while the two agents wire up. Each time the target
must still run (no UCX abort: "got REP message", an assertion, or any exit) and the client's
stream must equal the colocated reference (the crash is continued as any other). The dead are
restarted before the next repetition. Prints one line per check and a total.

    tests/apps/wireup_survivor_test.py --kvpush build/apps/kvpush --reps 20 --at-handshake \
        --max-delay-ms 3
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import kvpush_harness as h  # noqa: E402
import continuation_test as ct  # noqa: E402  (its Cluster and stream helpers)

h.LOG_PREFIX = "wireup_survivor"

BODY = {"prompt": "tell me a story", "max_tokens": 200, "temperature": 0.7, "seed": 9,
        "stream": True, "logprobs": 2, "frequency_penalty": 0.3}


def survivor_death(inst):
    """Why `inst` (a survivor) is dead, or None while it runs."""
    if inst.proc.poll() is None:
        return None
    with open(inst.incarnations[-1]["log"], errors="replace") as f:
        text = f.read()
    if "got REP message" in text or "got REQ message" in text:
        return "UCX wireup abort (%s)" % ("REP" if "got REP" in text else "REQ")
    if "Assertion" in text:
        return "UCX assertion: " + text[text.find("Assertion"):][:120].splitlines()[0]
    return "exited with %s" % inst.proc.returncode


def handshakes(inst):
    """How many peers `inst`'s current process has handshaken with (its log's lines)."""
    with open(inst.incarnations[-1]["log"], errors="replace") as f:
        return f.read().count("kv connector: handshake with")


def one_move(router, d1, d2, rid, delay, at_handshake):
    """Streams BODY, moves it after 30 events and kills the source `delay` s after the ask (or,
    `at_handshake`, after the source logged its handshake with the target). Returns (status, raw,
    source or None, whether the source was seen handshaking)."""
    killed, seen = [], []

    def move_and_kill(source):
        before = handshakes(source)
        t = threading.Thread(target=ct.post, args=(router.port, "/admin/migrate",
                                                   {"request_id": rid}))
        t.start()
        if at_handshake:
            t_end = time.time() + 2.0
            while time.time() < t_end and handshakes(source) == before:
                time.sleep(0.0002)
        seen.append(handshakes(source) > before)
        time.sleep(delay)
        source.kill()
        killed.append(source)
        t.join()

    status, raw, _ = ct.stream_and_fail(router.port, "/v1/completions", BODY, [d1, d2],
                                        move_and_kill, {"x-request-id": rid}, after_events=30)
    return status, raw, (killed[0] if killed else None), bool(seen and seen[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-delay-ms", type=float, default=40.0)
    ap.add_argument("--backend", default="ucx:tcp", help="kv_connector_extra_config.backend")
    ap.add_argument("--at-handshake", action="store_true",
                    help="kill the source once it logged the handshake with the target, then "
                    "after the delay (0..--max-delay-ms)")
    args = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="kvpush-wireup-")
    model = os.path.join(logdir, "slow.gguf")
    subprocess.run([args.kvpush, "gen-model", "--out", model, "--context", "1024"], check=True,
                   stdout=subprocess.DEVNULL)
    cl = ct.Cluster(args, logdir, model)
    deaths = handshaken = 0
    try:
        cfg = ('{"kv_connector":"NixlConnector","kv_role":"%s",'
               '"kv_connector_extra_config":{"backend":"' + args.backend + '"}}')
        colo = cl.serve("colocated", ["serve", model])
        p = cl.serve("p", ["serve", model, "--kv-transfer-config", cfg % "kv_producer"])
        d1 = cl.serve("d1", ["serve", model, "--kv-transfer-config", cfg % "kv_consumer"])
        d2 = cl.serve("d2", ["serve", model, "--kv-transfer-config", cfg % "kv_consumer"])
        cl.wait([colo, p, d1, d2])
        router = cl.serve("router", ["router", "--prefill", p.url, "--decode", d1.url,
                                     "--decode", d2.url, "--health-interval-ms", "200"])
        cl.wait([router])
        _, ref = ct.post(colo.port, "/v1/completions", BODY)
        for i in range(args.reps):
            delay = args.max_delay_ms / 1000.0 * i / max(1, args.reps - 1)
            status, raw, source, shook = one_move(router, d1, d2, "wireup-%d" % i, delay,
                                                  args.at_handshake)
            if source is None:
                h.check(False, "rep %d: the stream ended before it could be moved" % i)
                continue
            target = d2 if source is d1 else d1
            death = survivor_death(target)
            deaths += death is not None
            h.check(death is None, "rep %d (kill %.1f ms after the %s): the surviving D runs "
                    "(%s)" % (i, delay * 1000, "handshake" if args.at_handshake else "move",
                              death or "alive"))
            handshaken += shook
            h.check(status == 200 and ct.same_stream(raw, ref),
                    "rep %d: the stream equals the colocated run (%d)" % (i, status))
            for inst in [source] + ([target] if death else []):
                inst.proc.wait(timeout=30)
                cl.restart(inst)
                ct.router_sees(router, inst.url, True)
    finally:
        h.stop_all(cl.procs)
    print("wireup_survivor: %d repetition(s), %d with a handshake seen before the kill, %d "
          "survivor death(s)" % (args.reps, handshaken, deaths))
    if h.FAILURES:
        print("wireup_survivor: %d check(s) failed; logs in %s" % (len(h.FAILURES), logdir))
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    print("wireup_survivor: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
