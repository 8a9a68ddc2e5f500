#!/usr/bin/env python3
"""The stream's gap when its decode instance dies and the router continues it on another one
(issue 24 item 3; docs/benchmarks/continuation.md; docs/reliability.md "Continuation").

Usage:
  bench/continuation_gap.py [--kvpush build/apps/kvpush] [--model ../shared/models/stories260K.gguf]
                            [--target stories|sim] [--contexts 64,128,256,448] [--trials 10]
                            [--out FILE.json]

Starts a router (push) over one P and two Ds: on stories260K (the CPU executor), or on the sim
executor (`--executor sim --sim-model qwen3-32b --sim-hw h200`: the engine, connector and router
are real, the model's step times modelled). Each trial: one streamed request (a prompt of N token
ids, greedy, ignore_eos, max_tokens 200) through the router; when 8 events have arrived, the D
running it (vllm:num_requests_running > 0) is SIGKILLed and the client's stream goes on on the
other D (the router's continuation: prompt + generated tokens recomputed there, no KV moved). The
gap is the time between the last event before the kill and the first after it, as the client
reads them; the decode step is the median inter-event time of the same stream away from the
kill. Then the killed D is restarted. Reports per context length the gap's p50 / p99 and the
gap in decode steps, and the load average. A trial whose stream ended before the kill is
dropped (counted).

Only the Python standard library is used.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "continuation_gap"


def pct(values, p):
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def running(inst):
    m = inst.metrics(timeout=2.0) or {}
    return m.get("vllm:num_requests_running", 0.0)


def trial(router, ds, n_tokens, vocab):
    body = {"prompt": [1 + (i * 7919) % (vocab - 2) for i in range(n_tokens)],
            "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    c = http.client.HTTPConnection("127.0.0.1", router.port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    times, buf, victim, kill_at = [], b"", None, None
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: {") and b'"choices":[{' in ev:
                times.append(now)
        if victim is None and len(times) >= 8:
            for inst in ds:
                if running(inst) > 0:
                    victim = inst
                    kill_at = len(times)
                    inst.kill()
                    break
            if victim is None:
                victim = False
    c.close()
    if not victim:
        return None, None
    # The gap: the largest inter-event time from the kill on; the step: the median before it.
    before = [b - a for a, b in zip(times[:kill_at], times[1:kill_at])]
    after = [b - a for a, b in zip(times[kill_at - 1:], times[kill_at:])]
    if not after or not before:
        return None, victim
    return {"gap_ms": max(after) * 1e3, "step_ms": statistics.median(before) * 1e3,
            "events": len(times)}, victim


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", default=os.path.join(ROOT, "build", "apps", "kvpush"))
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models",
                                                    "stories260K.gguf"))
    ap.add_argument("--target", choices=["stories", "sim"], default="stories")
    ap.add_argument("--contexts", default="")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    contexts = [int(x) for x in (a.contexts or ("64,128,256,448" if a.target == "stories"
                                                 else "64,500,1000,2000")).split(",")]
    logdir = tempfile.mkdtemp(prefix="kvpush-contgap-")
    cfg = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
    model = ["--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200",
             "--sim-kv-scale", "0.01"] if a.target == "sim" else [a.model]
    vocab = 151936 if a.target == "sim" else 512
    procs = []

    def serve(name, argv):
        port = h.free_port()
        inst = h.Instance(name, argv + ["--port", str(port), "--log-level", "warning"],
                          "127.0.0.1", port, logdir, a.kvpush)
        inst.start()
        procs.append(inst)
        return inst

    results = {}
    try:
        p = serve("p", ["serve"] + model + ["--kv-transfer-config", cfg % "kv_producer"])
        ds = [serve("d%d" % i, ["serve"] + model + ["--kv-transfer-config", cfg % "kv_consumer"])
              for i in (1, 2)]
        for inst in [p] + ds:
            if not inst.wait_healthy(90):
                raise SystemExit("%s did not start: %s" % (inst.name,
                                                           h.tail(inst.incarnations[-1]["log"])))
        router = serve("router", ["router", "--prefill", p.url, "--decode", ds[0].url, "--decode",
                                  ds[1].url, "--health-interval-ms", "200"])
        router.wait_healthy(30)
        for n in contexts:
            rows, dropped = [], 0
            for _ in range(a.trials):
                row, victim = trial(router, ds, n, vocab)
                if victim:
                    victim.start()
                    victim.wait_healthy(90)
                    time.sleep(0.5)  # a health round of the router sees it again
                if row is None:
                    dropped += 1
                    continue
                rows.append(row)
            gaps = [r["gap_ms"] for r in rows]
            steps = [r["step_ms"] for r in rows]
            results[n] = {"trials": len(rows), "dropped": dropped,
                          "gap_p50_ms": pct(gaps, 50), "gap_p99_ms": pct(gaps, 99),
                          "step_p50_ms": pct(steps, 50),
                          "gap_in_steps_p50": pct(gaps, 50) / max(pct(steps, 50), 1e-9)}
            h.log("context %5d: gap p50 %.1f ms p99 %.1f ms, decode step p50 %.2f ms "
                  "(gap = %.1f steps), %d trials (%d dropped)" % (
                      n, results[n]["gap_p50_ms"], results[n]["gap_p99_ms"],
                      results[n]["step_p50_ms"], results[n]["gap_in_steps_p50"], len(rows),
                      dropped))
    finally:
        h.stop_all(procs)
    load = os.getloadavg()
    print("target %s; load average %.2f %.2f %.2f; KV bytes moved per continuation: 0 (the new "
          "D recomputes prompt + generated tokens)" % ((a.target,) + load))
    print("| context (tokens) | gap p50 (ms) | gap p99 (ms) | decode step p50 (ms) | gap / step | trials |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, r in results.items():
        print("| %d | %.1f | %.1f | %.2f | %.1f | %d |" % (n, r["gap_p50_ms"], r["gap_p99_ms"],
                                                        r["step_p50_ms"], r["gap_in_steps_p50"],
                                                        r["trials"]))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"target": a.target, "load": load, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
