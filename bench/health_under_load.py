#!/usr/bin/env python3
"""/health and /metrics latency with many streams in flight (docs/benchmarks/pd.md, "Health under
load"; issue 14 item 5).

Usage:
  bench/health_under_load.py [--streams 256] [--max-tokens 600] [--poll-ms 50]
                             [--backend ucx:tcp] [--out FILE.json]

Starts, with the sim executor (`--executor sim --sim-model qwen3-32b --sim-hw h200
--sim-kv-scale 0.01`, no model file; docs/sim.md): P and D with the push connector (D with
`--max-num-seqs` = --streams, so every stream runs) and a push router over them. Then opens
--streams streamed requests through the router at once (each `ignore_eos`, --max-tokens long, so
they stay open for seconds), and while they are open polls GET /health and GET /metrics of the
router, P and D from a separate process (its own GIL: the stream readers cannot delay a poll),
one poller thread per (target, path), each waiting --poll-ms between its requests, every request
on a fresh connection (as a health checker or Prometheus scraper makes
them). Reports per (target, path): polls, p50 / p99 / max latency (ms) and any non-200 answers,
counted only while at least --streams/2 streams were still open (also: when the slowest poll
started, seconds after the streams were opened, and how many polls took over 50 ms); and the
streams' outcome.

Only the Python standard library is used.
"""
import argparse
import http.client
import json
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_handoff as hb  # noqa: E402  (free_port, wait_healthy, pct)
from pd_router_overhead import prompt, read_stream  # noqa: E402

HOST = hb.HOST
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def poll(port, path, poll_ms, rows, stop, open_streams, t_start):
    """GET `path` on a fresh connection every poll_ms until `stop`; appends (ms, status, streams
    open, start time since t_start) to rows."""
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            c = http.client.HTTPConnection(HOST, port, timeout=30)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            status = r.status
            c.close()
        except Exception:  # noqa: BLE001 - recorded as status 0
            status = 0
        ms = (time.perf_counter() - t0) * 1e3
        rows.append((ms, status, open_streams.value, t0 - t_start.value))
        stop.wait(poll_ms / 1e3)


def poller_process(targets, poll_ms, open_streams, t_start, stop, out):
    """Runs in its own process (its own GIL: the 256 stream readers of the parent cannot delay
    a poll): one thread per (target, path); sends {(target, path): rows} through `out`."""
    samples = {k: [] for k in targets}
    threads = [threading.Thread(target=poll, args=(port, path, poll_ms, samples[(t, path)], stop,
                                                   open_streams, t_start))
               for (t, path), port in targets.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out.send(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpush", default=os.path.join(ROOT, "build", "apps", "kvpush"))
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=600)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--poll-ms", type=float, default=50.0)
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    sim = ["--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200",
           "--sim-kv-scale", "0.01", "--max-model-len", "4096", "--log-level", "warn"]
    cfg = json.dumps({"kv_connector_extra_config": {"backend": a.backend}})
    ports = {k: hb.free_port() for k in ("p", "d", "router")}
    procs = []

    def start(args, port):
        procs.append(subprocess.Popen([a.kvpush] + args + ["--host", HOST, "--port", str(port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return procs[-1]

    ctx = multiprocessing.get_context("fork")
    open_streams = ctx.Value("i", 0)
    lock = threading.Lock()
    stream_out = {"ok": 0, "non_200": 0, "stream_error": 0, "no_done": 0, "transport_error": 0}
    stop = ctx.Event()
    t_start = ctx.Value("d", time.perf_counter())

    def stream(body, gate):
        key = "ok"
        try:
            c = http.client.HTTPConnection(HOST, ports["router"], timeout=600)
            gate.wait()
            c.request("POST", "/v1/completions", json.dumps(body).encode(),
                      {"content-type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                key = "non_200"
            else:
                with open_streams.get_lock():
                    open_streams.value += 1
                try:
                    _, done, err = read_stream(r)
                finally:
                    with open_streams.get_lock():
                        open_streams.value -= 1
                key = "stream_error" if err else ("ok" if done else "no_done")
        except Exception:  # noqa: BLE001 - counted
            key = "transport_error"
        with lock:
            stream_out[key] += 1

    try:
        start(["serve"] + sim + ["--role", "prefill", "--kv-transfer-config", cfg], ports["p"])
        start(["serve"] + sim + ["--role", "decode", "--max-num-seqs", str(a.streams),
                                 "--kv-transfer-config", cfg], ports["d"])
        for k in ("p", "d"):
            hb.wait_healthy(ports[k], procs[0 if k == "p" else 1])
        start(["router", "--prefill", f"http://{HOST}:{ports['p']}", "--decode",
               f"http://{HOST}:{ports['d']}", "--log-level", "warn"], ports["router"])
        hb.wait_healthy(ports["router"], procs[2])

        rng = random.Random(a.seed)
        bodies = [{"prompt": prompt(rng, a.prompt_len), "max_tokens": a.max_tokens,
                   "temperature": 0, "ignore_eos": True, "stream": True}
                  for _ in range(a.streams)]
        gate = threading.Barrier(a.streams)
        streams = [threading.Thread(target=stream, args=(b, gate)) for b in bodies]
        targets = {(t, path): ports[t] for t in ("router", "p", "d")
                   for path in ("/health", "/metrics")}
        rx, tx = ctx.Pipe(duplex=False)
        t0 = time.perf_counter()
        t_start.value = t0
        pollers = ctx.Process(target=poller_process,
                              args=(targets, a.poll_ms, open_streams, t_start, stop, tx))
        pollers.start()
        for t in streams:
            t.start()
        for t in streams:
            t.join()
        wall = time.perf_counter() - t0
        stop.set()
        samples = rx.recv()
        pollers.join()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    results = {"config": vars(a), "streams": dict(stream_out, wall_s=round(wall, 2)), "polls": {}}
    print(f"\n{a.streams} streams through the router (push, sim qwen3-32b/h200, {a.backend}, "
          f"max_tokens {a.max_tokens}): {stream_out}, {wall:.1f} s")
    print(f"latency while >= {a.streams // 2} streams were open (ms); every poll a new "
          f"connection, {a.poll_ms:.0f} ms apart per poller")
    print(f"{'target':8s} {'path':9s} {'polls':>6s} {'p50':>8s} {'p99':>8s} {'max':>8s} "
          f"{'max at':>6s} {'>50ms':>6s} {'non-200':>8s} {'max open':>9s}")
    for (target, path), rows in sorted(samples.items()):
        loaded = [r for r in rows if r[2] >= a.streams // 2]
        ms = [r[0] for r in loaded]
        bad = sum(1 for r in loaded if r[1] != 200)
        worst = max(loaded, default=(float("nan"), 0, 0, float("nan")))
        x = {"polls": len(loaded), "p50_ms": hb.pct(ms, 0.5), "p99_ms": hb.pct(ms, 0.99),
             "max_ms": worst[0], "max_at_s": worst[3], "over_50ms": sum(1 for v in ms if v > 50),
             "non_200": bad, "max_open": max((r[2] for r in rows), default=0)}
        results["polls"][f"{target} {path}"] = x
        print(f"{target:8s} {path:9s} {x['polls']:6d} {x['p50_ms']:8.2f} {x['p99_ms']:8.2f} "
              f"{x['max_ms']:8.2f} {x['max_at_s']:6.1f} {x['over_50ms']:6d} {bad:8d} "
              f"{x['max_open']:9d}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
