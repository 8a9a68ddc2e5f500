#!/usr/bin/env python3
"""How fast a failed P leg reaches the client in push mode, and when D's reservation comes back
(docs/benchmarks/pd.md, "A failed P leg"; issue 14).

Usage:
  bench/pd_prefill_failure.py [--rounds 10] [--prompt-len 4000] [--backend ucx:tcp]
                              [--out FILE.json]

Starts, with the sim executor (`--executor sim --sim-model qwen3-32b --sim-hw h200
--sim-kv-scale 0.01`; a 4000-token prefill is modelled at ~0.4 s, so P dies mid-prefill): P and
D with the push connector and a push router. Each round: one streamed request through the
router; as soon as D has reserved its KV blocks (D's kvpush_num_requests_waiting_for_kv >= 1,
polled every 2 ms) P is killed with SIGKILL; the script records the time from the kill to the
client's answer (status line or error event) and to D's KV blocks all being back
(kvpush_kv_blocks_used = 0 and no request waiting for KV, polled every 5 ms); then P is
restarted on the same port and the router waits until it is healthy again. Reports p50 / max
over the rounds and what the client got.

Only the Python standard library is used.
"""
import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_handoff as hb  # noqa: E402  (free_port, wait_healthy, pct, metrics)
from pd_router_overhead import prompt, read_stream  # noqa: E402

HOST = hb.HOST
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def metric(port, name):
    try:
        return hb.metrics(port).get(name, -2.0)
    except OSError:
        return -1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpush", default=os.path.join(ROOT, "build", "apps", "kvpush"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--prompt-len", type=int, default=4000)
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    sim = ["--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200",
           "--sim-kv-scale", "0.01", "--max-model-len", "8192", "--no-enable-prefix-caching",
           "--log-level", "warn"]
    cfg = json.dumps({"kv_connector_extra_config": {"backend": a.backend}})
    ports = {k: hb.free_port() for k in ("p", "d", "router")}
    procs = {}

    def start(name, args):
        procs[name] = subprocess.Popen(
            [a.kvpush] + args + ["--host", HOST, "--port", str(ports[name])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return procs[name]

    def router_ready(timeout=30.0):
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                c = http.client.HTTPConnection(HOST, ports["router"], timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("router not healthy")

    p_args = ["serve"] + sim + ["--role", "prefill", "--kv-transfer-config", cfg]
    rows = []
    try:
        start("p", p_args)
        start("d", ["serve"] + sim + ["--role", "decode", "--kv-transfer-config", cfg])
        hb.wait_healthy(ports["p"], procs["p"])
        hb.wait_healthy(ports["d"], procs["d"])
        start("router", ["router", "--prefill", f"http://{HOST}:{ports['p']}", "--decode",
                         f"http://{HOST}:{ports['d']}", "--health-interval-ms", "200",
                         "--log-level", "warn"])
        hb.wait_healthy(ports["router"], procs["router"])
        rng = random.Random(a.seed)
        for i in range(a.rounds):
            body = {"prompt": prompt(rng, a.prompt_len), "max_tokens": 16, "temperature": 0,
                    "stream": True}
            got = {}

            def client():
                try:
                    c = http.client.HTTPConnection(HOST, ports["router"], timeout=60)
                    c.request("POST", "/v1/completions", json.dumps(body).encode(),
                              {"content-type": "application/json"})
                    r = c.getresponse()
                    got["t_status"] = time.perf_counter()
                    got["status"] = r.status
                    if r.status == 200:
                        _, done, err = read_stream(r)
                        got["error"] = err
                        got["done"] = done
                    else:
                        got["error"] = json.loads(r.read() or b"{}").get("error")
                    got["t_end"] = time.perf_counter()
                except Exception as e:  # noqa: BLE001 - reported
                    got["status"], got["error"], got["t_end"] = 0, str(e), time.perf_counter()

            th = threading.Thread(target=client)
            th.start()
            t_wait = time.perf_counter()
            while metric(ports["d"], "kvpush_num_requests_waiting_for_kv") < 1:
                if time.perf_counter() - t_wait > 10:
                    raise RuntimeError("D never reserved the request's blocks")
                time.sleep(0.002)
            procs["p"].send_signal(signal.SIGKILL)
            t_kill = time.perf_counter()
            t_blocks = None
            while time.perf_counter() - t_kill < 30:
                if (metric(ports["d"], "kvpush_kv_blocks_used") == 0 and
                        metric(ports["d"], "kvpush_num_requests_waiting_for_kv") == 0):
                    t_blocks = time.perf_counter()
                    break
                time.sleep(0.005)
            th.join()
            procs["p"].wait()
            row = {"status": got.get("status"), "error": (got.get("error") or {}).get("code")
                   if isinstance(got.get("error"), dict) else got.get("error"),
                   "client_ms": (got["t_end"] - t_kill) * 1e3,
                   "d_blocks_back_ms": (t_blocks - t_kill) * 1e3 if t_blocks else None}
            rows.append(row)
            print(f"round {i}: {row}")
            start("p", p_args)
            hb.wait_healthy(ports["p"], procs["p"])
            router_ready()
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    cm = [r["client_ms"] for r in rows]
    bm = [r["d_blocks_back_ms"] for r in rows if r["d_blocks_back_ms"] is not None]
    res = {"config": vars(a), "rounds": rows,
           "client_ms": {"p50": hb.pct(cm, 0.5), "max": max(cm)},
           "d_blocks_back_ms": {"p50": hb.pct(bm, 0.5), "max": max(bm) if bm else None,
                                "rounds_back": len(bm)}}
    print(f"\npush, P killed (SIGKILL) mid-prefill ({a.prompt_len}-token prompt), {a.rounds} rounds:")
    print(f"  kill -> client's answer: p50 {res['client_ms']['p50']:.1f} ms, max "
          f"{res['client_ms']['max']:.1f} ms; answers: "
          f"{sorted(set((r['status'], str(r['error'])) for r in rows))}")
    print(f"  kill -> D's blocks all back: p50 {res['d_blocks_back_ms']['p50']:.1f} ms, max "
          f"{res['d_blocks_back_ms']['max']} ms ({len(bm)}/{len(rows)} rounds within 30 s)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
