#!/usr/bin/env python3
"""The stream's gap when its decode instance dies, or is asked to move it, and the router
continues it on another one (issue 24; docs/benchmarks/continuation.md; docs/reliability.md
"Continuation" and "Migration").

Usage:
  bench/continuation_gap.py [--kvpush build/apps/kvpush] [--model ../shared/models/stories260K.gguf]
                            [--target stories|sim] [--contexts 64,128,256,448] [--trials 10]
                            [--fault kill|migrate] [--out FILE.json]

--fault migrate: instead of the SIGKILL, POST /admin/migrate moves the stream (the source stays
up). Two routers run over the same instances, one with --migration-transfer push (the source
pushes the context's KV: docs/reliability.md "Migration") and one with recompute (the new D
computes it); the trials alternate between them, so both are measured in one run. The KV moved
per migration is read from the instances' counters: the tokens the target took as pushed KV
(kvpush_prompt_tokens_transferred_total) and the bytes the source wrote
(vllm:nixl_bytes_transferred), against the context (prompt + output streamed before the move).
A third stream, sent straight to the source before the move, measures what the move costs the
source's other requests (its longest inter-token time from the ask to 50 ms after the switch).

Starts a router (push) over one P and two Ds: on stories260K (the CPU executor), or on the sim
executor (`--executor sim --sim-model qwen3-32b --sim-hw h200`: the engine, connector and router
are real, the model's step times modelled). Each trial: a bystander stream starts first (its D
is the one running a request), then the measured stream (a prompt of N token ids, new each trial
so that no prefix cache holds it; greedy, ignore_eos, max_tokens 200), which the router sends to
the other D (least outstanding). After its 8th event that D is SIGKILLed and the stream goes on
on the bystander's D (the router's continuation: prompt + generated tokens recomputed there, no
KV moved). Reader threads timestamp every event. Gap: the longest pause from the last event
before the kill on (events in flight at the kill arrive first; for a move, the longest pause
overlapping the switch, which the router's 200 to the ask marks); kill -> next event: from the
kill to the event ending that pause; decode step: the median inter-event time before the kill.
Other request's ITL: the bystander's longest inter-token time from the kill to 50 ms after the
continuation's first event, beside its median step before the kill (the cost to the target's
other requests; the source's are gone with it). Then the killed D is restarted. Reports per
context length p50 / p99 of each, and the load average. A trial whose stream ended before the
kill is dropped (counted).

Only the Python standard library is used.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
import kvpush_harness as h  # noqa: E402
import pd_bench_util as pbu  # noqa: E402  (read1_pieces, sse_events)

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


class Stream:
    """One streamed completion through the router, read on its own thread: `times` holds the
    arrival of each data event with a choice."""

    def __init__(self, router, body, request_id=None):
        """`router`: the router (or an instance, for a request straight to it)."""
        self.times = []
        self.conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=120)
        headers = {"Content-Type": "application/json"}
        if request_id:
            headers["x-request-id"] = request_id
        self.conn.request("POST", "/v1/completions", json.dumps(body), headers)
        self.resp = self.conn.getresponse()
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self):
        try:
            for now, ev in pbu.sse_events(pbu.read1_pieces(self.resp)):
                if ev.startswith(b"data: {") and b'"choices":[{' in ev:
                    self.times.append(now)
        except (OSError, ValueError, http.client.HTTPException):
            return  # closed by close()

    def wait_events(self, n, timeout=60.0):
        t_end = time.time() + timeout
        while len(self.times) < n and self.thread.is_alive() and time.time() < t_end:
            time.sleep(0.0005)
        return len(self.times) >= n

    def close(self):
        try:
            self.conn.sock.shutdown(2)
        except OSError:
            pass
        self.thread.join()
        self.conn.close()


def prompt(n_tokens, vocab, k):
    # A new prompt each trial: no instance's prefix cache holds it (nor its generated tokens).
    return [1 + ((i + 1) * 7919 + k * 104729) % (vocab - 2) for i in range(n_tokens)]


def kv_moved(ds):
    """Per D: (tokens it took as pushed KV, KV bytes it wrote to a peer)."""
    out = {}
    for d in ds:
        m = d.metrics(timeout=5.0) or {}
        out[d.url] = (m.get("kvpush_prompt_tokens_transferred_total", 0.0),
                      m.get("vllm:nixl_bytes_transferred_sum", 0.0))
    return out


def trial(router, ds, n_tokens, vocab, k, context_limit, fault):
    """One kill (or move). A bystander stream runs on one D first; the measured stream goes to
    the other (least outstanding), whose D is SIGKILLed (or asked to move it) after 8 events: the
    continuation lands on the bystander's D, whose inter-token time during it is the "other
    request's" cost."""
    by_body = {"prompt": prompt(8, vocab, k + 7), "temperature": 0, "ignore_eos": True,
               "stream": True, "max_tokens": min(1500, context_limit - 8)}
    bystander = Stream(router, by_body)
    bystander.wait_events(3)
    by_d = next((d for d in ds if running(d) > 0), None)
    body = {"prompt": prompt(n_tokens, vocab, k), "max_tokens": 200, "temperature": 0,
            "ignore_eos": True, "stream": True}
    rid = "cmpl-gap%032x" % (k * 7 + (fault == "migrate"))
    main = Stream(router, body, rid)
    main.wait_events(8)
    moved_before = kv_moved(ds) if fault == "migrate" else None  # after P's push of the prompt
    victim, t_kill, src_by, t_switch = None, None, None, None
    for inst in ds:
        if inst is not by_d and main.thread.is_alive() and running(inst) > 0:
            victim = inst
            if fault == "migrate":
                # Another request on the source, sent to it directly: what the move costs it.
                src_by = Stream(inst, dict(by_body, prompt=prompt(8, vocab, k + 11)))
                src_by.wait_events(6)
            t_kill = time.perf_counter()
            if fault == "kill":
                inst.kill()
            else:
                c = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
                c.request("POST", "/admin/migrate", json.dumps({"request_id": rid}),
                          {"Content-Type": "application/json"})
                answer = c.getresponse()
                answer.read()
                c.close()
                # The router answers once the new stream is relayed: the switch is just before.
                if answer.status == 200:
                    t_switch = time.perf_counter()
            break
    main.thread.join()
    bystander_alive = bystander.thread.is_alive()
    bystander.close()
    src_alive = src_by is not None and src_by.thread.is_alive()
    if src_by is not None:
        src_by.close()
    main.conn.close()
    if victim is None:
        return None, None
    times = main.times
    before = [t for t in times if t < t_kill]
    after = [t for t in times if t >= t_kill]
    if len(before) < 3 or not after:
        return None, victim
    steps = [b - a for a, b in zip(before, before[1:])]
    # The splice is the longest pause from the last event before the kill on (events already in
    # flight at the kill arrive back to back first); recovery: the kill -> the event after it.
    spliced = [before[-1]] + after
    pauses = [b - a for a, b in zip(spliced, spliced[1:])]
    i = max(range(len(pauses)), key=lambda j: pauses[j])
    if t_switch is not None:
        # A move: the longest pause overlapping the switch (the router's answer to the ask,
        # which comes once the new stream is relayed), not a later hiccup of the stream.
        near = [j for j in range(len(pauses))
                if spliced[j + 1] >= t_switch - 0.005 and spliced[j] <= t_switch + 0.2]
        if near:
            i = max(near, key=lambda j: pauses[j])
    row = {"gap_ms": pauses[i] * 1e3, "recovery_ms": (spliced[i + 1] - t_kill) * 1e3,
           "step_ms": statistics.median(steps) * 1e3, "events": len(times)}
    if moved_before is not None:
        moved_after = kv_moved(ds)
        row["kv_tokens_moved"] = sum(moved_after[u][0] - moved_before[u][0] for u in moved_after)
        row["kv_bytes_moved"] = sum(moved_after[u][1] - moved_before[u][1] for u in moved_after)
        # The context at the move: the prompt and the output the client had got.
        row["context_tokens"] = n_tokens + len(before)
    # The bystander on the continuation's D: its longest inter-token time from the kill to the
    # continuation's first event + 50 ms, against its median before the kill.
    bt = bystander.times
    b_before = [b - a for a, b in zip(bt, bt[1:]) if b < t_kill]
    t_end = spliced[i + 1] + 0.05
    b_during = [b - a for a, b in zip(bt, bt[1:]) if b >= t_kill and a <= t_end]
    if bystander_alive and by_d is not None and len(b_before) >= 3 and b_during:
        row["other_itl_ms"] = max(b_during) * 1e3
        row["other_step_ms"] = statistics.median(b_before) * 1e3
    # The request on the source: the same window (the first round runs on the source).
    if src_alive:
        st = src_by.times
        s_before = [b - a for a, b in zip(st, st[1:]) if b < t_kill]
        s_during = [b - a for a, b in zip(st, st[1:]) if b >= t_kill and a <= t_end]
        if len(s_before) >= 3 and s_during:
            row["source_itl_ms"] = max(s_during) * 1e3
            row["source_step_ms"] = statistics.median(s_before) * 1e3
    return row, victim


def summarize(rows, dropped):
    gaps = [r["gap_ms"] for r in rows]
    steps = [r["step_ms"] for r in rows]
    rec = [r["recovery_ms"] for r in rows]
    other = [r["other_itl_ms"] for r in rows if "other_itl_ms" in r]
    other_step = [r["other_step_ms"] for r in rows if "other_step_ms" in r]
    out = {"trials": len(rows), "dropped": dropped,
           "other_itl_p50_ms": pct(other, 50), "other_itl_p99_ms": pct(other, 99),
           "other_step_p50_ms": pct(other_step, 50), "other_trials": len(other),
           "gap_p50_ms": pct(gaps, 50), "gap_p99_ms": pct(gaps, 99),
           "recovery_p50_ms": pct(rec, 50), "recovery_p99_ms": pct(rec, 99),
           "step_p50_ms": pct(steps, 50),
           "gap_in_steps_p50": pct(gaps, 50) / max(pct(steps, 50), 1e-9)}
    src = [r["source_itl_ms"] for r in rows if "source_itl_ms" in r]
    if src:
        out["source_itl_p50_ms"] = pct(src, 50)
        out["source_itl_p99_ms"] = pct(src, 99)
        out["source_step_p50_ms"] = pct([r["source_step_ms"] for r in rows
                                         if "source_step_ms" in r], 50)
        out["source_trials"] = len(src)
    moved = [r for r in rows if r.get("kv_tokens_moved")]
    if moved:
        out["kv_tokens_p50"] = pct([r["kv_tokens_moved"] for r in moved], 50)
        out["context_p50"] = pct([r["context_tokens"] for r in moved], 50)
        out["kv_mib_p50"] = pct([r["kv_bytes_moved"] for r in moved], 50) / 2**20
        out["kv_moved_trials"] = len(moved)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", default=os.path.join(ROOT, "build", "apps", "kvpush"))
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models",
                                                    "stories260K.gguf"))
    ap.add_argument("--target", choices=["stories", "sim"], default="stories")
    ap.add_argument("--contexts", default="")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--fault", choices=["kill", "migrate"], default="kill")
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
        routers = {}
        for how in (["push", "recompute"] if a.fault == "migrate" else ["kill"]):
            routers[how] = serve("router-" + how, [
                "router", "--prefill", p.url, "--decode", ds[0].url, "--decode", ds[1].url,
                "--health-interval-ms", "200"] + (
                    ["--migration-transfer", how] if a.fault == "migrate" else []))
            routers[how].wait_healthy(30)
        if a.fault == "migrate":
            # Not measured: the first migration between two Ds handshakes them (once per pair
            # and incarnation; ~100 ms here), as the first P/D request does with its P.
            for j, router in enumerate(routers.values()):
                for k in range(2):
                    trial(router, ds, 32, vocab, 999000 + 10 * j + k, 512, a.fault)
        for n in contexts:
            rows = {how: [] for how in routers}
            dropped = {how: 0 for how in routers}
            for k in range(a.trials):
                for j, (how, router) in enumerate(routers.items()):  # alternated trial by trial
                    row, victim = trial(router, ds, n, vocab, k + 1000 * n + 100000 * j,
                                        40960 if a.target == "sim" else 512, a.fault)
                    if victim and a.fault == "kill":
                        victim.start()
                        victim.wait_healthy(90)
                        time.sleep(0.5)  # a health round of the router sees it again
                    if row is None:
                        dropped[how] += 1
                    else:
                        rows[how].append(row)
            for how in routers:
                key = "%d %s" % (n, how)
                results[key] = summarize(rows[how], dropped[how])
                r = results[key]
                h.log("context %5d, %s: gap p50 %.1f ms p99 %.1f ms (fault -> next event p50 "
                      "%.1f ms), decode step p50 %.2f ms (gap = %.1f steps), %d trials (%d "
                      "dropped)" % (n, how, r["gap_p50_ms"], r["gap_p99_ms"],
                                    r["recovery_p50_ms"], r["step_p50_ms"],
                                    r["gap_in_steps_p50"], r["trials"], dropped[how]))
    finally:
        h.stop_all(procs)
    load = os.getloadavg()
    print("target %s, fault %s; load average %.2f %.2f %.2f" % ((a.target, a.fault) + load))
    print("| context (tokens) | continuation | gap p50 (ms) | gap p99 (ms) | fault -> next event "
          "p50 / p99 (ms) | decode step p50 (ms) | gap / step | other request's longest ITL "
          "p50 / p99 (ms), its step | source's other request: the same | KV moved: tokens of "
          "the context, MiB (p50) | trials |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, r in results.items():
        n, how = key.split()
        moved = ("%d of %d, %.2f" % (r["kv_tokens_p50"], r["context_p50"], r["kv_mib_p50"])
                 if r.get("kv_tokens_p50") is not None else "0 (recomputed)")
        src = ("%.1f / %.1f, %.2f (%d)" % (r["source_itl_p50_ms"], r["source_itl_p99_ms"],
                                           r["source_step_p50_ms"], r["source_trials"])
               if r.get("source_trials") else "n/a")
        print("| %s | %s | %.1f | %.1f | %.1f / %.1f | %.2f | %.1f | %s | %s | %s | %d |" % (
            n, how, r["gap_p50_ms"], r["gap_p99_ms"], r["recovery_p50_ms"], r["recovery_p99_ms"],
            r["step_p50_ms"], r["gap_in_steps_p50"],
            ("%.1f / %.1f, %.2f (%d)" % (r["other_itl_p50_ms"], r["other_itl_p99_ms"],
                                         r["other_step_p50_ms"], r["other_trials"]))
            if r["other_trials"] else "n/a (it ended first)", src, moved, r["trials"]))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"target": a.target, "load": load, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
