"""Shared pieces of the process-level Python tests (tests/chaos, tests/cluster): network
namespaces joined by a bridge, restartable kvpush processes, /metrics scraping, and an OpenAI
completions client that classifies every answer (ok, HTTP error, SSE error event, truncated
stream, transport error, timeout, client abort).

Python 3 standard library only. Import with
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

REQUEST_TIMEOUT_S = 60.0  # a request still unanswered after this is a hang


CRASH_PATTERNS = [
    "AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:", "ThreadSanitizer",
    "LeakSanitizer", "terminate called", "Segmentation fault", "Assertion `", "Check failed",
    "*** stack smashing", "double free", "Aborted",
]



T0 = time.time()
LOG_PREFIX = "kvpush"  # set by the test: "chaos", "cluster"


def log(msg):
    sys.stdout.write("%s: [%6.1f s] %s\n" % (LOG_PREFIX, time.time() - T0, msg))
    sys.stdout.flush()


# Checks of the process tests: each prints "ok" or "FAIL" and a failed one is kept in FAILURES
# (the test exits 1 when it is not empty).
FAILURES = []


def check(cond, what):
    log(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(cmd):
    r = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


# ----------------------------------------------------------------------------------------------
# Network namespaces: one per P/D instance, joined by a bridge in the root namespace (router and
# colocated instance stay in the root namespace and reach the instances through the bridge).

class Netns:
    """Namespaces <prefix><tag>n<i> with addresses <net>.<k>.<i+2>/24 on veths enslaved to the
    bridge <prefix><tag>b (<net>.<k>.1 in the root namespace). `tag` keeps concurrent runs apart."""

    def __init__(self, tag, prefix="kvc", net="10.79"):
        self.tag = tag  # short, unique per run
        self.prefix, self.net = prefix, net
        self.k = 20 + os.getpid() % 200
        self.bridge = "%s%sb" % (prefix, tag)
        self.created = []
        self.links = []

    def ip(self, i):
        return "%s.%d.%d" % (self.net, self.k, i + 2)

    def ns(self, i):
        return "%s%sn%d" % (self.prefix, self.tag, i)

    def host_dev(self, i):
        return "%s%sh%d" % (self.prefix, self.tag, i)

    def dev(self, i):
        return "%s%sp%d" % (self.prefix, self.tag, i)

    def create(self, n):
        cmds = ["ip link add name %s type bridge" % self.bridge,
                "ip addr add %s.%d.1/24 dev %s" % (self.net, self.k, self.bridge),
                "ip link set %s up" % self.bridge]
        for c in cmds:
            rc, out = sh(c)
            if rc != 0:
                return "%s: %s" % (c, out.strip())
        self.created.append(("link", self.bridge))
        for i in range(n):
            ns, h, p = self.ns(i), self.host_dev(i), self.dev(i)
            steps = ["ip netns add %s" % ns,
                     "ip link add %s type veth peer name %s" % (h, p),
                     "ip link set %s netns %s" % (p, ns),
                     "ip link set %s master %s" % (h, self.bridge),
                     "ip link set %s up" % h,
                     "ip netns exec %s ip addr add %s/24 dev %s" % (ns, self.ip(i), p),
                     "ip netns exec %s ip link set %s up" % (ns, p),
                     "ip netns exec %s ip link set lo up" % ns]
            for j, c in enumerate(steps):
                rc, out = sh(c)
                if rc != 0:
                    return "%s: %s" % (c, out.strip())
                if j == 0:
                    self.created.append(("ns", ns))
                if j == 1:
                    self.created.append(("link", h))
        return ""

    def set_link(self, i, up):
        return sh("ip link set %s %s" % (self.host_dev(i), "up" if up else "down"))[0] == 0

    def destroy(self):
        for kind, name in reversed(self.created):
            if kind == "ns":
                sh("ip netns del %s" % name)
            else:
                sh("ip link del %s" % name)
        self.created = []


# ----------------------------------------------------------------------------------------------
# Processes

class Instance:
    """One kvpush serve or router, restartable on the same port; every incarnation is kept."""

    def __init__(self, name, args, host, port, logdir, bin_path, netns=None, env=None):
        self.name, self.args, self.host, self.port = name, args, host, port
        self.logdir, self.bin, self.netns, self.env = logdir, bin_path, netns, env or {}
        self.incarnations = []  # [dict(proc, log, killed)]
        self.lock = threading.Lock()
        self.stopped = False  # SIGSTOPped now
        self.last_metrics = {}  # incarnation index -> last scraped counters

    @property
    def url(self):
        return "http://%s:%d" % (self.host, self.port)

    @property
    def proc(self):
        return self.incarnations[-1]["proc"]

    def start(self):
        n = len(self.incarnations)
        path = os.path.join(self.logdir, "%s.%d.log" % (self.name, n))
        f = open(path, "w")
        cmd = [self.bin] + self.args
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd  # execs: same pid
        env = dict(os.environ)
        env.update(self.env)
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        f.close()
        self.incarnations.append({"proc": p, "log": path, "killed": False})

    def healthy(self, timeout=1.0):
        try:
            c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            c.close()
            return r.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def wait_healthy(self, timeout=60.0):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                return False
            if self.healthy():
                return True
            time.sleep(0.1)
        return False

    def kill(self):
        with self.lock:
            inc = self.incarnations[-1]
            inc["killed"] = True
            inc["proc"].send_signal(signal.SIGKILL)
            inc["proc"].wait()
            self.stopped = False

    def metrics(self, timeout=3.0):
        """Every sample of /metrics summed by name; None when unreachable."""
        try:
            c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            c.request("GET", "/metrics")
            r = c.getresponse()
            body = r.read().decode("utf-8", "replace")
            c.close()
            if r.status != 200:
                return None
        except (OSError, http.client.HTTPException):
            return None
        out = {}
        for line in body.splitlines():
            if not line or line.startswith("#"):
                continue
            name = re.split(r"[{ ]", line, 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                pass
        return out

    def scrape(self):
        m = self.metrics()
        if m is not None:
            self.last_metrics[len(self.incarnations) - 1] = m
        return m

    def counter_total(self, name):
        return sum(m.get(name, 0.0) for m in self.last_metrics.values())


# ----------------------------------------------------------------------------------------------
# Requests

def body_for(entry, stream):
    b = {"prompt": entry["prompt"], "max_tokens": entry["max_tokens"], "ignore_eos": True,
         "return_token_ids": True, "stream": stream}
    if entry["seed"] is not None:
        b.update({"temperature": 0.8, "top_p": 0.95, "seed": entry["seed"]})
    else:
        b["temperature"] = 0.0
    return b


def send(host, port, body, headers=None, timeout=REQUEST_TIMEOUT_S, abort_after=None,
         on_event=None):
    """Posts /v1/completions. Returns dict(kind, status, ids, error). `on_event(n)`, streamed
    only: called after the n-th data event with choice data was read (n = 1, 2, ...).

    kind: ok (200, complete), http_error, sse_error, truncated (stream ended without [DONE] and
    without an error event), transport (no HTTP answer), timeout, aborted (by us)."""
    res = {"kind": None, "status": 0, "ids": [], "error": ""}
    stream = body.get("stream", False)
    t_abort = None
    if abort_after is not None:
        t_abort = abort_after
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout if t_abort is None or stream
                                       else t_abort)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", "/v1/completions", json.dumps(body), h)
        r = c.getresponse()
        res["status"] = r.status
        if not stream or r.status != 200:
            data = r.read()
            c.close()
            try:
                j = json.loads(data)
            except ValueError:
                j = None
            if r.status != 200:
                res["kind"] = "http_error"
                res["error"] = (j or {}).get("error", {}).get("message", "") if isinstance(j, dict) \
                    and isinstance(j.get("error"), dict) else data[:200].decode("utf-8", "replace")
                return res
            if isinstance(j, dict) and "error" in j:
                res["kind"] = "http_error"  # 200 with an error body: counted, flagged below
                res["error"] = str(j["error"])
                res["error_in_200"] = True
                return res
            if isinstance(j, dict) and isinstance(j.get("id"), str):
                res["id"] = j["id"]
            try:
                res["ids"] = j["choices"][0]["token_ids"]
                res["kind"] = "ok"
            except (TypeError, KeyError, IndexError):
                res["kind"] = "truncated"
                res["error"] = "200 without choices[0].token_ids: %r" % data[:200]
            return res
        # Streamed 200: read SSE events.
        done = False
        events = 0
        while True:
            line = r.fp.readline()
            if not line:
                break
            line = line.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            events += 1
            try:
                j = json.loads(payload)
            except ValueError:
                res["kind"] = "truncated"
                res["error"] = "malformed SSE event %r" % payload[:200]
                c.close()
                return res
            if "error" in j:
                res["kind"] = "sse_error"
                e = j["error"]
                res["error"] = e.get("message", str(e)) if isinstance(e, dict) else str(e)
                # keep reading to [DONE] or close
                continue
            if "id" not in res and isinstance(j.get("id"), str):
                res["id"] = j["id"]
            try:
                res["ids"].extend(j["choices"][0].get("token_ids") or [])
            except (KeyError, IndexError, TypeError):
                pass
            if on_event is not None:
                on_event(events)
            if t_abort is not None and events >= 1:
                c.close()
                res["kind"] = "aborted"
                return res
        c.close()
        if res["kind"] == "sse_error":
            return res
        res["kind"] = "ok" if done else "truncated"
        if not done:
            res["error"] = "stream ended without [DONE] and without an error event"
        return res
    except socket.timeout:
        res["kind"] = "aborted" if t_abort is not None and not stream else "timeout"
        return res
    except (OSError, http.client.HTTPException) as e:
        res["kind"] = "transport"
        res["error"] = "%s: %s" % (type(e).__name__, e)
        return res


def make_pool(rng, n, vocab):
    """Prompt/sampling entries: short, long (up to 440 tokens of the model's 512), shared
    prefixes, repeats; greedy and seeded."""
    pool = []
    longs = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.35:
            prompt = [1] + [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 16))]
        elif kind < 0.70 or not longs:
            prompt = [1] + [rng.randrange(3, vocab) for _ in range(rng.randrange(40, 200))]
            longs.append(prompt)
        elif kind < 0.75:  # near the context: 16-28 blocks, many list parts
            prompt = [1] + [rng.randrange(3, vocab) for _ in range(rng.randrange(250, 440))]
        else:  # a prefix (whole and partial blocks) of an earlier long prompt plus a new tail
            base = rng.choice(longs)
            cut = rng.randrange(8, len(base))
            prompt = base[:cut] + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 40))]
        seed = rng.randrange(1 << 40) if rng.random() < 0.5 else None
        pool.append({"prompt": prompt, "max_tokens": rng.randrange(4, 17), "seed": seed})
    return pool


def short(msg):
    msg = re.sub(r"[0-9a-f]{32}", "<id>", msg or "")
    msg = re.sub(r"\d+", "N", msg)
    return msg[:110]


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def log_time(stamp):
    """Seconds of a kvpush log line's "%Y-%m-%d %H:%M:%S.%e" stamp (src/common/log.cc)."""
    day, clock = stamp.split(" ")
    h, m, sec = clock.split(":")
    return time.mktime(time.strptime(day, "%Y-%m-%d")) + int(h) * 3600 + int(m) * 60 + float(sec)


_QUARANTINE_START = re.compile(r"^\[([0-9-]+ [0-9:.]+)\].*transfer ([0-9a-f]{32}): .*"
                               r"blocks are quarantined until nothing can land")
_QUARANTINE_END = re.compile(r"^\[([0-9-]+ [0-9:.]+)\].*transfer ([0-9a-f]{32}): quarantine of "
                             r"\d+ blocks ends")


def quarantines(log_path):
    """The quarantines a decode instance's log shows (TransferCore::Quarantine's warning, then
    CompleteConsumer's "quarantine of N blocks ends"): ({transfer id: seconds it lasted} for the
    ended ones, [transfer ids never ended])."""
    started, ended = {}, {}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = _QUARANTINE_START.match(line)
            if m:
                started[m.group(2)] = log_time(m.group(1))
                continue
            m = _QUARANTINE_END.match(line)
            if m and m.group(2) in started:
                ended[m.group(2)] = log_time(m.group(1)) - started.pop(m.group(2))
    return ended, sorted(started)


def stop_all(instances, timeout=40):
    """SIGTERM every Instance still running (a graceful drain), then wait; kill what outlives
    `timeout` seconds."""
    for inst in instances:
        if inst.proc.poll() is None:
            inst.proc.terminate()
    for inst in instances:
        try:
            inst.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            inst.proc.kill()
