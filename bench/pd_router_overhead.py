#!/usr/bin/env python3
"""Where push's handoff overhead goes: the router vs the P->D path (docs/benchmarks/pd.md).

Usage: bench/pd_router_overhead.py MODEL.gguf [N]   (e.g. a `kvpush gen-model --context 4096` model)
Starts colocated + P (CPU 0) + D (CPU 1) over ucx:shm and a router, and for N 512-token prompts
measures, per request, client TTFT minus the TTFT the computing engine recorded for itself, for:
colocated, push through the router, and push driven directly (this script sends the P leg and the
D leg itself, exactly as the router would). The difference between the last two is the router.
"""
import sys, json, os, random, threading, time, subprocess
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_handoff as b
kv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "apps", "kvpush")
model = sys.argv[1]
cfg = json.dumps({"kv_connector_extra_config": {"backend": "ucx:shm", "watchdog_ms": 60000, "lease_ms": 120000}})
common = ["serve", "--model", model, "--no-enable-prefix-caching", "--log-level", "warn", "--max-model-len", "4096"]
ports = {n: b.free_port() for n in ("colo", "p", "d", "r")}
procs = []
def start(cpu, args, port):
    procs.append(subprocess.Popen(["taskset", "-c", str(cpu), kv] + args + ["--host", b.HOST, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
start(0, common + ["--role", "both"], ports["colo"])
start(0, common + ["--role", "prefill", "--kv-transfer-config", cfg], ports["p"])
start(1, common + ["--role", "decode", "--kv-transfer-config", cfg], ports["d"])
for n in ("colo", "p", "d"): b.wait_healthy(ports[n], procs[0])
procs.append(subprocess.Popen([kv, "router", "--prefill", f"http://{b.HOST}:{ports['p']}", "--decode", f"http://{b.HOST}:{ports['d']}", "--host", b.HOST, "--port", str(ports["r"]), "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
b.wait_healthy(ports["r"], procs[-1])
rng = random.Random(3)
def direct_push(body):
    tid = "%032x" % rng.getrandbits(128)
    pb = dict(body, max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True, "transfer_mode": "push", "transfer_id": tid})
    db = dict(body, kv_transfer_params={"do_remote_prefill": True, "transfer_mode": "push", "transfer_id": tid, "remote_host": b.HOST, "remote_port": ports["p"]})
    def p():
        import http.client
        c = http.client.HTTPConnection(b.HOST, ports["p"], timeout=100); c.request("POST", "/v1/completions", json.dumps(pb), {"content-type": "application/json"}); c.getresponse().read()
    th = threading.Thread(target=p); th.start()
    r = b.stream(ports["d"], db); th.join(); return r
res = {"colocated": [], "router push": [], "direct push": []}
warm = {"prompt": [1] + [5] * 40, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
b.stream(ports["colo"], warm); b.stream(ports["r"], warm, "push"); direct_push(warm)
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10):
    body = {"prompt": [1] + [rng.randrange(3, 4096) for _ in range(511)], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    for name in res:
        eng = ports["colo"] if name == "colocated" else ports["p"]
        before = b.metrics(eng).get(b.TTFT_SUM, 0)
        r = b.stream(ports["colo"], body) if name == "colocated" else (b.stream(ports["r"], body, "push") if name == "router push" else direct_push(body))
        res[name].append(r["ttft_ms"] - (b.metrics(eng).get(b.TTFT_SUM, 0) - before) * 1e3)
for name, v in res.items():
    print(f"{name:12s} client TTFT - engine TTFT: median {b.pct(v, 0.5):.2f} ms  p90 {b.pct(v, 0.9):.2f}")
for p in procs: p.terminate()
for p in procs: p.wait()
