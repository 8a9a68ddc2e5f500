#!/usr/bin/env python3
"""Idle CPU of a P/D pair: CPU time P and D (and the router) use with no traffic.

For each --backends: starts a prefill and a decode instance and a router on loopback, sends one
push and one pull request (so that the peers are handshaken and connected, as in service), waits
--settle seconds, then reads each process's utime+stime (/proc/PID/stat) over --seconds of no
traffic and prints it as a percentage of one core, with the context switches per second.

Only the Python standard library is used.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

from pd_bench_util import (HOST, add_kvpush_and_model_args, cpu_seconds, ctx_switches,
                           free_port, stop_all, wait_healthy)


def cpu_and_switches(pid):
    return cpu_seconds(pid), ctx_switches(pid)

def measure(args, backend, tmp):
    kv = json.dumps({"kv_connector_extra_config": {"backend": backend}})
    procs, ports = {}, {}
    try:
        for name, role in [("prefill", "prefill"), ("decode", "decode")]:
            ports[name] = free_port()
            log = open(os.path.join(tmp, f"{backend.replace(':', '_')}-{name}.log"), "w")
            procs[name] = subprocess.Popen(
                [args.kvpush, "serve", "--model", args.model, "--role", role,
                 "--kv-transfer-config", kv, "--host", HOST, "--port", str(ports[name]),
                 "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
        for name in ("prefill", "decode"):
            wait_healthy(ports[name], procs[name])
        ports["router"] = free_port()
        procs["router"] = subprocess.Popen(
            [args.kvpush, "router", "--prefill", f"http://{HOST}:{ports['prefill']}", "--decode",
             f"http://{HOST}:{ports['decode']}", "--host", HOST, "--port", str(ports["router"]),
             "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_healthy(ports["router"], procs["router"])
        for mode in ("push", "pull-fast"):
            c = http.client.HTTPConnection(HOST, ports["router"], timeout=60)
            c.request("POST", "/v1/completions",
                      json.dumps({"prompt": list(range(1, 40)), "max_tokens": 2}),
                      {"content-type": "application/json", "x-kvpush-mode": mode})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"{backend} {mode}: HTTP {r.status}")
        time.sleep(args.settle)
        before = {n: cpu_and_switches(p.pid) for n, p in procs.items()}
        time.sleep(args.seconds)
        after = {n: cpu_and_switches(p.pid) for n, p in procs.items()}
        out = {}
        for n in procs:
            out[n] = {"cpu_pct": 100.0 * (after[n][0] - before[n][0]) / args.seconds,
                      "switches_per_s": (after[n][1] - before[n][1]) / args.seconds}
        return out
    finally:
        stop_all(procs.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_kvpush_and_model_args(ap)
    ap.add_argument("--backends", default="ucx:tcp,ucx:shm,libfabric:tcp")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=2.0)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"idle_cpu: model {args.model} not found", file=sys.stderr)
        return 77
    tmp = tempfile.mkdtemp(prefix="kvpush-idle-")
    print(f"load average {os.getloadavg()}; {args.seconds:.0f} s without traffic after one push "
          f"and one pull request")
    print(f"{'backend':<15} {'process':<8} {'CPU % of a core':>16} {'switches/s':>11}")
    for backend in args.backends.split(","):
        res = measure(args, backend, tmp)
        for n, v in res.items():
            print(f"{backend:<15} {n:<8} {v['cpu_pct']:>16.2f} {v['switches_per_s']:>11.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
