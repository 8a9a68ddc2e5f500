#!/usr/bin/env python3
"""Traces of P/D requests, decoded by a real OTLP implementation (issue 23 item 5;
docs/server.md "Traces").

A router, a prefill and a decode instance run with --otlp-traces-endpoint pointing at an OTLP/HTTP
receiver (tests/otlp/receiver.cjs) that decodes each export with OpenTelemetry JS's
ExportTraceServiceRequest (generated from opentelemetry-proto). Requests are sent in push and in
pull, streamed and not, with a client `traceparent` and without one. Checks, per request:
  - the router's server span continues the client's trace (same trace id, parent = the client's
    span id) or starts one (no parent);
  - P's and D's server spans are in the same trace, children of the router's span;
  - the router's leg spans, the instances' engine phases and the transfer's handoff phases are
    children of their process's span (P: prefill_compute; D: decode_kv_wait);
  - every export decoded (no decode error), and every span has start <= end.
Exit 77 (skipped) without the model, node, or the npm package (scripts/otlp-setup.sh).

    tests/apps/otlp_traces_test.py --kvpush build/apps/kvpush \\
        --model ../shared/models/stories260K.gguf --receiver tests/otlp/receiver.cjs
"""

import argparse
import http.client
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "otlp_traces"
FAILURES = h.FAILURES
check = h.check
PROMPT = "Once upon a time there was a little girl who lived in a village near the forest and she"


def send(port, body, mode, traceparent):
    headers = {"Content-Type": "application/json", "x-kvpush-mode": mode}
    if traceparent:
        headers["traceparent"] = traceparent
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(body), headers)
    r = c.getresponse()
    r.read()
    rid = r.getheader("x-request-id")
    c.close()
    return r.status, rid


def load_spans(path):
    spans, errors = [], []
    if os.path.exists(path):
        for line in open(path):
            doc = json.loads(line)
            (errors if "decode_error" in doc else spans).append(doc)
    return spans, errors


def check_request(spans, rid, mode, client_trace, client_span, label):
    """The spans of one request (found by the router's kvpush.request_id)."""
    roots = [s for s in spans if s["resource"].get("kvpush.role") == "router" and
             s["attributes"].get("kvpush.request_id") == rid and s["kind"] == 2]
    check(len(roots) == 1, "%s: one router server span" % label)
    if not roots:
        return
    root = roots[0]
    trace = root["traceId"]
    if client_trace:
        check(trace == client_trace and root["parentSpanId"] == client_span,
              "%s: the router's span continues the client's traceparent" % label)
    else:
        check(root["parentSpanId"] == "", "%s: without traceparent the router starts the trace"
              % label)
    check(root["attributes"].get("kvpush.mode") == mode, "%s: the router span names the mode"
          % label)
    in_trace = [s for s in spans if s["traceId"] == trace]
    for role, handoff in (("prefill", "handoff prefill_compute"), ("decode", "handoff decode_kv_wait")):
        mine = [s for s in in_trace if s["resource"].get("kvpush.role") == role]
        server = [s for s in mine if s["kind"] == 2]
        check(len(server) == 1 and server[0]["parentSpanId"] == root["spanId"],
              "%s: %s's server span is a child of the router's span" % (label, role))
        if not server:
            continue
        kids = {s["name"] for s in mine if s["parentSpanId"] == server[0]["spanId"]}
        check(handoff in kids and "engine prefill" in kids,
              "%s: %s's engine and handoff phases are children of its span: %s"
              % (label, role, sorted(kids)))
    legs = {s["name"] for s in in_trace if s["parentSpanId"] == root["spanId"]}
    check({"prefill leg", "decode leg"} <= legs, "%s: the router's legs are spans: %s"
          % (label, sorted(legs)))


def run(args, logdir):
    model_name = os.path.basename(args.model)
    out = os.path.join(logdir, "spans.jsonl")
    op, pp, dp, rp = (h.free_port() for _ in range(4))
    recv = subprocess.Popen(["node", args.receiver, str(op), out],
                            stdout=open(os.path.join(logdir, "receiver.log"), "w"),
                            stderr=subprocess.STDOUT)
    endpoint = "http://127.0.0.1:%d/v1/traces" % op
    procs = []

    def serve(name, argv, port):
        inst = h.Instance(name, argv + ["--otlp-traces-endpoint", endpoint], "127.0.0.1", port,
                          logdir, args.kvpush)
        inst.start()
        procs.append(inst)
        return inst

    cases = []
    try:
        cfg = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
        p = serve("p", ["serve", args.model, "--port", str(pp), "--kv-transfer-config",
                        cfg % "kv_producer"], pp)
        d = serve("d", ["serve", args.model, "--port", str(dp), "--kv-transfer-config",
                        cfg % "kv_consumer"], dp)
        serve("router", ["router", "--port", str(rp), "--prefill", p.url, "--decode", d.url], rp)
        for inst in procs:
            if not inst.wait_healthy(90):
                raise SystemExit("%s did not become healthy" % inst.name)
        for i, (mode, stream, traced) in enumerate([("push", False, True), ("push", True, True),
                                                    ("pull", False, True), ("pull", True, False)]):
            trace, span = secrets.token_hex(16), secrets.token_hex(8)
            body = {"model": model_name, "prompt": "Case %d. %s" % (i, PROMPT), "max_tokens": 8,
                    "temperature": 0, "stream": stream}
            status, rid = send(rp, body, mode, "00-%s-%s-01" % (trace, span) if traced else None)
            check(status == 200, "%s %s: 200" % (mode, "stream" if stream else "json"))
            cases.append((rid, mode, trace if traced else None, span if traced else None,
                          "%s/%s/%s" % (mode, "stream" if stream else "json",
                                        "traceparent" if traced else "no traceparent")))
    finally:
        h.stop_all(procs)  # SIGTERM: each process flushes its spans as it exits
        time.sleep(0.5)
        recv.terminate()
        recv.wait(timeout=10)
    spans, errors = load_spans(out)
    check(not errors, "every export decoded (%d decode errors: %s)" % (len(errors), errors[:2]))
    check(len(spans) > 0 and all(int(s["start"]) <= int(s["end"]) for s in spans),
          "%d spans decoded, each with start <= end" % len(spans))
    for rid, mode, trace, span, label in cases:
        check_request(spans, rid, mode, trace, span, label)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--receiver", required=True)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print("otlp_traces: SKIPPED: no model at %s (../shared/models)" % args.model)
        return 77
    module = os.path.join(os.path.dirname(args.receiver), "node_modules", "@opentelemetry",
                          "otlp-transformer")
    if shutil.which("node") is None or not os.path.isdir(module):
        print("otlp_traces: SKIPPED: node or @opentelemetry/otlp-transformer missing "
              "(scripts/otlp-setup.sh installs it)")
        return 77
    logdir = tempfile.mkdtemp(prefix="kvpush-otlp-")
    run(args, logdir)
    if FAILURES:
        print("otlp_traces: %d check(s) failed; logs in %s" % (len(FAILURES), logdir))
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    print("otlp_traces: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
