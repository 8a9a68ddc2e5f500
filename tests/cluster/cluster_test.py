#!/usr/bin/python3
"""Multi-host cluster test (issue 14, docs/deployment.md): etcd, a router, 2 prefill (P) and 2
decode (D) instances, each in its own network namespace joined by veth pairs and a bridge, KV over
`ucx:tcp`; membership comes from etcd alone (`--discovery`), no instance URL is given to the router.

While traffic runs (push and pull, streamed and not, greedy and seeded; every answer checked
against a colocated instance computing the same prompt alone), the test goes through phases:

  baseline    2P + 2D serve; no request may fail.
  join        a third D (D2) starts: it must be in etcd, listed by the router and get requests
              within 2 s of registering.
  mismatch    a D with another KV layout (`--block-size`, so another compat hash) registers: the
              router must never pair it (it gets no request). Skipped when serve has no
              --block-size.
  kill        D1 is SIGKILLed: requests in flight to it go on on another D (the router's
              continuation, docs/reliability.md) or fail explicitly; once its lease
              expired (ttl + 2 s) its key is gone, the router no longer lists it, and no request
              started after that fails.
  drain       D0 gets SIGTERM while 6 long seeded streams are open: it leaves etcd, offers its
              streams (the router moves them, their KV pushed by D0: docs/reliability.md
              "Migration"), drains and exits 0; zero failed requests from the signal on, and
              every long stream identical to colocated.
  etcd        etcd is SIGKILLed and restarted on the same data dir: the cluster keeps serving with
              its last known membership (zero failed requests) and every live instance is in etcd
              again afterwards.

Checked at the end (exit status 1 otherwise): every 200 identical to colocated (zero wrong
tokens), the per-phase rules above, every process that was not killed on purpose exits 0 on
SIGTERM, no crash/sanitizer report in any log. Counts and the measured join/drop latencies are
printed.

Needs root, `ip` and etcd (Debian: etcd-server); exit 77 (ctest: skipped) with a message when any
is missing, or when the model is absent. Python 3 standard library only.
"""

import argparse
import base64
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import kvpush_harness as H  # noqa: E402
from kvpush_harness import (CRASH_PATTERNS, Instance, Netns, body_for, free_port, log,  # noqa: E402
                            make_pool, send, tail)

ETCD_PORT = 2379
SERVE_PORT = 8100
ROUTER_PORT = 8000
LEASE_TTL_S = 3
JOIN_BOUND_S = 2.0  # issue 14: a new D registers and gets requests within 2 s
NAMES = ["etcd", "router", "P0", "P1", "D0", "D1", "D2", "DX"]  # netns index = position


class EtcdClient:
    """Reads the discovery keys through etcd's v3 JSON gateway (the test's own view of etcd)."""

    def __init__(self, host, port, prefix):
        self.host, self.port, self.prefix = host, port, prefix

    def _post(self, path, doc, timeout=2.0):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        c.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            raise OSError("etcd %s: HTTP %d %r" % (path, r.status, body[:200]))
        return json.loads(body)

    def instances(self):
        """{advertised url: value document} of every key under the prefix; None if unreachable."""
        key = self.prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        try:
            j = self._post("/v3/kv/range", {"key": base64.b64encode(key).decode(),
                                            "range_end": base64.b64encode(end).decode()})
        except (OSError, ValueError, http.client.HTTPException):
            return None
        out = {}
        for kv in j.get("kvs", []):
            try:
                doc = json.loads(base64.b64decode(kv.get("value", "")))
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("url"), str):
                out[doc["url"]] = doc
        return out


def get_json(host, port, path, timeout=2.0):
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, json.loads(body)
    except (OSError, ValueError, http.client.HTTPException):
        return 0, None


class Skip(Exception):
    """The host cannot run the test (exit 77)."""


class Cluster:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.lock = threading.Lock()
        self.results = []  # (t_start, t_end, kind, mode, ok_tokens_match)
        self.violations = []
        self.figures = {}
        self.stop_traffic = threading.Event()
        self.instances = []
        self.netns = None
        self.dir = tempfile.mkdtemp(prefix="kvpush-cluster-", dir=a.work)

    def violation(self, msg):
        with self.lock:
            self.violations.append(msg)
        log("VIOLATION: " + msg)

    # -- set-up ----------------------------------------------------------------------------------

    def kv_cfg(self):
        return json.dumps({"kv_connector_extra_config": {"backend": "ucx:tcp"}})

    def serve(self, name, role, extra=()):
        i = NAMES.index(name)
        host = self.netns.ip(i)
        args = ["serve", "--model", self.a.model, "--role", role, "--host", host, "--port",
                str(SERVE_PORT), "--num-kv-blocks", str(self.a.kv_blocks),
                "--kv-transfer-config", self.kv_cfg(), "--discovery", self.etcd_url,
                "--advertise-url", "http://%s:%d" % (host, SERVE_PORT),
                "--discovery-lease-ttl-s", str(LEASE_TTL_S), "--log-level", self.a.log_level]
        args += list(extra)
        inst = Instance(name, args, host, SERVE_PORT, self.dir, self.a.kvpush,
                        netns=self.netns.ns(i), env={"UCX_NET_DEVICES": self.netns.dev(i)})
        self.instances.append(inst)
        return inst

    def start_etcd(self):
        i = NAMES.index("etcd")
        ip = self.netns.ip(i)
        data = os.path.join(self.dir, "etcd-data")
        args = ["--name", "kvk", "--data-dir", data,
                "--listen-client-urls", "http://%s:%d" % (ip, ETCD_PORT),
                "--advertise-client-urls", "http://%s:%d" % (ip, ETCD_PORT),
                "--listen-peer-urls", "http://%s:%d" % (ip, ETCD_PORT + 1),
                "--initial-advertise-peer-urls", "http://%s:%d" % (ip, ETCD_PORT + 1),
                "--initial-cluster", "kvk=http://%s:%d" % (ip, ETCD_PORT + 1)]
        if self.etcd is None:
            self.etcd = Instance("etcd", args, ip, ETCD_PORT, self.dir, self.a.etcd,
                                 netns=self.netns.ns(i))
        self.etcd.start()
        t_end = time.time() + 30
        while time.time() < t_end and not self.etcd.healthy():
            if self.etcd.proc.poll() is not None:
                raise RuntimeError("etcd exited: %s" % tail(self.etcd.incarnations[-1]["log"]))
            time.sleep(0.1)
        if not self.etcd.healthy():
            raise RuntimeError("etcd not healthy in 30 s: %s" % tail(self.etcd.incarnations[-1]["log"]))

    def setup(self):
        a = self.a
        self.netns = Netns("%02d" % (os.getpid() % 100), prefix="kvk", net="10.81")
        err = self.netns.create(len(NAMES))
        if err:
            self.netns.destroy()
            self.netns = None
            raise Skip("cannot create network namespaces (%s)" % err)
        ip = self.netns.ip(NAMES.index("etcd"))
        self.etcd_url = "etcd://%s:%d" % (ip, ETCD_PORT)
        self.etcd_client = EtcdClient(ip, ETCD_PORT, a.prefix)
        self.etcd = None
        self.start_etcd()
        self.colo = Instance("colocated", ["serve", "--model", a.model, "--role", "both", "--host",
                                           "127.0.0.1", "--port", str(free_port()),
                                           "--num-kv-blocks", str(a.kv_blocks)],
                             "127.0.0.1", 0, self.dir, a.kvpush)
        self.colo.port = int(self.colo.args[self.colo.args.index("--port") + 1])
        self.P = [self.serve("P0", "prefill"), self.serve("P1", "prefill")]
        self.D = [self.serve("D0", "decode"), self.serve("D1", "decode")]
        ri = NAMES.index("router")
        self.router = Instance("router", ["router", "--discovery", self.etcd_url, "--host",
                                          self.netns.ip(ri), "--port", str(ROUTER_PORT),
                                          "--health-interval-ms", "500", "--request-timeout-s",
                                          "30", "--log-level", a.log_level],
                               self.netns.ip(ri), ROUTER_PORT, self.dir, a.kvpush,
                               netns=self.netns.ns(ri))
        self.instances += [self.colo, self.router]
        for inst in [self.colo] + self.P + self.D + [self.router]:
            inst.start()
        for inst in [self.colo] + self.P + self.D:
            if not inst.wait_healthy(90):
                raise RuntimeError("%s did not become healthy: %s" % (
                    inst.name, tail(inst.incarnations[-1]["log"])))
        if not self.wait_router_lists([i.url for i in self.P + self.D], 30):
            raise RuntimeError("router does not list 2 P + 2 D from etcd within 30 s: %s; log:\n%s"
                               % (self.router_view(), tail(self.router.incarnations[-1]["log"])))
        log("cluster up in namespaces (bridge %s): etcd %s, P %s, D %s, router %s; logs in %s" % (
            self.netns.bridge, self.etcd_url, " ".join(p.url for p in self.P),
            " ".join(d.url for d in self.D), self.router.url, self.dir))

    # -- views -------------------------------------------------------------------------------------

    def router_view(self):
        """{url: healthy} of the instances the router's /health lists."""
        _, j = get_json(self.router.host, self.router.port, "/health")
        out = {}
        for inst in (j or {}).get("instances", []) if isinstance(j, dict) else []:
            if isinstance(inst, dict) and isinstance(inst.get("url"), str):
                out[inst["url"]] = bool(inst.get("healthy", True))
        return out

    def wait_router_lists(self, urls, timeout, listed=True):
        t_end = time.time() + timeout
        while time.time() < t_end:
            v = self.router_view()
            if all((u in v and v[u]) == listed for u in urls):
                return True
            time.sleep(0.05)
        return False

    def requests_served(self, inst):
        m = inst.metrics(timeout=2.0) or {}
        return m.get("kvpush_requests_received_total", 0.0)

    # -- traffic ---------------------------------------------------------------------------------

    def references(self):
        self.pool = make_pool(self.rng, self.a.pool, 512)
        self.ref = []
        for e in self.pool:
            r = send(self.colo.host, self.colo.port, body_for(e, False))
            if r["kind"] != "ok":
                raise RuntimeError("colocated reference failed: %s %s" % (r["kind"], r["error"]))
            self.ref.append(r["ids"])

    def traffic(self, wid):
        rng = random.Random(self.a.seed * 7919 + wid)
        while not self.stop_traffic.is_set():
            k = rng.randrange(len(self.pool))
            mode = rng.choice(["push", "pull-vllm", "pull-fast"])
            stream = rng.random() < 0.5
            t0 = time.time()
            r = send(self.router.host, self.router.port, body_for(self.pool[k], stream),
                     {"x-kvpush-mode": mode}, timeout=40)
            t1 = time.time()
            ok = r["kind"] == "ok"
            if ok and r["ids"] != self.ref[k]:
                self.violation("HTTP 200 with wrong tokens (%s%s, entry %d): %s, colocated %s" % (
                    mode, " stream" if stream else "", k, r["ids"], self.ref[k]))
            if r["kind"] == "sse_error" and r["ids"] and r["ids"] != self.ref[k][:len(r["ids"])]:
                self.violation("streamed tokens before an error differ from colocated")
            if r["kind"] in ("truncated", "timeout", "transport"):
                self.violation("%s: %s (%s)" % (r["kind"], r["error"], mode))
            with self.lock:
                self.results.append((t0, t1, r["kind"], r["status"], r["error"]))

    def failures_between(self, t_from, t_to=None, by="end"):
        """Failed requests whose start (by="start") or end (by="end") lies in [t_from, t_to)."""
        out = []
        with self.lock:
            for t0, t1, kind, status, err in self.results:
                t = t0 if by == "start" else t1
                if t >= t_from and (t_to is None or t < t_to) and kind != "ok":
                    out.append("%s %s %s" % (kind, status, err[:120]))
        return out

    def served_between(self, t_from, t_to):
        with self.lock:
            return sum(1 for r in self.results if t_from <= r[1] < t_to and r[2] == "ok")

    # -- phases ----------------------------------------------------------------------------------

    def phase_baseline(self):
        t0 = time.time()
        time.sleep(self.a.phase_s)
        f = self.failures_between(t0, by="start")
        log("baseline: %d requests served in %.1f s, %d failed" % (
            self.served_between(t0, time.time()), time.time() - t0, len(f)))
        for x in f[:5]:
            self.violation("baseline: request failed: %s" % x)

    def phase_join(self):
        d2 = self.serve("D2", "decode")
        before = 0
        d2.start()
        t_reg = None
        t_end = time.time() + 90
        while time.time() < t_end and t_reg is None:
            inst = self.etcd_client.instances() or {}
            if d2.url in inst:
                t_reg = time.time()
            elif d2.proc.poll() is not None:
                raise RuntimeError("D2 exited: %s" % tail(d2.incarnations[-1]["log"]))
            else:
                time.sleep(0.02)
        if t_reg is None:
            self.violation("join: D2 did not register in etcd within 90 s")
            return d2
        t_listed = t_served = None
        t_end = t_reg + 10
        while time.time() < t_end and (t_listed is None or t_served is None):
            if t_listed is None and self.router_view().get(d2.url):
                t_listed = time.time()
            if t_served is None and self.requests_served(d2) > before:
                t_served = time.time()
            time.sleep(0.02)
        self.figures["join: registered -> listed healthy by the router (s)"] = (
            "%.2f" % (t_listed - t_reg) if t_listed else "never")
        self.figures["join: registered -> first request served by D2 (s)"] = (
            "%.2f" % (t_served - t_reg) if t_served else "never")
        log("join: D2 registered; listed by the router after %s s, first request after %s s" % (
            self.figures["join: registered -> listed healthy by the router (s)"],
            self.figures["join: registered -> first request served by D2 (s)"]))
        if t_served is None or t_served - t_reg > JOIN_BOUND_S:
            self.violation("join: D2 got no request within %.0f s of registering" % JOIN_BOUND_S)
        self.D.append(d2)
        return d2

    def phase_mismatch(self):
        rc, helptext = H.sh("%s serve --help" % self.a.kvpush)
        if "--block-size" not in helptext:
            log("mismatch: SKIP (serve has no --block-size)")
            return
        dx = self.serve("DX", "decode", ["--block-size", "32"])
        dx.start()
        t_end = time.time() + 90
        while time.time() < t_end and dx.url not in (self.etcd_client.instances() or {}):
            time.sleep(0.1)
        if dx.url not in (self.etcd_client.instances() or {}):
            self.violation("mismatch: DX did not register within 90 s: %s" % tail(
                dx.incarnations[-1]["log"]))
            return
        time.sleep(self.a.phase_s)
        n = self.requests_served(dx)
        log("mismatch: DX (block size 32, another compat hash) registered; requests it served "
            "after %.0f s of traffic: %d" % (self.a.phase_s, n))
        if n:
            self.violation("mismatch: the router paired DX (another compat hash): %d requests" % n)
        dx.proc.send_signal(signal.SIGTERM)
        try:
            dx.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.violation("mismatch: DX did not exit within 30 s of SIGTERM")

    def phase_kill(self, d1):
        t_kill = time.time()
        d1.kill()
        t_gone = None
        t_end = t_kill + LEASE_TTL_S + 10
        while time.time() < t_end:
            v = self.router_view()
            if d1.url not in (self.etcd_client.instances() or {d1.url: 1}) and d1.url not in v:
                t_gone = time.time()
                break
            time.sleep(0.05)
        self.figures["kill: SIGKILL -> key gone and dropped by the router (s)"] = (
            "%.2f" % (t_gone - t_kill) if t_gone else "never")
        log("kill: D1 SIGKILLed; key expired and router dropped it after %s s (lease ttl %d s)" % (
            self.figures["kill: SIGKILL -> key gone and dropped by the router (s)"], LEASE_TTL_S))
        if t_gone is None or t_gone - t_kill > LEASE_TTL_S + 2.0:
            self.violation("kill: D1 not dropped within lease ttl + 2 s")
        t_after = t_gone or t_end
        time.sleep(self.a.phase_s)
        early = self.failures_between(t_kill - 1, t_after, by="start")
        late = self.failures_between(t_after, by="start")
        log("kill: %d request(s) failed explicitly while D1 was going away; %d after it was "
            "dropped" % (len(early), len(late)))
        self.figures["kill: failed while D1 was going away (explicit errors)"] = len(early)
        rm = self.router.metrics() or {}
        self.figures["kill: requests the router continued on another D"] = int(
            rm.get("kvpush_router_continuations_total", 0))
        for x in late[:5]:
            self.violation("kill: request started after D1 was dropped failed: %s" % x)

    def long_streams(self, n):
        """Starts `n` long seeded streams through the router (push); returns (threads, results,
        the colocated reference's ids). Open when D0's drain begins, so D0 offers its share and
        the router moves them (docs/reliability.md, "Migration")."""
        body = {"prompt": "Once upon a time, there was a little", "max_tokens": 420,
                "ignore_eos": True, "return_token_ids": True, "temperature": 0.8, "top_p": 0.95,
                "seed": 77}
        ref = send(self.colo.host, self.colo.port, dict(body, stream=False))
        results = [None] * n

        def run(i):
            results[i] = send(self.router.host, self.router.port, dict(body, stream=True),
                              {"x-kvpush-mode": "push"}, timeout=60)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        return threads, results, ref["ids"]

    def pushed_moves(self):
        """The router's continuations with the KV pushed by the offering D (kind=stream_pushed)."""
        try:
            c = http.client.HTTPConnection(self.router.host, self.router.port, timeout=5)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            c.close()
        except (OSError, http.client.HTTPException):
            return 0
        total = 0.0
        for line in text.splitlines():
            if (line.startswith("kvpush_router_continuations_total{") and
                    'kind="stream_pushed"' in line):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def phase_drain(self, d0):
        moved_before = (self.router.metrics() or {}).get("kvpush_router_continuations_total", 0)
        pushed_before = self.pushed_moves()
        threads, long_results, long_ref = self.long_streams(6)
        time.sleep(0.03)
        t_term = time.time()
        d0.proc.send_signal(signal.SIGTERM)
        t_left = None
        t_end = t_term + self.a.drain_timeout_s + 30
        while time.time() < t_end:
            if t_left is None and d0.url not in (self.etcd_client.instances() or {d0.url: 1}):
                t_left = time.time()
            if d0.proc.poll() is not None:
                break
            time.sleep(0.05)
        rc = d0.proc.poll()
        self.figures["drain: SIGTERM -> key deleted (s)"] = (
            "%.2f" % (t_left - t_term) if t_left else "never")
        self.figures["drain: SIGTERM -> exit (s)"] = "%.2f" % (time.time() - t_term)
        log("drain: D0 left etcd after %s s, exited with status %s after %.1f s" % (
            self.figures["drain: SIGTERM -> key deleted (s)"], rc, time.time() - t_term))
        if rc != 0:
            self.violation("drain: D0 exit status %s after SIGTERM (expected 0): %s" % (
                rc, tail(d0.incarnations[-1]["log"])))
        time.sleep(self.a.phase_s / 2)
        f = self.failures_between(t_term, by="end")
        log("drain: %d requests served since SIGTERM, %d failed" % (
            self.served_between(t_term, time.time()), len(f)))
        # Streams D0 offered when its drain began, moved by the router (docs/reliability.md,
        # "Migration"); every answer is still compared with colocated at the end.
        for t in threads:
            t.join()
        bad = [r for r in long_results if r is None or r["kind"] != "ok" or r["ids"] != long_ref]
        for r in bad[:3]:
            self.violation("drain: a long stream open at SIGTERM failed or differs from "
                           "colocated: %s" % (r and (r["kind"], r["status"], r["error"][:200])))
        moved = (self.router.metrics() or {}).get("kvpush_router_continuations_total", 0)
        self.figures["drain: long streams open at SIGTERM / identical to colocated"] = "%d / %d" % (
            len(long_results), len(long_results) - len(bad))
        self.figures["drain: streams the router moved off D0 (with their KV pushed)"] = "%d (%d)" % (
            int(moved - moved_before), self.pushed_moves() - pushed_before)
        for x in f[:5]:
            self.violation("drain: request failed while D0 drained: %s" % x)

    def phase_etcd_restart(self):
        live = [i for i in self.P + self.D if i.incarnations and i.proc.poll() is None]
        t0 = time.time()
        self.etcd.kill()
        view_lost = []
        t_down_end = time.time() + self.a.phase_s
        while time.time() < t_down_end:
            v = self.router_view()
            lost = [i.name for i in live if not v.get(i.url)]
            if lost:
                view_lost.append(lost)
            time.sleep(0.1)
        self.start_etcd()
        t_back = time.time()
        t_reg = None
        t_end = t_back + 30
        while time.time() < t_end:
            inst = self.etcd_client.instances() or {}
            if all(i.url in inst for i in live):
                t_reg = time.time()
                break
            time.sleep(0.1)
        self.figures["etcd: restarted -> every live instance registered again (s)"] = (
            "%.2f" % (t_reg - t_back) if t_reg else "never")
        time.sleep(self.a.phase_s / 2)
        f = self.failures_between(t0, by="end")
        log("etcd: down %.1f s; router kept %s; re-registered after %s s; %d requests served, %d "
            "failed" % (t_back - t0, "every live instance" if not view_lost else
                        "NOT all (%s)" % view_lost[0],
                        self.figures["etcd: restarted -> every live instance registered again (s)"],
                        self.served_between(t0, time.time()), len(f)))
        if view_lost:
            self.violation("etcd: the router lost live instances while etcd was down: %s" %
                           view_lost[0])
        if t_reg is None:
            self.violation("etcd: live instances not all registered again within 30 s of restart")
        for x in f[:5]:
            self.violation("etcd: request failed during the etcd restart: %s" % x)

    # -- end -------------------------------------------------------------------------------------

    def stop_all_and_check(self):
        procs = [i for i in self.instances if i.incarnations] + [self.etcd]
        for inst in procs:
            if inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGTERM)
        for inst in procs:
            try:
                inst.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.violation("%s did not exit within 60 s of SIGTERM" % inst.name)
                inst.proc.kill()
                inst.proc.wait()
        for inst in procs:
            for n, inc in enumerate(inst.incarnations):
                rc = inc["proc"].returncode
                if inc["killed"]:
                    continue
                if inst is self.etcd:  # etcd ends by re-raising SIGTERM
                    if rc not in (0, -signal.SIGTERM):
                        self.violation("etcd#%d exit status %s: %s" % (n, rc, tail(inc["log"])))
                    continue
                if rc != 0:
                    self.violation("%s#%d exit status %s: %s" % (inst.name, n, rc, tail(inc["log"])))
                with open(inc["log"], errors="replace") as f:
                    text = f.read()
                for pat in CRASH_PATTERNS:
                    if pat in text:
                        self.violation("%s#%d: log contains '%s' (%s)" % (inst.name, n, pat,
                                                                        inc["log"]))
                        break

    def run(self):
        a = self.a
        t0 = time.time()
        workers = []
        try:
            try:
                self.setup()
            except Skip as e:
                log("SKIP: %s" % e)
                return 77
            self.references()
            workers = [threading.Thread(target=self.traffic, args=(w,))
                       for w in range(a.concurrency)]
            for w in workers:
                w.start()
            self.phase_baseline()
            self.phase_join()
            self.phase_mismatch()
            self.phase_kill(self.D[1])
            self.phase_drain(self.D[0])
            self.phase_etcd_restart()
            self.stop_traffic.set()
            for w in workers:
                w.join()
            workers = []
            self.stop_all_and_check()
        finally:
            self.stop_traffic.set()
            for w in workers:
                w.join()
            for inst in self.instances + ([self.etcd] if getattr(self, "etcd", None) else []):
                for inc in inst.incarnations:
                    if inc["proc"].poll() is None:
                        inc["proc"].kill()
                        inc["proc"].wait()
            if self.netns:
                self.netns.destroy()
        kinds = {}
        for r in self.results:
            key = r[2] if r[2] != "http_error" else "HTTP %d" % r[3]
            kinds[key] = kinds.get(key, 0) + 1
        log("requests: %d; outcomes: %s" % (len(self.results), ", ".join(
            "%s %d" % (k, v) for k, v in sorted(kinds.items()))))
        for k, v in self.figures.items():
            log("  %-66s %s" % (k, v))
        log("%.1f s in all; seed %d" % (time.time() - t0, a.seed))
        if self.violations:
            log("FAILED: %d violation(s); logs kept in %s" % (len(self.violations), self.dir))
            for v in self.violations[:40]:
                log("  " + v)
            return 1
        if not a.keep_logs:
            shutil.rmtree(self.dir, ignore_errors=True)
        log("PASSED")
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    ap.add_argument("--work", default=tempfile.gettempdir())
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--pool", type=int, default=48, help="distinct prompt/seed entries")
    ap.add_argument("--kv-blocks", type=int, default=512)
    ap.add_argument("--phase-s", type=float, default=6.0, help="traffic time per phase")
    ap.add_argument("--drain-timeout-s", type=float, default=30.0)
    ap.add_argument("--prefix", default="/kvpush/", help="the instances' --discovery-prefix")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--log-level", default="info")
    a = ap.parse_args()
    H.LOG_PREFIX = "cluster"
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 1 << 31)
    missing = [why for ok, why in [
        (os.path.exists(a.model), "model %s not found" % a.model),
        (os.geteuid() == 0, "network namespaces need root"),
        (shutil.which("ip") is not None, "`ip` (iproute2) not found"),
        (os.path.exists(a.etcd), "etcd not found (Debian: apt-get install etcd-server)")] if not ok]
    if missing:
        print("cluster: SKIP: " + "; ".join(missing))
        return 77
    os.makedirs(a.work, exist_ok=True)
    return Cluster(a).run()


if __name__ == "__main__":
    sys.exit(main())
