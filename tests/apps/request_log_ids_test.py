#!/usr/bin/env python3
"""The request id on every log line about a request (issue 23 item 5; docs/server.md "Logs").

A router, a prefill and a decode instance run at --log-level debug: the router and P with
--log-format json, D with text. Requests go through the router in push and in pull, streamed and
not, with a client x-request-id and without one (the router mints it). For each request the test
finds its transfer id in the router's debug line, then checks, in every process's log, that every
line mentioning the request id or the transfer id carries the request id as its own field (json:
"request_id"; text: "[req ID] "), and that each process wrote such lines: the router's legs, P's
and D's connector lines about the transfer, their access lines. A request straight to D (no router)
is tagged with its own x-request-id too.
Exit 77 (skipped) without the model.

    tests/apps/request_log_ids_test.py --kvpush build/apps/kvpush \\
        --model ../shared/models/stories260K.gguf
"""

import argparse
import http.client
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "request_log_ids"
FAILURES = h.FAILURES
check = h.check
PROMPT = "Once upon a time there was a little girl who lived in a village near the forest and she"


def send(port, body, mode=None, request_id=None):
    headers = {"Content-Type": "application/json"}
    if mode:
        headers["x-kvpush-mode"] = mode
    if request_id:
        headers["x-request-id"] = request_id
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(body), headers)
    r = c.getresponse()
    r.read()
    rid = r.getheader("x-request-id")
    c.close()
    return r.status, rid


TEXT_LINE = re.compile(r"^\[[^\]]+\] \[[a-z]+\] \[t\d+\] (?:\[req (\S+)\] )?(.*)$")


def parse_log(path):
    """[(request_id or None, message, raw line)] of one process's log."""
    out = []
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("{"):
            doc = json.loads(line)
            out.append((doc.get("request_id"), doc["message"], line))
            continue
        m = TEXT_LINE.match(line)
        if m:
            out.append((m.group(1), m.group(2), line))
    return out


def check_request(logs, rid, tid, label):
    for name, lines in logs.items():
        about = [(got, msg, raw) for got, msg, raw in lines if rid in msg or (tid and tid in msg)]
        wrong = [raw for got, msg, raw in about if got is None or
                 (got != rid and not got.startswith(rid + "-"))]
        check(about and not wrong, "%s: %s wrote %d line(s) about the request, each with its id%s"
              % (label, name, len(about), "" if not wrong else ": untagged " + str(wrong[:3])))
        if name in ("p", "d"):
            connector = [m for got, m, _ in about if m.startswith("kv connector:")]
            check(connector, "%s: %s's connector lines about transfer %s are tagged (%d)"
                  % (label, name, tid, len(connector)))


def run(args, logdir):
    model_name = os.path.basename(args.model)
    pp, dp, rp = (h.free_port() for _ in range(3))
    procs = []

    def serve(name, argv, port):
        inst = h.Instance(name, argv + ["--log-level", "debug"], "127.0.0.1", port, logdir,
                          args.kvpush)
        inst.start()
        procs.append(inst)
        return inst

    cases = []
    try:
        cfg = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
        p = serve("p", ["serve", args.model, "--port", str(pp), "--log-format", "json",
                        "--kv-transfer-config", cfg % "kv_producer"], pp)
        d = serve("d", ["serve", args.model, "--port", str(dp), "--kv-transfer-config",
                        cfg % "kv_consumer"], dp)
        serve("router", ["router", "--port", str(rp), "--prefill", p.url, "--decode", d.url,
                        "--log-format", "json"], rp)
        for inst in procs:
            if not inst.wait_healthy(90):
                raise SystemExit("%s did not become healthy" % inst.name)
        for i, (mode, stream, given) in enumerate([("push", False, True), ("push", True, False),
                                                   ("pull", False, False), ("pull", True, True)]):
            body = {"model": model_name, "prompt": "Case %d. %s" % (i, PROMPT), "max_tokens": 8,
                    "temperature": 0, "stream": stream}
            want = "client-id-%d" % i if given else None
            status, rid = send(rp, body, mode, want)
            label = "%s/%s/%s" % (mode, "stream" if stream else "json",
                                  "client id" if given else "router's id")
            check(status == 200 and rid and (not want or rid == want),
                  "%s: 200 with x-request-id %s" % (label, rid))
            cases.append((rid, label))
        direct = "direct-to-d-1"
        status, _ = send(dp, {"model": model_name, "prompt": PROMPT, "max_tokens": 4},
                         request_id=direct)
        check(status == 200, "a request straight to D: 200")
    finally:
        h.stop_all(procs)
    logs = {i.name: parse_log(i.incarnations[-1]["log"]) for i in procs}
    router_lines = [m for _, m, _ in logs["router"]]
    for rid, label in cases:
        tid = None
        for m in router_lines:
            found = re.match(r"request (\S+): mode=\S+ transfer_id=([0-9a-f]{32})", m)
            if found and found.group(1) == rid:
                tid = found.group(2)
        check(tid is not None, "%s: the router's debug line names transfer %s" % (label, tid))
        check_request(logs, rid, tid, label)
    d_direct = [(got, m) for got, m, _ in logs["d"] if direct in m]
    check(d_direct and all(got == direct for got, _ in d_direct),
          "D tags the lines of a request sent to it directly (%d)" % len(d_direct))
    untagged_access = [raw for name in logs for got, m, raw in logs[name]
                       if m.startswith("POST /v1/completions") and got is None]
    check(not untagged_access, "every access line carries its request id: %s"
          % untagged_access[:2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print("request_log_ids: SKIPPED: no model at %s (../shared/models)" % args.model)
        return 77
    logdir = tempfile.mkdtemp(prefix="kvpush-logids-")
    run(args, logdir)
    if FAILURES:
        print("request_log_ids: %d check(s) failed; logs in %s" % (len(FAILURES), logdir))
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    print("request_log_ids: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
