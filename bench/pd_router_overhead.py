#!/usr/bin/env python3
"""What the router hop costs (docs/benchmarks/pd.md, "The router hop").

Usage:
  bench/pd_router_overhead.py [--requests 300] [--prompt-len 128] [--max-tokens 2]
                              [--backend ucx:tcp] [--streams 256] [--out FILE.json]

Starts, all with the sim executor (`--executor sim --sim-model qwen3-32b --sim-hw h200
--sim-kv-scale 0.01`, no model file; docs/sim.md): P (pinned to CPU 0) and D (CPU 1) with the
push connector, a push router over them, one colocated instance (CPU 0) and a `--colocated`
router over it. Then:

1. P/D push, N pairs of requests with fresh random prompts, each pair in alternating order:
   (a) through the router; (b) the two legs sent directly by this script, exactly as the router
   would build them (same kv_transfer_params, P's leg written first, then D's). The router
   overhead of a pair = client TTFT (a) - client TTFT (b).
   push-cc: the same, but (b) reads P's answer on a thread of its own while it reads D's
   stream, as the router must: the part of the push overhead that comes from reading two
   answers at once on this 2-core machine rather than from the router's code.
2. Colocated, N pairs: through the `--colocated` router vs straight to the instance.
3. --streams concurrent streamed push requests through the router at once: counts 5xx answers,
   stream errors and streams that did not end with [DONE].

Every client connection is keep-alive (one per target, reused), so (a) and (b) pay the same
client-side costs and the difference is the router's: its HTTP server, JSON parse and rewrite,
leg connections, worker hand-offs and SSE relay. Prints one table and writes JSON (--out).
"""
import argparse
import types
import http.client
import json
import os
import random
import select
import socket
import string
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_handoff as hb  # noqa: E402  (free_port, wait_healthy, pct)
import pd_bench_util as pbu  # noqa: E402  (read1_pieces, sse_events)

HOST = hb.HOST
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def scan_stream(events, stop_at_error):
    """Scans SSE completion events ((arrival time, event) pairs, pd_bench_util.sse_events);
    returns (time of the first event with text, saw [DONE], the last error or None). With
    `stop_at_error` it returns at the first error event."""
    t_first, done, err = None, False, None
    for t, ev in events:
        for line in ev.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            j = json.loads(data)
            if "error" in j:
                err = j["error"]
                if stop_at_error:
                    return t_first, done, err
            elif t_first is None and any(c.get("text") for c in j.get("choices", [])):
                t_first = t
    return t_first, done, err


def read_stream(resp):
    """Reads an SSE completion stream; returns (t_first_token, saw_done, error or None)."""
    return scan_stream(pbu.sse_events(pbu.read1_pieces(resp)), stop_at_error=True)


class Client:
    """One keep-alive HTTP/1.1 connection per thread to host:port, on a raw socket: the time of a
    token is when its bytes were received (no http.client header parsing in the measured path,
    which would cost the router path more, since its 200 arrives together with the first token).
    """

    def __init__(self, port):
        self.port, self.local = port, threading.local()

    def sock(self):
        s = getattr(self.local, "s", None)
        if s is not None and select.select([s], [], [], 0)[0]:
            # The server closed it while idle (EOF readable): nothing was sent on it yet.
            s.close()
            s = None
        if s is None:
            s = socket.create_connection((HOST, self.port), timeout=600)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.local.s, self.local.buf = s, b""
        return s

    def send(self, body, headers):
        """Writes a POST /v1/completions in one send."""
        data = json.dumps(body).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        req = (f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n{head}"
               f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
        self.sock().sendall(req.encode() + data)

    def _recv(self):
        chunk = self.local.s.recv(65536)
        if not chunk:
            raise RuntimeError(f"port {self.port}: connection closed")
        self.local.buf += chunk
        return time.perf_counter()

    def _head(self):
        while b"\r\n\r\n" not in self.local.buf:
            self._recv()
        head, self.local.buf = self.local.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        hdr = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
        return int(lines[0].split()[1]), hdr

    def _body_pieces(self, hdr):
        """Yields (recv time, decoded bytes) until the body ends."""
        if "content-length" in hdr:
            n = int(hdr["content-length"])
            while len(self.local.buf) < n:
                self._recv()
            piece, self.local.buf = self.local.buf[:n], self.local.buf[n:]
            yield time.perf_counter(), piece
            return
        t = time.perf_counter()
        while True:  # chunked
            while b"\r\n" not in self.local.buf:
                t = self._recv()
            size_line, rest = self.local.buf.split(b"\r\n", 1)
            n = int(size_line.split(b";")[0], 16)
            while len(rest) < n + 2:
                t = self._recv()
                rest = self.local.buf.split(b"\r\n", 1)[1]
            self.local.buf = rest[n + 2:]
            if n == 0:
                return
            yield t, rest[:n]

    def stream_answer(self):
        """Reads an SSE answer: (status, time of the first token, saw [DONE], error)."""
        status, hdr = self._head()
        body = b"".join(p for _, p in self._body_pieces(hdr)) if status != 200 else None
        if status != 200:
            return status, None, False, body[:300]
        t_first, done, err = scan_stream(pbu.sse_events(self._body_pieces(hdr)),
                                         stop_at_error=False)
        return 200, t_first, done, err

    def json_answer(self):
        status, hdr = self._head()
        return status, b"".join(p for _, p in self._body_pieces(hdr))


def prompt(rng, n):
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(n))


def ttft_router(router, body, rid):
    t0 = time.perf_counter()
    router.send(dict(body, stream=True), {"x-request-id": rid})
    status, t, done, err = router.stream_answer()
    if status != 200 or t is None or err or not done:
        raise RuntimeError(f"router: HTTP {status} {err}")
    return (t - t0) * 1e3


def ttft_direct_push(p, d, p_port, body, rid, tid):
    """The router's two push legs (pd_legs.cc), sent by this client: P's first, then D's."""
    pb = dict(body, max_tokens=1, stream=False,
              kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                  "transfer_mode": "push", "transfer_id": tid})
    db = dict(body, stream=True,
              kv_transfer_params={"do_remote_prefill": True, "do_remote_decode": False,
                                  "transfer_mode": "push", "transfer_id": tid,
                                  "remote_host": HOST, "remote_port": p_port})
    t0 = time.perf_counter()
    p.send(pb, {"x-request-id": rid})
    d.send(db, {"x-request-id": rid})
    status, t, done, err = d.stream_answer()
    p_status, p_body = p.json_answer()
    if status != 200 or t is None or err or not done or p_status != 200:
        raise RuntimeError(f"direct: D HTTP {status} {err}, P HTTP {p_status} {p_body[:200]}")
    return (t - t0) * 1e3


def ttft_direct_push_concurrent(p, d, p_port, body, rid, tid):
    """As ttft_direct_push, but P's answer is read on a thread of its own while D's stream is
    read, as the router does (P answers when its first token is sampled, i.e. at about the time
    D's first token arrives): the difference to ttft_direct_push is the cost of reading the two
    answers at once on this machine, not of the router's code."""
    import threading
    pb = dict(body, max_tokens=1, stream=False,
              kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                  "transfer_mode": "push", "transfer_id": tid})
    db = dict(body, stream=True,
              kv_transfer_params={"do_remote_prefill": True, "do_remote_decode": False,
                                  "transfer_mode": "push", "transfer_id": tid,
                                  "remote_host": HOST, "remote_port": p_port})
    p_result, go = [], threading.Event()

    def read_p():
        go.wait()
        try:
            p_result.append(p.json_answer())
        except Exception as e:  # noqa: BLE001 (reported below)
            p_result.append((0, str(e).encode()))

    reader = threading.Thread(target=read_p)  # started before the clock: no creation cost in it
    reader.start()
    t0 = time.perf_counter()
    p.send(pb, {"x-request-id": rid})
    go.set()
    d.send(db, {"x-request-id": rid})
    status, t, done, err = d.stream_answer()
    reader.join()
    p_status, p_body = p_result[0]
    if status != 200 or t is None or err or not done or p_status != 200:
        raise RuntimeError(f"direct: D HTTP {status} {err}, P HTTP {p_status} {p_body[:200]}")
    return (t - t0) * 1e3


def ttft_direct_colocated(c, body, rid):
    t0 = time.perf_counter()
    c.send(dict(body, stream=True), {"x-request-id": rid})
    status, t, done, err = c.stream_answer()
    if status != 200 or t is None or err or not done:
        raise RuntimeError(f"colocated: HTTP {status} {err}")
    return (t - t0) * 1e3


def pairs(n, rng, a, run_via, run_direct):
    """n pairs in alternating order; returns (via ms list, direct ms list, via - direct list)."""
    via, direct, diff = [], [], []
    for i in range(n):
        body = {"prompt": prompt(rng, a.prompt_len), "max_tokens": a.max_tokens,
                "temperature": 0, "ignore_eos": True}
        if i % 2 == 0:
            x = run_via(body, i)
            y = run_direct(body, i)
        else:
            y = run_direct(body, i)
            x = run_via(body, i)
        via.append(x)
        direct.append(y)
        diff.append(x - y)
    return via, direct, diff


def concurrent_streams(router_port, n, a, rng):
    """n streamed push requests at once through the router; counts what went wrong."""
    bodies = [{"prompt": prompt(rng, a.prompt_len), "max_tokens": 8, "temperature": 0,
               "ignore_eos": True, "stream": True} for _ in range(n)]
    out = {"n": n, "ok": 0, "http_5xx": 0, "http_other": 0, "stream_error": 0, "no_done": 0,
           "transport_error": 0}
    lock = threading.Lock()
    gate = threading.Barrier(n)

    def one(body):
        key = "ok"
        try:
            c = http.client.HTTPConnection(HOST, router_port, timeout=300)
            gate.wait()
            c.request("POST", "/v1/completions", json.dumps(body).encode(),
                      {"content-type": "application/json"})
            r = c.getresponse()
            if r.status >= 500:
                key = "http_5xx"
            elif r.status != 200:
                key = "http_other"
            else:
                _, done, err = read_stream(r)
                key = "stream_error" if err else ("ok" if done else "no_done")
        except Exception:  # noqa: BLE001 - counted, not raised
            key = "transport_error"
        with lock:
            out[key] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


def summary(v):
    return {"p50": hb.pct(v, 0.5), "p99": hb.pct(v, 0.99), "mean": sum(v) / len(v)}


def metric(port, name):
    c = http.client.HTTPConnection(HOST, port, timeout=5)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            yield line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpush", default=os.path.join(ROOT, "build", "apps", "kvpush"))
    ap.add_argument("--requests", type=int, default=300, help="pairs per comparison")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt bytes (= sim tokens)")
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--backend", default="ucx:tcp", help="KV transfer backend of P and D")
    ap.add_argument("--streams", type=int, default=256, help="concurrent streams (0: skip)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    sim = ["--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200",
           "--sim-kv-scale", "0.01", "--no-enable-prefix-caching", "--max-num-seqs", "128",
           "--max-model-len", "4096", "--log-level", "warn"]
    cfg = json.dumps({"kv_connector_extra_config": {"backend": a.backend}})
    ports = {k: hb.free_port() for k in ("p", "d", "colo", "router", "corouter")}
    procs = []

    def start(cpu, args, port):
        cmd = ([] if cpu is None else ["taskset", "-c", str(cpu)]) + [a.kvpush] + args
        procs.append(subprocess.Popen(cmd + ["--host", HOST, "--port", str(port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return procs[-1]

    try:
        p = start(0, ["serve"] + sim + ["--role", "prefill", "--kv-transfer-config", cfg], ports["p"])
        d = start(1, ["serve"] + sim + ["--role", "decode", "--kv-transfer-config", cfg], ports["d"])
        c = start(0, ["serve"] + sim + ["--role", "both"], ports["colo"])
        for port, proc in ((ports["p"], p), (ports["d"], d), (ports["colo"], c)):
            hb.wait_healthy(port, proc)
        r = start(None, ["router", "--prefill", f"http://{HOST}:{ports['p']}", "--decode",
                         f"http://{HOST}:{ports['d']}", "--log-level", "warn"], ports["router"])
        cr = start(None, ["router", "--colocated", f"http://{HOST}:{ports['colo']}",
                          "--log-level", "warn"], ports["corouter"])
        hb.wait_healthy(ports["router"], r)
        hb.wait_healthy(ports["corouter"], cr)

        rng = random.Random(a.seed)
        router, corouter = Client(ports["router"]), Client(ports["corouter"])
        pc, dc, cc = Client(ports["p"]), Client(ports["d"]), Client(ports["colo"])
        tid = lambda: "%032x" % rng.getrandbits(128)  # noqa: E731
        via_push = lambda body, i: ttft_router(router, body, f"bench-r{i}")  # noqa: E731
        dir_push = lambda body, i: ttft_direct_push(pc, dc, ports["p"], body, f"bench-d{i}", tid())  # noqa: E731
        pcc = Client(ports["p"])
        pcc.local = types.SimpleNamespace()  # one connection shared by the sender and its reader
        dir_push_cc = lambda body, i: ttft_direct_push_concurrent(  # noqa: E731
            pcc, dc, ports["p"], body, f"bench-dc{i}", tid())
        via_colo = lambda body, i: ttft_router(corouter, body, f"bench-cr{i}")  # noqa: E731
        dir_colo = lambda body, i: ttft_direct_colocated(cc, body, f"bench-c{i}")  # noqa: E731
        pairs(10, rng, a, via_push, dir_push)  # warm-up: connections, engine, first transfers
        pairs(10, rng, a, via_colo, dir_colo)
        results = {"config": vars(a)}
        rows = (("push", via_push, dir_push), ("push-cc", via_push, dir_push_cc),
                ("colocated", via_colo, dir_colo))
        for name, fv, fd in rows:
            via, direct, diff = pairs(a.requests, rng, a, fv, fd)
            results[name] = {"via_router_ms": summary(via), "direct_ms": summary(direct),
                             "overhead_ms": summary(diff),
                             "overhead_of_medians_ms": hb.pct(via, 0.5) - hb.pct(direct, 0.5)}
        if a.streams > 0:
            results["concurrent"] = concurrent_streams(ports["router"], a.streams, a, rng)
            results["router_metrics"] = list(metric(ports["router"], "kvpush_router_connections_total")) + \
                list(metric(ports["router"], "kvpush_router_worker_threads")) + \
                list(metric(ports["router"], "kvpush_router_requests_total"))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(f"\nrouter hop, {a.requests} pairs per row, {a.prompt_len}-token prompts, "
          f"max_tokens {a.max_tokens}, sim qwen3-32b/h200, {a.backend}")
    print(f"{'path':10s} {'TTFT via router p50':>20s} {'direct p50':>11s} "
          f"{'overhead p50':>13s} {'overhead p99':>13s} {'mean':>7s}   (ms)")
    for name in ("push", "push-cc", "colocated"):
        x = results[name]
        print(f"{name:10s} {x['via_router_ms']['p50']:20.3f} {x['direct_ms']['p50']:11.3f} "
              f"{x['overhead_ms']['p50']:13.3f} {x['overhead_ms']['p99']:13.3f} "
              f"{x['overhead_ms']['mean']:7.3f}")
    if "concurrent" in results:
        k = results["concurrent"]
        print(f"\n{k['n']} concurrent push streams through one router: ok {k['ok']}, "
              f"5xx {k['http_5xx']}, other non-200 {k['http_other']}, stream errors "
              f"{k['stream_error']}, no [DONE] {k['no_done']}, transport errors "
              f"{k['transport_error']} ({k['wall_s']} s)")
        for line in results["router_metrics"]:
            print("  " + line)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
