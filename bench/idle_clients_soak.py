#!/usr/bin/env python3
"""Front doors under idle and slowloris clients (issue 26 item 2; docs/benchmarks/front_door.md).

Usage:
  bench/idle_clients_soak.py [--kvpush build/apps/kvpush] [--idle 10000] [--slow 300]
                             [--streams 8] [--phase-s 20] [--keep-alive-s 600] [--out FILE.json]

Starts, with the sim executor (no model file; docs/sim.md): P and D (push connector) with a push
router over them, and a colocated instance. For each target — the router, D, the colocated
instance — runs two phases of --phase-s seconds each: a load of --streams concurrent streamed
completions (each thread sends one after another; through the router for the router and D, to the
instance itself for the colocated one) while a separate process polls GET /health on the target
every 50 ms on a fresh connection; first alone (baseline), then with --idle TCP connections that
send nothing and --slow slowloris connections (a header line every 2 s, never the head's end,
reopened when the server closes them) held open on the target by a third process. Reports per
target and phase: /health p50/p99/max (ms) and non-200s, TTFT p50/p99 (ms), completions and
errors, the load average; and the memory per held connection: the target's resident memory
(VmRSS before and after opening them) and the kernel's slab growth (/proc/meminfo, halved: both
ends of a loopback connection are on this machine; other processes' allocations add noise). A 3 s
warm-up load runs first, not counted. The servers run with --timeout-keep-alive --keep-alive-s so that the idle
connections stay open through the phase (0: the server's default, for a binary without the flag).

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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "pylib"))
import pd_bench_util as bu  # noqa: E402  (HOST, free_port, wait_healthy, pct)
import slow_clients as sc  # noqa: E402
from pd_router_overhead import prompt, read_stream  # noqa: E402

HOST = bu.HOST
ROOT = os.path.join(HERE, "..")
SIM = ["--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200", "--sim-kv-scale",
       "0.01", "--max-model-len", "4096", "--log-level", "warn"]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def slab_kib():
    """The kernel's slab memory (KiB, /proc/meminfo): socket, file and epoll structures."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Slab:"):
                return int(line.split()[1])
    return 0


def poller(port, stop, out):
    """GET /health on `port` every 50 ms on a fresh connection until `stop`; sends the rows."""
    rows = []
    while not stop.is_set():
        rows.append(sc.timed_get(HOST, port, "/health", 30.0))
        stop.wait(0.05)
    out.send(rows)


def attacker(port, idle, slow, conn):
    """Holds `idle` idle and `slow` slowloris connections on `port` until told to stop; sends
    back what happened to them."""
    clients = sc.IdleClients(HOST, port, idle)
    loris = sc.Slowloris(HOST, port, slow, interval_s=2.0)
    conn.send({"idle_open": len(clients.socks), "idle_failed": clients.failed})
    conn.recv()
    stats = {"idle_closed_by_server": clients.closed_by_server(), "slow_reopened": loris.reopened,
             "slow_answers": loris.answers}
    loris.close()
    clients.close()
    conn.send(stats)


def load(port, streams, seconds, max_tokens, seed):
    """`streams` threads sending streamed completions one after another for `seconds`; returns
    (TTFTs in ms, completions ok, errors)."""
    ttfts, counts, lock = [], {"ok": 0, "errors": 0}, threading.Lock()
    end = time.perf_counter() + seconds

    def run(i):
        rng = random.Random(seed + i)
        while time.perf_counter() < end:
            body = {"prompt": prompt(rng, 64), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            ok, ttft = False, None
            try:
                c = http.client.HTTPConnection(HOST, port, timeout=60)
                t0 = time.perf_counter()
                c.request("POST", "/v1/completions", json.dumps(body).encode(),
                          {"content-type": "application/json"})
                r = c.getresponse()
                if r.status == 200:
                    t_first, done, err = read_stream(r)
                    ok = done and not err and t_first is not None
                    ttft = (t_first - t0) * 1e3 if t_first else None
                c.close()
            except OSError:
                pass
            with lock:
                counts["ok" if ok else "errors"] += 1
                if ok:
                    ttfts.append(ttft)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfts, counts["ok"], counts["errors"]


def phase(ctx, target_port, load_port, a):
    stop = ctx.Event()
    rx, tx = ctx.Pipe(duplex=False)
    p = ctx.Process(target=poller, args=(target_port, stop, tx))
    p.start()
    ttfts, ok, errors = load(load_port, a.streams, a.phase_s, a.max_tokens, a.seed)
    stop.set()
    rows = rx.recv()
    p.join()
    ms = [r[1] for r in rows]
    return {"health_polls": len(rows), "health_p50_ms": bu.pct(ms, 0.5),
            "health_p99_ms": bu.pct(ms, 0.99), "health_max_ms": max(ms, default=float("nan")),
            "health_non_200": sum(1 for r in rows if r[0] != 200),
            "ttft_p50_ms": bu.pct(ttfts, 0.5), "ttft_p99_ms": bu.pct(ttfts, 0.99),
            "completions": ok, "errors": errors, "loadavg_1m": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpush", default=os.path.join(ROOT, "build", "apps", "kvpush"))
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--slow", type=int, default=300)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--phase-s", type=float, default=20.0)
    ap.add_argument("--keep-alive-s", type=int, default=600)
    ap.add_argument("--targets", default="router,decode,colocated")
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    nofile = sc.raise_nofile(a.idle + a.slow + 1024)
    if nofile < a.idle + a.slow + 256:
        raise SystemExit(f"open-file limit {nofile} is too low for {a.idle + a.slow} clients")

    keep = ["--timeout-keep-alive", str(a.keep_alive_s)] if a.keep_alive_s > 0 else []
    cfg = json.dumps({"kv_connector_extra_config": {"backend": a.backend}})
    ports = {k: bu.free_port() for k in ("prefill", "decode", "router", "colocated")}
    procs = {}

    def start(name, args):
        procs[name] = subprocess.Popen(
            [a.kvpush] + args + keep + ["--host", HOST, "--port", str(ports[name])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bu.wait_healthy(ports[name], procs[name])

    ctx = multiprocessing.get_context("fork")
    results = {"config": vars(a), "targets": {}}
    try:
        start("prefill", ["serve"] + SIM + ["--role", "prefill", "--kv-transfer-config", cfg])
        start("decode", ["serve"] + SIM + ["--role", "decode", "--kv-transfer-config", cfg])
        start("colocated", ["serve"] + SIM)
        start("router", ["router", "--prefill", f"http://{HOST}:{ports['prefill']}", "--decode",
                         f"http://{HOST}:{ports['decode']}", "--log-level", "warn"])
        for port in {ports["router"], ports["colocated"]}:
            load(port, a.streams, 3.0, a.max_tokens, a.seed)  # warm-up, not counted
        for target in a.targets.split(","):
            load_port = ports["colocated" if target == "colocated" else "router"]
            base = phase(ctx, ports[target], load_port, a)
            rss0, slab0 = rss_kib(procs[target].pid), slab_kib()
            here, there = ctx.Pipe()
            att = ctx.Process(target=attacker, args=(ports[target], a.idle, a.slow, there))
            att.start()
            opened = here.recv()
            time.sleep(2.0)
            rss1, slab1 = rss_kib(procs[target].pid), slab_kib()
            loaded = phase(ctx, ports[target], load_port, a)
            here.send("stop")
            loaded.update(here.recv())
            att.join()
            held = opened["idle_open"] + a.slow
            results["targets"][target] = {
                "baseline": base, "attacked": dict(loaded, **opened),
                "rss_before_kib": rss0, "rss_after_kib": rss1,
                "rss_bytes_per_connection": (rss1 - rss0) * 1024 / max(1, held),
                # Both ends of each loopback connection are on this machine: half the growth.
                "kernel_slab_bytes_per_connection_end": (slab1 - slab0) * 1024 / max(1, 2 * held)}
            print(f"{target}: done", flush=True)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(f"\n{a.streams} streams (max_tokens {a.max_tokens}, sim qwen3-32b/h200) for "
          f"{a.phase_s:.0f} s per phase; attacked: {a.idle} idle + {a.slow} slowloris "
          f"connections on the target; /health every 50 ms on a fresh connection")
    print(f"{'target':10s} {'phase':9s} {'health p50':>10s} {'p99':>7s} {'max':>7s} "
          f"{'non-200':>7s} {'TTFT p50':>8s} {'p99':>7s} {'done':>5s} {'errors':>6s} "
          f"{'load1':>5s}")
    for target, r in results["targets"].items():
        for name in ("baseline", "attacked"):
            x = r[name]
            print(f"{target:10s} {name:9s} {x['health_p50_ms']:10.2f} {x['health_p99_ms']:7.2f} "
                  f"{x['health_max_ms']:7.1f} {x['health_non_200']:7d} {x['ttft_p50_ms']:8.1f} "
                  f"{x['ttft_p99_ms']:7.1f} {x['completions']:5d} {x['errors']:6d} "
                  f"{x['loadavg_1m']:5.2f}")
        x = r["attacked"]
        ratio = x["ttft_p99_ms"] / r["baseline"]["ttft_p99_ms"]
        print(f"{'':10s} TTFT p99 ratio {ratio:.2f}; idle held {x['idle_open']} "
              f"(failed {x['idle_failed']}, closed by server {x['idle_closed_by_server']}); "
              f"slowloris reopened {x['slow_reopened']} {x['slow_answers']}; "
              f"RSS {r['rss_before_kib']} -> {r['rss_after_kib']} KiB = "
              f"{r['rss_bytes_per_connection']:.0f} B/connection; kernel slab "
              f"~{r['kernel_slab_bytes_per_connection_end']:.0f} B per socket end")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
