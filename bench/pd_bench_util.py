"""Helpers shared by the P/D benchmark scripts (pd_handoff.py, pd_timeline.py, idle_cpu.py):
loopback ports, waiting for /health, percentiles and per-process CPU and context switches from
/proc. Only the Python standard library is used."""
import http.client
import os
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
