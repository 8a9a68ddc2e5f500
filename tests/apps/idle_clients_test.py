#!/usr/bin/env python3
"""Idle and slowloris clients do not stall a front door (issue 26 item 2; docs/reliability.md,
"Idle and slow clients").

Starts a colocated instance (the sim executor: no model file) and a router over it. Against
each of them in turn: opens --idle TCP connections that send nothing and --slow slowloris
connections (a header line every second, never the end of the head), then a GET /health and a
completion on fresh connections must both answer 200 within --limit-s seconds. Before the
connection loop (cpp-httplib parked a thread per connection) they took tens of seconds.

    tests/apps/idle_clients_test.py --kvpush build/apps/kvpush
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import kvpush_harness as h  # noqa: E402
import slow_clients as sc  # noqa: E402

h.LOG_PREFIX = "idle_clients"
HOST = "127.0.0.1"
FAILURES = h.FAILURES
check = h.check
SIM = ["--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200", "--sim-kv-scale",
       "0.01", "--max-model-len", "4096", "--log-level", "warn"]


def wait_healthy(port, proc, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit("process on port %d exited with %s" % (port, proc.returncode))
        if sc.timed_get(HOST, port, "/health", 1.0)[0] == 200:
            return
        time.sleep(0.1)
    raise SystemExit("port %d did not become healthy" % port)


def completion(port, limit_s):
    """A short completion on a fresh connection: (status or 0, milliseconds)."""
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection(HOST, port, timeout=limit_s)
        c.request("POST", "/v1/completions",
                  json.dumps({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}),
                  {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        status = r.status
        c.close()
    except OSError:
        status = 0
    return status, (time.perf_counter() - t0) * 1e3


def attack(name, port, a):
    idle = sc.IdleClients(HOST, port, a.idle)
    slow = sc.Slowloris(HOST, port, a.slow, interval_s=1.0)
    try:
        time.sleep(0.5)
        health, health_ms = sc.timed_get(HOST, port, "/health", a.limit_s)
        comp, comp_ms = completion(port, a.limit_s)
        check(health == 200 and health_ms < a.limit_s * 1e3,
              "%s: GET /health past %d idle + %d slowloris connections: %d in %.0f ms"
              % (name, len(idle.socks), a.slow, health, health_ms))
        check(comp == 200 and comp_ms < a.limit_s * 1e3,
              "%s: a completion past them: %d in %.0f ms" % (name, comp, comp_ms))
    finally:
        slow.close()
        idle.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--slow", type=int, default=100)
    ap.add_argument("--limit-s", type=float, default=2.0)
    a = ap.parse_args()
    sc.raise_nofile(2 * (a.idle + a.slow) + 256)
    ports = {"instance": h.free_port(), "router": h.free_port()}
    procs = []
    try:
        procs.append(subprocess.Popen(
            [a.kvpush, "serve"] + SIM + ["--host", HOST, "--port", str(ports["instance"])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_healthy(ports["instance"], procs[0])
        procs.append(subprocess.Popen(
            [a.kvpush, "router", "--colocated", "http://%s:%d" % (HOST, ports["instance"]),
             "--host", HOST, "--port", str(ports["router"]), "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_healthy(ports["router"], procs[1])
        for name in ("instance", "router"):
            attack(name, ports[name], a)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    if FAILURES:
        h.log("%d check(s) failed" % len(FAILURES))
        return 1
    h.log("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
