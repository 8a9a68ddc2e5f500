#!/usr/bin/env python3
"""The edges of continuation and of early answers, through the router with real processes
(issue 49; docs/router.md "Moves and failures" and "Retries", docs/server.md "Early answers").

A generated model slow enough to act mid-stream; a colocated instance as the oracle; P, D1, D2,
D3; a router over P, D1, D2 and one over P, D1, D2, D3.

1. A move is not a failure: a stream moved from its D (POST /admin/migrate) to the other one,
   whose D then is SIGKILLed, SIGSTOPped, or drained (SIGTERM): the stream goes on on the D it
   moved away from and equals the colocated run. Three successive moves over three decode
   instances: each answered 200, the third back to the first D; the stream equals colocated.
2. A streamed request whose D is SIGKILLed, or SIGSTOPped (then killed), before its first byte:
   sent again on another D (the router's retry), every answer 200 and equal to colocated.
3. Early answers: 401 (no key), 404, 405 and 413 with a body that is itself a request, sent raw
   to a router and to an instance started with --api-key, then an honest request on the same
   connection: exactly one response per request sent, the smuggled one never executed. A decode
   instance whose --api-key the router does not hold: 502 upstream_auth_failed, push and pull.

    tests/apps/continuation_edges_test.py --kvpush build/apps/kvpush
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
sys.path.insert(0, os.path.dirname(__file__))
import kvpush_harness as h  # noqa: E402
import continuation_test as ct  # noqa: E402

h.LOG_PREFIX = "continuation_edges"
check = h.check
CFG = '{"kv_connector":"NixlConnector","kv_role":"%s"}'


def continued_on(router, rid):
    """The instances the router's log says request `rid` was continued on, in order."""
    with open(router.incarnations[-1]["log"], errors="replace") as f:
        text = f.read()
    return re.findall(r"request %s: .*?; continuing on (\S+?)(?: with|$)" % re.escape(rid), text,
                      re.M)


def migrate(router, rid):
    status, raw = ct.post(router.port, "/admin/migrate", {"request_id": rid})
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {}


def restart_dead(cl, routers, insts):
    """Restarts every instance of `insts` a case failed (killed, stopped or drained) and waits
    until each of `routers` sees it healthy."""
    for inst in insts:
        if not getattr(inst, "_must_restart", False) and inst.proc.poll() is None:
            continue
        inst._must_restart = False
        if inst.stopped:
            inst.proc.send_signal(signal.SIGCONT)
            inst.stopped = False
        try:
            inst.proc.wait(timeout=10)  # a drained D exits by itself
        except subprocess.TimeoutExpired:
            pass
        cl.restart(inst)  # kills it first when it still runs
        for r in routers:
            ct.router_sees(r, inst.url, True)


def moved_then_failed(router2, d1, d2, body, ref, cl, routers):
    """Move A -> B by POST /admin/migrate, then fail B three ways: the stream ends on A."""
    n = 0
    for how in ("SIGKILL", "SIGSTOP", "SIGTERM"):
        n += 1
        rid = "edge-move-%s-%d" % (how.lower(), n)
        state = {}

        def act(_inst):
            status, ans = migrate(router2, rid)
            state["move"] = (status, ans)
            if status != 200:
                return
            target = d1 if ans.get("to") == d1.url else d2
            state["target"] = target
            state["source"] = d2 if target is d1 else d1
            # Let the stream run a little on B before B fails.
            time.sleep(0.15)
            if how == "SIGKILL":
                target.kill()
                target._must_restart = True
            elif how == "SIGSTOP":
                target.proc.send_signal(signal.SIGSTOP)
                target.stopped = True
                target._must_restart = True
            else:
                target.proc.send_signal(signal.SIGTERM)
                target._must_restart = True

        status, raw, victim = ct.stream_and_fail(router2.port, "/v1/completions", body,
                                                 [d1, d2], act, {"x-request-id": rid},
                                                 after_events=30)
        label = "moved A->B, then B %s" % how
        mv = state.get("move", (None, {}))
        check(mv[0] == 200, "%s: the move was made (%s)" % (label, mv))
        check(status == 200 and ct.same_stream(raw, ref),
              "%s: the stream equals the colocated run (%d, %d events)" % (
                  label, status, len(ct.parse_events(raw))))
        where = continued_on(router2, rid)
        src = state.get("source")
        check(src is not None and len(where) >= 2 and where[-1] == src.url,
              "%s: the stream went back to the D it moved away from (%s; source %s)" % (
                  label, where, src.url if src else None))
        restart_dead(cl, routers, [d1, d2])


def three_moves(router3, ds, body, ref):
    rid = "edge-three-moves"
    answers = []

    def act(_inst):
        for _ in range(3):
            answers.append(migrate(router3, rid))
            time.sleep(0.12)

    status, raw, _ = ct.stream_and_fail(router3.port, "/v1/completions", body, ds, act,
                                        {"x-request-id": rid}, after_events=20)
    label = "three successive moves over three decode instances"
    check(len(answers) == 3 and all(s == 200 for s, _ in answers),
          "%s: each move answered 200 (%s)" % (label, [(s, a.get("to")) for s, a in answers]))
    if len(answers) == 3 and all(s == 200 for s, _ in answers):
        check(answers[2][1].get("to") == answers[0][1].get("from"),
              "%s: the third move went back to the first D (%s)" % (label, answers))
    check(status == 200 and ct.same_stream(raw, ref),
          "%s: the stream equals the colocated run (%d)" % (label, status))


def fail_before_first_byte(router2, d1, body, ref, cl, mode, routers):
    """D1 fails right before streamed requests arrive: SIGKILL (its pooled connections reset),
    or SIGSTOP (the legs stall until the health checker cuts them), then SIGKILL."""
    for how in ("SIGKILL", "SIGSTOP"):
        # Pooled connections to both Ds first (a killed D's new connections would be refused,
        # which is retried already).
        for _ in range(4):
            ct.post(router2.port, "/v1/completions", dict(body, max_tokens=2, stream=False),
                    {"x-kvpush-mode": mode})
        retries = (router2.metrics() or {}).get("kvpush_router_retries_total", 0.0)
        if how == "SIGKILL":
            d1.kill()
        else:
            d1.proc.send_signal(signal.SIGSTOP)
            d1.stopped = True
        results = [None] * 4

        def one(i):
            results[i] = ct.post(router2.port, "/v1/completions", body,
                                 {"x-kvpush-mode": mode, "x-request-id":
                                  "edge-early-%s-%s-%d" % (mode, how.lower(), i)})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        label = "%s stream, D %s before its first byte" % (mode, how)
        ok = [s == 200 and ct.same_stream(raw, ref) for s, raw in results]
        check(all(ok), "%s: every stream equals the colocated run (%s)" % (
            label, [s for s, _ in results]))
        after = (router2.metrics() or {}).get("kvpush_router_retries_total", 0.0)
        if how == "SIGSTOP":
            # A stopped D stays healthy to the router until its health check times out: some of
            # the four go to it and are sent again.
            check(after > retries, "%s: the router sent some of them again (%s retries)" % (
                label, after - retries))
        else:
            # A killed D refuses its health check at once: the router may have excluded it
            # before any of the four was routed.
            h.log("%s: %s retries" % (label, after - retries))
        if how == "SIGSTOP":
            d1.kill()  # stopped, then killed
        d1._must_restart = True
        restart_dead(cl, routers, [d1])


def raw_exchange(port, data, timeout=10.0):
    """Sends `data` on one connection; returns everything received until the peer closed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    got = b""
    t_end = time.time() + timeout
    while time.time() < t_end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    s.close()
    return got.decode("latin-1")


def early_answers(label, port, key, body_limit):
    auth = "Authorization: Bearer %s\r\n" % key
    smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\n%s\r\n" % auth
    honest = "GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    cl = "Content-Length: %d\r\n" % len(smuggled)
    big = body_limit + 1
    cases = [
        ("401", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + cl + "\r\n" + smuggled, 401,
         False),
        ("401 chunked", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
         "\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled), 401, False),
        ("404", "POST /nowhere HTTP/1.1\r\nHost: x\r\n" + auth + cl + "\r\n" + smuggled, 404,
         False),
        ("405", "PUT /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + cl + "\r\n" + smuggled, 405,
         False),
        ("413", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth +
         "Content-Length: %d\r\n\r\n" % big + smuggled + " " * (big - len(smuggled)), 413, True),
    ]
    for name, req, status, closes in cases:
        # An answer that closes could meet an honest request sent along as a reset before its
        # answer was read: only the body's own smuggled request is sent then.
        got = raw_exchange(port, (req if closes else req + honest).encode("latin-1"))
        statuses = [int(m) for m in re.findall(r"HTTP/1\.1 (\d{3}) ", got) if m != "100"]
        want = [status] if closes else [status, 200]
        check(statuses == want and '"object":"list"' not in got,
              "%s, %s with a body that is itself a request: one response per request sent, "
              "the smuggled one not executed (%s)" % (label, name, statuses))


def wrong_key_decode(args, logdir, model):
    cl = ct.Cluster(args, logdir, model)
    try:
        p = cl.serve("p-key", ["serve", model, "--kv-transfer-config", CFG % "kv_producer"])
        d = cl.serve("d-key", ["serve", model, "--kv-transfer-config", CFG % "kv_consumer",
                               "--api-key", "not-the-routers"])
        colo = cl.serve("colo-key", ["serve", model, "--api-key", "k"])
        cl.wait([p, d, colo])
        router = cl.serve("router-key", ["router", "--prefill", p.url, "--decode", d.url,
                                         "--api-key", "k"])
        cl.wait([router])
        for mode in ("push", "pull"):
            for stream in (False, True):
                status, raw = ct.post(router.port, "/v1/completions",
                                      {"prompt": "hello world", "max_tokens": 4,
                                       "stream": stream},
                                      {"x-kvpush-mode": mode, "Authorization": "Bearer k"})
                check(status == 502 and "upstream_auth_failed" in raw and d.url in raw,
                      "%s%s: a D with another --api-key gives 502 upstream_auth_failed naming "
                      "it (%d %s)" % (mode, " stream" if stream else "", status, raw[:160]))
        early_answers("router", router.port, "k", 8 << 20)
        early_answers("instance", colo.port, "k", 8 << 20)
    finally:
        h.stop_all(cl.procs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    args = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="kvpush-continuation-edges-")
    model = os.path.join(logdir, "slow.gguf")
    subprocess.run([args.kvpush, "gen-model", "--out", model, "--context", "1024"], check=True,
                   stdout=subprocess.DEVNULL)
    cl = ct.Cluster(args, logdir, model)
    try:
        colo = cl.serve("colocated", ["serve", model])
        p = cl.serve("p", ["serve", model, "--kv-transfer-config", CFG % "kv_producer"])
        ds = [cl.serve("d%d" % i, ["serve", model, "--kv-transfer-config", CFG % "kv_consumer",
                                   "--drain-timeout-s", "1.5"]) for i in (1, 2, 3)]
        cl.wait([colo, p] + ds)
        router2 = cl.serve("router2", ["router", "--prefill", p.url, "--decode", ds[0].url,
                                       "--decode", ds[1].url, "--health-interval-ms", "200"])
        router3 = cl.serve("router3", ["router", "--prefill", p.url] +
                           sum([["--decode", d.url] for d in ds], []) +
                           ["--health-interval-ms", "200"])
        cl.wait([router2, router3])
        body = {"prompt": "hello world", "max_tokens": 300, "ignore_eos": True,
                "temperature": 0.9, "seed": 21, "logprobs": 1, "stream": True}
        _, ref = ct.post(colo.port, "/v1/completions", body)
        routers = [router2, router3]
        moved_then_failed(router2, ds[0], ds[1], body, ref, cl, routers)
        long_body = dict(body, max_tokens=800)
        _, long_ref = ct.post(colo.port, "/v1/completions", long_body)
        three_moves(router3, ds, long_body, long_ref)
        short = dict(body, max_tokens=40)
        _, short_ref = ct.post(colo.port, "/v1/completions", short)
        for mode in ("push", "pull"):
            fail_before_first_byte(router2, ds[0], short, short_ref, cl, mode, routers)
        check(ct.log_has(router2, "failed it before any byte reached the client"),
              "a stream whose D failed before its first byte was sent again (router log)")
    finally:
        h.stop_all(cl.procs)
    wrong_key_decode(args, logdir, model)
    if h.FAILURES:
        print("continuation_edges: %d check(s) failed; logs in %s" % (len(h.FAILURES), logdir))
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    print("continuation_edges: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
