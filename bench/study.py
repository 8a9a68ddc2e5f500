#!/usr/bin/env python3
"""The push vs pull study under load (issue 10; results in docs/benchmarks/study.md).

One command runs everything:

    bench/study.py                  # ~20-25 min on the project's 2-core machine
    bench/study.py --quick          # a few points per part (~6 min), for trying it out

What it starts (all `kvpush serve --executor sim --sim-model qwen3-32b --sim-hw h200`, no model
file; docs/sim.md): a 1P1D deployment (P pinned to CPU 0, D to CPU 1, KV over ucx:shm) behind
`kvpush router` (the mode is chosen per request with `x-kvpush-mode`: push, pull-vllm, pull-fast),
and two colocated instances (CPU 0 and CPU 1) behind `kvpush router --colocated` (round robin):
same hardware (two accelerators) for both rows. Every request is sent by `kvpush bench`
(docs/bench.md) with vLLM's `random` dataset as token ids, greedy (`--temperature 0`), streamed.

Parts:
  base   ~2k-token prompts, 128-token outputs, request-rate sweep up to P's saturation, 4 modes
  frag   (a) fragmented KV pools (`--kv-block-allocation scattered` on P and D: no descriptor
         coalesces); descriptors and backend ops per request are reported
  hit    (b) 100% prefix hits on D: each mode's prompts are sent once (warm-up pass), then again
         (measured); P's cache is warm too (hit-pwarm) or off (hit-pcold)
  link   (c) P in its own network namespace behind a veth pair shaped with `tc tbf` (ucx:tcp)
  long   (d) 8k-token prompts
  short  prompts of 16-512 tokens one at a time: H(mode) = TTFT(mode) - TTFT(colocated)

Checks, per point: every request succeeded; the generated text of every prompt is identical in
every mode that ran it (colocated == pull == push); every KV block D received was verified (no
checksum mismatch); every instance's block pool is back to its full free count afterwards.
Writes docs/benchmarks/study.md, docs/benchmarks/study/*.png and docs/benchmarks/study/results.json.
Needs python3-matplotlib (Debian) for the plots; `ip` and `tc` (iproute2) and root for `link`.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_handoff as hb  # noqa: E402  (free_port, wait_healthy, metrics)
import study_report  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PD_MODES = ["push", "pull-vllm", "pull-fast"]
MODES = PD_MODES + ["colocated"]
NETNS = "kvpush-study-p"
VETH_ROOT, VETH_NS = "kvst0", "kvst1"
IP_ROOT, IP_NS = "10.231.0.1", "10.231.0.2"

COUNTERS = ["kvpush_kv_transfer_blocks_verified_total", "kvpush_kv_transfer_checksum_mismatches_total",
            "kvpush_kv_transfer_descriptors_total", "kvpush_kv_transfer_ops_total",
            "kvpush_kv_transfer_failed_total", "kvpush_kv_transfer_not_needed_total",
            "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "kvpush_kv_transfer_read_seconds_sum", "kvpush_kv_transfer_read_seconds_count",
            "kvpush_kv_transfer_push_tail_seconds_sum", "kvpush_kv_transfer_push_tail_seconds_count",
            "kvpush_kv_transfer_bytes_written_total", "vllm:time_to_first_token_seconds_sum",
            "vllm:time_to_first_token_seconds_count"]


class Deployment:
    """A set of instances plus the router in front of them; stopped as a whole."""

    def __init__(self, study, name, kind, serve_args, backend="ucx:shm", netns_p=False, p_args=()):
        self.study, self.name, self.kind = study, name, kind
        self.serve_args, self.backend, self.netns_p, self.p_args = serve_args, backend, netns_p, p_args
        self.procs, self.instances = [], []  # instances: (name, host, port)
        self.router_port = None

    def _spawn(self, name, argv, cpu=None, netns=None, env=None):
        cmd = argv
        if cpu is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(cpu)] + cmd
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        log = open(os.path.join(self.study.tmp, f"{self.name}-{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append((name, p))
        return p

    def _serve(self, name, cpu, role, host, extra=(), netns=None, env=None):
        port = hb.free_port()
        argv = [self.study.kvpush, "serve"] + self.serve_args + list(extra) + [
            "--role", role, "--host", host, "--port", str(port)]
        if role != "both":
            cfg = {"kv_connector_extra_config": {"backend": self.backend, "watchdog_ms": 60000,
                                                 "lease_ms": 120000}}
            argv += ["--kv-transfer-config", json.dumps(cfg), "--advertise-host", host]
        p = self._spawn(name, argv, cpu, netns, env)
        self.instances.append((name, host, port, p))
        return port

    def start(self):
        if self.kind == "pd":
            env_p = env_d = None
            host_p = host_d = hb.HOST
            if self.netns_p:
                host_p, host_d = IP_NS, IP_ROOT
                env_p = dict(os.environ, UCX_NET_DEVICES=VETH_NS)
                env_d = dict(os.environ, UCX_NET_DEVICES=VETH_ROOT)
            pp = self._serve("prefill", 0, "prefill", host_p, self.p_args,
                             NETNS if self.netns_p else None, env_p)
            dp = self._serve("decode", 1, "decode", host_d, env=env_d)
            router_args = ["--prefill", f"http://{host_p}:{pp}", "--decode", f"http://{host_d}:{dp}"]
        else:
            a = self._serve("colocated-a", 0, "both", hb.HOST)
            b = self._serve("colocated-b", 1, "both", hb.HOST)
            router_args = ["--colocated", f"http://{hb.HOST}:{a}", f"http://{hb.HOST}:{b}"]
        for name, host, port, p in self.instances:
            wait_healthy(host, port, p)
        self.router_port = hb.free_port()
        r = self._spawn("router", [self.study.kvpush, "router"] + router_args +
                        ["--host", hb.HOST, "--port", str(self.router_port), "--log-level", "warn"])
        wait_healthy(hb.HOST, self.router_port, r)
        return self

    def snapshot(self):
        return {name: metrics(host, port) for name, host, port, _ in self.instances}

    def wait_idle(self, timeout=60.0):
        """True once every instance's pool is back to its full free count (nothing used, no
        transfer in flight)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            ok = True
            for _, host, port, _ in self.instances:
                m = metrics(host, port)
                if (m.get("kvpush_kv_blocks_used", 1) != 0 or
                        m.get("kvpush_kv_transfer_producers_active", 0) != 0 or
                        m.get("kvpush_kv_transfer_consumers_waiting", 0) != 0 or
                        m.get("kvpush_kv_blocks_free", 0) + m.get("kvpush_kv_blocks_cached", 0)
                        != m.get("kvpush_kv_blocks_total", -1)):
                    ok = False
            if ok:
                return True
            time.sleep(0.2)
        return False

    def stop(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for name, p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.returncode not in (0, -15):
                print(f"  warning: {self.name}/{name} exited with {p.returncode}", flush=True)


def metrics(host, port):
    import http.client
    c = http.client.HTTPConnection(host, port, timeout=5)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def wait_healthy(host, port, proc, timeout=180.0):
    import http.client
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"process on {host}:{port} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection(host, port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{host}:{port} did not become healthy in {timeout} s")


class Study:
    def __init__(self, args):
        self.a = args
        self.kvpush = os.path.abspath(args.kvpush)
        self.tmp = tempfile.mkdtemp(prefix="kvpush-study-")
        self.points = []  # one dict per (part, rate/length, mode)
        self.deployments = []
        self.t0 = time.time()

    # ---- deployments -------------------------------------------------------------------------
    def serve_args(self, prefix_cache=False, extra=()):
        a = self.a
        args = ["--executor", "sim", "--sim-model", a.sim_model, "--sim-hw", a.sim_hw,
                "--sim-kv-scale", str(a.kv_scale), "--kv-cache-memory", str(a.kv_memory_gib << 30),
                "--max-model-len", "8400", "--max-num-seqs", "128", "--log-level", "warn"]
        if not prefix_cache:
            args.append("--no-enable-prefix-caching")
        return args + list(extra)

    def deploy(self, name, kind, **kw):
        d = Deployment(self, name, kind, **kw)
        self.deployments.append(d)
        print(f"[{self.elapsed()}] starting {name} ...", flush=True)
        return d.start()

    def undeploy(self, *ds):
        for d in ds:
            d.stop()
            self.deployments.remove(d)

    def elapsed(self):
        s = int(time.time() - self.t0)
        return f"{s // 60:02d}:{s % 60:02d}"

    # ---- one measured point ------------------------------------------------------------------
    def bench(self, dep, mode, part, x, *, input_len, output_len, n, rate, seed, prefix_len=0,
              concurrency=None, record=True, url=None):
        out = os.path.join(self.tmp, f"{part}-{x}-{mode}-{len(self.points)}-{time.time():.0f}.json")
        url = url or f"http://{hb.HOST}:{dep.router_port}"
        argv = [self.kvpush, "bench", "--base-url", url,
                "--dataset-name", "random", "--random-input-len", str(input_len),
                "--random-output-len", str(output_len), "--random-vocab-size", "150000",
                "--random-prefix-len", str(prefix_len), "--num-prompts", str(n),
                "--request-rate", str(rate), "--seed", str(seed), "--temperature", "0",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                "--save-result", "--save-detailed", "--result-dir", os.path.dirname(out),
                "--result-filename", os.path.basename(out), "--disable-tqdm"]
        if mode != "colocated":
            argv += ["--header", f"x-kvpush-mode={mode}"]
        if concurrency:
            argv += ["--max-concurrency", str(concurrency)]
        before = dep.snapshot()
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"kvpush bench failed ({part} {x} {mode}):\n{r.stdout[-3000:]}")
        with open(out) as f:
            res = json.load(f)
        idle = dep.wait_idle()
        after = dep.snapshot()
        delta = {inst: {k: after[inst].get(k, 0) - before[inst].get(k, 0) for k in COUNTERS}
                 for inst in after}
        point = {"part": part, "x": x, "mode": mode, "rate": rate, "input_len": input_len,
                 "output_len": output_len, "num_prompts": n, "seed": seed,
                 "completed": res["completed"], "failed": res["failed"],
                 "errors": [e for e in res.get("errors", []) if e][:3],
                 "texts": res.get("generated_texts", []), "pools_full": idle, "counters": delta}
        for m in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("median", "p99", "mean"):
                key = f"{stat}_{m}_ms"
                point[key] = res.get(key)
        point["request_throughput"] = res.get("request_throughput")
        point["output_throughput"] = res.get("output_throughput")
        if record:
            self.points.append(point)
        print(f"[{self.elapsed()}] {part:10s} {str(x):>6s} {mode:10s} ok={res['completed']}/{n} "
              f"TTFT p50 {point['median_ttft_ms']:8.1f} p99 {point['p99_ttft_ms']:8.1f}  "
              f"TPOT p50 {point['median_tpot_ms']:6.2f} p99 {point['p99_tpot_ms']:6.2f}  "
              f"pools_full={idle}", flush=True)
        return point

    def sweep(self, part, deps, rates, modes, *, input_len, output_len, n_of_rate, seed0,
              prefix_len=0):
        """For each rate, every mode in turn (the same prompts: the same seed per rate)."""
        for i, rate in enumerate(rates):
            for mode in modes:
                dep = deps["colocated" if mode == "colocated" else "pd"]
                self.bench(dep, mode, part, rate, input_len=input_len, output_len=output_len,
                           n=n_of_rate(rate), rate=rate, seed=seed0 + i, prefix_len=prefix_len)

    # ---- parts -------------------------------------------------------------------------------
    def part_base(self, deps):
        q = self.a.quick
        rates = [0.5, 2, 4] if q else [0.5, 1, 2, 3, 4, 4.5]
        self.sweep("base", deps, rates, MODES, input_len=self.a.input_len, output_len=128,
                   n_of_rate=lambda r: max(8 if q else 12, int(r * (6 if q else 12))), seed0=100)

    def part_long(self, deps):
        rates = [0.25] if self.a.quick else [0.25, 0.6]
        self.sweep("long", deps, rates, MODES, input_len=8000, output_len=128,
                   n_of_rate=lambda r: 6 if self.a.quick else max(8, int(r * 24)), seed0=300)

    def part_short(self, deps):
        lengths = [16, 128, 2000] if self.a.quick else [16, 32, 64, 128, 512, 2000]
        n = 6 if self.a.quick else 12
        for i, length in enumerate(lengths):
            for mode in MODES:
                dep = deps["colocated" if mode == "colocated" else "pd"]
                self.bench(dep, mode, "short", length, input_len=length, output_len=16, n=n,
                           rate="inf", seed=400 + i, concurrency=1)

    def part_frag(self):
        pd = self.deploy("pd-scattered", "pd",
                         serve_args=self.serve_args(extra=["--kv-block-allocation", "scattered"]))
        try:
            rates = [1] if self.a.quick else [1, 3]
            self.sweep("frag", {"pd": pd}, rates, PD_MODES, input_len=self.a.input_len,
                       output_len=128, n_of_rate=lambda r: max(8, int(r * (6 if self.a.quick else 12))),
                       seed0=500)
        finally:
            self.undeploy(pd)

    def part_hit(self, colo):
        """(b): every prompt is first sent once (warm-up pass, not recorded), then measured."""
        for sub, p_cache in (("hit-pwarm", True), ("hit-pcold", False)):
            pd = self.deploy(f"pd-{sub}", "pd", serve_args=self.serve_args(prefix_cache=True),
                             p_args=[] if p_cache else ["--no-enable-prefix-caching"])
            try:
                rates = [1] if self.a.quick else [1, 3]
                modes = PD_MODES + (["colocated"] if sub == "hit-pwarm" else [])
                for i, rate in enumerate(rates):
                    n = 8 if self.a.quick else max(12, int(rate * 12)) // 2 * 2  # even: same colo instance
                    for j, mode in enumerate(modes):
                        dep = colo if mode == "colocated" else pd
                        seed = 600 + 10 * i + j  # own prompts per mode: the warm-up is the only hit
                        kw = dict(input_len=self.a.input_len, output_len=128, n=n, rate=rate, seed=seed)
                        if mode == "colocated":
                            # Round robin may send a prompt's second visit to the other instance:
                            # warm both directly, so that every measured request hits.
                            for _, host, port, _ in dep.instances:
                                self.bench(dep, mode, sub + "-warmup", rate, record=False,
                                           url=f"http://{host}:{port}", **kw)
                        else:
                            self.bench(dep, mode, sub + "-warmup", rate, record=False, **kw)
                        self.bench(dep, mode, sub, rate, **kw)
            finally:
                self.undeploy(pd)

    def part_link(self):
        if os.geteuid() != 0 or not shutil.which("tc") or not shutil.which("ip"):
            print("skipping link: needs root, ip and tc", flush=True)
            return
        setup_netns(self.a.link_rate)
        try:
            pd = self.deploy("pd-link", "pd", serve_args=self.serve_args(), backend="ucx:tcp",
                             netns_p=True)
            try:
                rates = [1] if self.a.quick else [1, 3]
                self.sweep("link", {"pd": pd}, rates, PD_MODES, input_len=self.a.input_len,
                           output_len=128, n_of_rate=lambda r: max(8, int(r * (6 if self.a.quick else 12))),
                           seed0=700)
            finally:
                self.undeploy(pd)
        finally:
            teardown_netns()

    def run(self):
        parts = self.a.parts.split(",")
        try:
            if {"short", "base", "long"} & set(parts):
                pd = self.deploy("pd", "pd", serve_args=self.serve_args())
                colo = self.deploy("colocated", "colocated", serve_args=self.serve_args())
                deps = {"pd": pd, "colocated": colo}
                # Warm-up (connections, handshakes); not recorded.
                for mode in MODES:
                    self.bench(deps["colocated" if mode == "colocated" else "pd"], mode, "warmup",
                               0, input_len=256, output_len=4, n=4, rate="inf", seed=1, record=False)
                if "short" in parts:
                    self.part_short(deps)
                if "base" in parts:
                    self.part_base(deps)
                if "long" in parts:
                    self.part_long(deps)
                self.undeploy(pd, colo)
            if "hit" in parts:
                colo = self.deploy("colocated-cache", "colocated",
                                   serve_args=self.serve_args(prefix_cache=True))
                try:
                    self.part_hit(colo)
                finally:
                    self.undeploy(colo)
            if "frag" in parts:
                self.part_frag()
            if "link" in parts:
                self.part_link()
        finally:
            for d in list(self.deployments):
                d.stop()
        return self.points


def sh(cmd, check=True):
    return subprocess.run(cmd, shell=True, check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def setup_netns(rate):
    """P's host: a network namespace joined to the root namespace by a veth pair whose two ends
    are shaped by a token bucket (`tc tbf`) to `rate` (e.g. 4gbit)."""
    teardown_netns()
    sh(f"ip netns add {NETNS}")
    sh(f"ip link add {VETH_ROOT} type veth peer name {VETH_NS}")
    sh(f"ip link set {VETH_NS} netns {NETNS}")
    sh(f"ip addr add {IP_ROOT}/24 dev {VETH_ROOT} && ip link set {VETH_ROOT} up")
    sh(f"ip netns exec {NETNS} sh -c 'ip addr add {IP_NS}/24 dev {VETH_NS} && "
       f"ip link set {VETH_NS} up && ip link set lo up'")
    # burst: at least rate/HZ; 1 MiB keeps tbf exact at multi-Gbit rates. latency bounds the queue.
    tbf = f"tbf rate {rate} burst 1mb latency 50ms"
    sh(f"tc qdisc add dev {VETH_ROOT} root {tbf}")
    sh(f"ip netns exec {NETNS} tc qdisc add dev {VETH_NS} root {tbf}")


def teardown_netns():
    sh(f"ip link del {VETH_ROOT}", check=False)
    sh(f"ip netns del {NETNS}", check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvpush", default=os.path.join(ROOT, "build", "apps", "kvpush"))
    ap.add_argument("--quick", action="store_true", help="fewer points (a try-out, ~6 min)")
    ap.add_argument("--parts", default="short,base,long,hit,frag,link")
    ap.add_argument("--sim-model", default="qwen3-32b")
    ap.add_argument("--sim-hw", default="h200")
    ap.add_argument("--kv-scale", type=float, default=0.125, help="--sim-kv-scale (docs/sim.md)")
    ap.add_argument("--kv-memory-gib", type=int, default=3, help="KV arena per instance, GiB")
    ap.add_argument("--input-len", type=int, default=2000)
    ap.add_argument("--link-rate", default="2gbit", help="tc tbf rate of the P<->D link (part link)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs", "benchmarks"))
    ap.add_argument("--merge", help="an earlier run's points.json (in its log dir): its points "
                    "of the parts not run now are kept, so one part can be re-run alone")
    a = ap.parse_args()
    study = Study(a)
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    points = study.run()
    meta = {"started": started, "minutes": round((time.time() - study.t0) / 60, 1),
            "command": "`" + " ".join(["bench/study.py"] + sys.argv[1:]) + "`", "args": vars(a),
            "load": os.getloadavg(), "logs": study.tmp,
            "commit": subprocess.run(["git", "-C", os.path.dirname(a.kvpush), "rev-parse", "--short",
                                      "HEAD"], stdout=subprocess.PIPE, text=True).stdout.strip()}
    if a.merge:
        with open(a.merge) as f:
            earlier = json.load(f)
        ran = set(a.parts.split(","))
        points = [p for p in earlier["points"] if p["part"].split("-")[0] not in ran] + points
        meta["command"] = f"{earlier['meta']['command']} (started {earlier['meta']['started']}), " \
            f"then {meta['command']} (the parts {a.parts} again, same binary)"
    with open(os.path.join(study.tmp, "points.json"), "w") as f:
        json.dump({"meta": meta, "points": points}, f)
    study_report.write(points, meta, a.out_dir)
    print(f"done in {meta['minutes']} min; logs in {study.tmp}", flush=True)


if __name__ == "__main__":
    main()
