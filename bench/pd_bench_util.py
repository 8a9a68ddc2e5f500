"""Helpers shared by the P/D benchmark scripts (pd_handoff.py, pd_long_context.py, ...):
loopback ports, waiting for /health, a streamed completion's token times, percentiles and
per-process CPU and context switches from /proc. Only the Python standard library is used."""
import http.client
import json
import os
import shutil
import socket
import subprocess
import time

HOST = "127.0.0.1"


def free_port():
    """A TCP port free on HOST right now."""
    s = socket.socket()
    s.bind((HOST, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_healthy(port, proc, timeout=120.0):
    """Waits until GET /health on `port` answers 200; raises if `proc` exits or time runs out."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"process on port {port} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection(HOST, port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"port {port} did not become healthy")


def start_kvpush(kvpush, tmp, procs, ports, name, cpu, args):
    """Starts `kvpush args --host HOST --port <free port>` as `name` (pinned to CPUs `cpu` with
    taskset when given and available), logging to <tmp>/<name>.log; records the port in
    `ports[name]` and the process in `procs`. Returns the process (not yet healthy)."""
    ports[name] = free_port()
    pin = ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []
    p = subprocess.Popen(pin + [kvpush] + args + ["--host", HOST, "--port", str(ports[name])],
                         stdout=open(os.path.join(tmp, name + ".log"), "w"),
                         stderr=subprocess.STDOUT)
    procs.append(p)
    return p


TTFT_SUM = "vllm:time_to_first_token_seconds_sum"


def handoff_timelines(port, limit=4096, timeout=10):
    """The newest handoff timeline records (GET /debug/handoff_timeline, docs/pd_protocol.md §7)
    of the instance or router on `port`, newest first."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    c.request("GET", f"/debug/handoff_timeline?limit={limit}")
    r = c.getresponse()
    body = r.read()
    if r.status != 200:
        raise RuntimeError(f"/debug/handoff_timeline on {port}: HTTP {r.status}")
    return json.loads(body)["data"]


def metrics(port, timeout=10):
    """Prometheus text of the instance on `port` -> {metric name: value}, summed over the
    name's label sets (a name with one label set: its value)."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out


def delta(before, after, name):
    """How much metric `name` grew between two `metrics()` scrapes (0 where absent)."""
    return after.get(name, 0.0) - before.get(name, 0.0)


def pct(v, q):
    """The q-quantile (0..1, linear interpolation) of the values of `v` that are not None; NaN
    when there are none."""
    v = sorted(x for x in v if x is not None)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ctx_switches(pid):
    """Voluntary + involuntary context switches of every thread of `pid` so far (wake-ups and
    preemptions; /proc/PID/task/*/status)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def stop_all(procs):
    """Terminates every process of `procs` (subprocess.Popen), then waits up to 10 s for each and
    kills what is left."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def read1_pieces(resp, clock=time.perf_counter):
    """(clock() at arrival, bytes) for each piece of an http.client response, until its end."""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        yield clock(), chunk


def sse_events(pieces):
    """The SSE events (bytes, without the blank line) in `pieces`, an iterable of (arrival time,
    bytes): yields (arrival time of the piece that completed the event, event)."""
    buf = b""
    for t, piece in pieces:
        buf += piece
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            yield t, ev


def stream_tokens(port, body, mode=None, timeout=600):
    """POSTs `body` to /v1/completions on `port` as a stream (with return_token_ids; header
    x-kvpush-mode: `mode` when given) and reads it to the end. Returns (send ns, [arrival ns of
    each token], end ns, token ids), time.monotonic_ns (CLOCK_MONOTONIC). Raises on an HTTP error,
    an SSE error event or a stream without tokens."""
    body = dict(body, stream=True, return_token_ids=True)
    headers = {"content-type": "application/json"}
    if mode:
        headers["x-kvpush-mode"] = mode
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    t0 = time.monotonic_ns()
    c.request("POST", "/v1/completions", json.dumps(body), headers)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times, tokens = [], []
    for _, ev in sse_events(read1_pieces(r)):
        for line in ev.split(b"\n"):
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            j = json.loads(line[5:])
            if "error" in j:
                raise RuntimeError(f"stream error: {j['error']}")
            for ch in j.get("choices", []):
                ids = ch.get("token_ids") or []
                if ids:
                    now = time.monotonic_ns()
                    tokens.extend(ids)
                    times.extend([now] * len(ids))
    if not times:
        raise RuntimeError("no tokens streamed")
    return t0, times, time.monotonic_ns(), tokens


def add_kvpush_and_model_args(ap):
    """--kvpush (default: build/apps/kvpush of this checkout) and --model (default:
    ../shared/models/stories260K.gguf beside it) on the argparse parser `ap`."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--kvpush", default=os.path.join(root, "build", "apps", "kvpush"))
    ap.add_argument("--model", default=os.path.join(root, "..", "shared", "models",
                                                   "stories260K.gguf"))
