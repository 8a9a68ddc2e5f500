#!/usr/bin/env python3
"""Cache-aware routing benchmark: a multi-turn workload replayed on the same trace through
router + 2 P + 2 D on loopback, once per routing configuration, in one run
(docs/benchmarks/pd.md, "Cache-aware routing").

Workload: --conversations conversations of --turns turns. Every prompt starts with one shared
"system" prefix (--system tokens); each turn appends a user message (--user tokens) and a fixed
assistant reply (--reply tokens) to the conversation's history, and the whole history is sent again
(as chat clients do). Token ids are drawn once from a seeded RNG, so every configuration replays
the identical trace. Requests go out turn-major (turn 1 of every conversation, then turn 2, ...)
with --concurrency in flight; a conversation's turn t+1 is sent only after its turn t answered.

Configurations (each on freshly started instances, so no cache carries over):
  least-outstanding           today's router
  least-outstanding+threshold --local-prefill-threshold T
  cache-aware                 --routing cache-aware
  cache-aware+threshold       --routing cache-aware --local-prefill-threshold T
Every configuration runs --repeat times, in rotating order; TTFT percentiles are over all runs.

Reports per configuration: TTFT p50/p99 (client side, streamed), the D-side prefix hit rate
(prompt tokens D found in its prefix cache / prompt tokens D received, from the decode instances'
/metrics), D's NOT_NEEDED count (full prefix hits that told P to drop its prefill), P legs the router
skipped, and p50 TTFT relative to least-outstanding. P instances are pinned to CPU 0, D instances
to CPU 1 (taskset, when present). Reuses bench/pd_handoff.py's helpers; standard library only.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_handoff as ph  # noqa: E402  (free_port, wait_healthy, stream, pct, metrics)

HOST = ph.HOST


def metric_sum(port, name):
    """Sum of every sample of `name` (all label sets) in /metrics of HOST:port."""
    import http.client
    c = http.client.HTTPConnection(HOST, port, timeout=5)
    c.request("GET", "/metrics")
    total = 0.0
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("#") or not line:
            continue
        if line.split("{", 1)[0].split(" ", 1)[0] == name:
            total += float(line.rsplit(" ", 1)[1])
    return total


def make_trace(a):
    rng = random.Random(a.seed)
    tok = lambda n: [rng.randrange(3, a.vocab) for _ in range(n)]  # noqa: E731
    system = [1] + tok(a.system - 1)  # BOS + shared system prompt
    trace = []  # (conversation, turn, prompt ids), turn-major
    hist = {c: list(system) for c in range(a.conversations)}
    per_turn = {}
    for c in range(a.conversations):
        per_turn[c] = [(tok(a.user), tok(a.reply)) for _ in range(a.turns)]
    for t in range(a.turns):
        for c in range(a.conversations):
            user, reply = per_turn[c][t]
            prompt = hist[c] + user
            trace.append((c, t, prompt))
            hist[c] = prompt + reply
    return trace


def run_config(a, kv, model, tmp, name, router_extra, trace):
    procs = []
    ports = {}
    logdir = os.path.join(tmp, name)
    os.makedirs(logdir, exist_ok=True)

    def start(pname, cpu, args):
        ports[pname] = ph.free_port()
        cmd = (["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []) + \
            [kv] + args + ["--host", HOST, "--port", str(ports[pname])]
        p = subprocess.Popen(cmd, stdout=open(os.path.join(logdir, pname + ".log"), "w"),
                             stderr=subprocess.STDOUT)
        procs.append((pname, p))
        return p

    cfg = json.dumps({"kv_connector_extra_config": {"backend": a.backend}})
    common = ["serve", "--model", model, "--log-level", "warn", "--num-kv-blocks", str(a.kv_blocks),
              "--kv-transfer-config", cfg]
    try:
        for i in range(2):
            start(f"prefill{i}", 0, common + ["--role", "prefill"])
        for i in range(2):
            start(f"decode{i}", 1, common + ["--role", "decode"])
        for pname, p in procs:
            ph.wait_healthy(ports[pname], p)
        args = ["router", "--log-level", "warn", "--tokenizer", model]
        for i in range(2):
            args += ["--prefill", f"http://{HOST}:{ports[f'prefill{i}']}"]
        for i in range(2):
            args += ["--decode", f"http://{HOST}:{ports[f'decode{i}']}"]
        rtr = start("router", None, args + router_extra)
        ph.wait_healthy(ports["router"], rtr)

        done = {(c, -1): threading.Event() for c in range(a.conversations)}
        for c, t, _ in trace:
            done[(c, t)] = threading.Event()
        for c in range(a.conversations):
            done[(c, -1)].set()
        results = [None] * len(trace)
        errors = []
        lock = threading.Lock()
        nxt = [0]

        def worker():
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(trace):
                    return
                c, t, prompt = trace[i]
                done[(c, t - 1)].wait()
                body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                        "ignore_eos": True}
                try:
                    results[i] = ph.stream(ports["router"], body)
                except Exception as e:  # noqa: BLE001  (reported, the run goes on)
                    errors.append(f"conversation {c} turn {t}: {e}")
                done[(c, t)].set()

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        rp = ports["router"]
        dports = [ports["decode0"], ports["decode1"]]
        d_prompt = sum(metric_sum(p, "vllm:prompt_tokens_total") for p in dports)
        d_cached = sum(metric_sum(p, "kvpush_prompt_tokens_cached_total") for p in dports)
        d_hit_tokens = sum(metric_sum(p, "vllm:prefix_cache_hits_total") for p in dports)
        d_query_tokens = sum(metric_sum(p, "vllm:prefix_cache_queries_total") for p in dports)
        d_requests = [metric_sum(p, "vllm:request_success_total") for p in dports]
        ttft = [r["ttft_ms"] for r in results if r]
        later = [r["ttft_ms"] for (c, t, _), r in zip(trace, results) if r and t > 0]
        return {
            "config": name,
            "router_flags": router_extra,
            "requests": len(trace),
            "errors": errors,
            "wall_s": wall,
            "ttft_p50_ms": ph.pct(ttft, 0.5),
            "ttft_ms": ttft,
            "ttft_later_ms": later,
            "d_prompt_tokens": d_prompt,
            "d_cached_tokens": d_cached,
            "d_token_hit_rate": d_cached / d_prompt if d_prompt else float("nan"),
            "d_prefix_cache_hit_rate": d_hit_tokens / d_query_tokens if d_query_tokens else float("nan"),
            "d_not_needed": sum(metric_sum(p, "kvpush_kv_transfer_not_needed_total") for p in dports),
            "d_requests": d_requests,
            "p_legs_skipped": metric_sum(rp, "kvpush_router_prefill_legs_skipped_total"),
            "router_prefix_hits": _labelled(rp, "kvpush_router_decode_choices_total",
                                            'reason="prefix_hit"'),
            "load_cap_overrides": metric_sum(rp, "kvpush_router_load_cap_overrides_total"),
        }
    finally:
        for _, p in reversed(procs):
            p.terminate()
        for _, p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def _labelled(port, name, label):
    import http.client
    c = http.client.HTTPConnection(HOST, port, timeout=5)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--kvpush", default=os.path.join(here, "..", "build", "apps", "kvpush"))
    ap.add_argument("--model", default=os.path.join(here, "..", "..", "shared", "models",
                                                    "stories260K.gguf"))
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system", type=int, default=64, help="shared system prompt (tokens)")
    ap.add_argument("--user", type=int, default=56, help="user message per turn (tokens)")
    ap.add_argument("--reply", type=int, default=8, help="assistant reply per turn (tokens)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--threshold", type=int, default=128, help="--local-prefill-threshold (tokens)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of every configuration, in rotating order (machine noise falls on all)")
    ap.add_argument("--kv-blocks", type=int, default=2048)
    ap.add_argument("--load-cap", type=float, default=1.25, help="--cache-aware-load-cap")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--configs", default="least-outstanding,least-outstanding+threshold,"
                    "cache-aware,cache-aware+threshold")
    ap.add_argument("--out", default="cache_aware_routing.json")
    a = ap.parse_args()

    kv = os.path.abspath(a.kvpush)
    model = os.path.abspath(a.model)
    trace = make_trace(a)
    lens = [len(p) for _, _, p in trace]
    print(f"trace: {len(trace)} requests, prompt tokens min {min(lens)} max {max(lens)} "
          f"mean {sum(lens) / len(lens):.0f}", flush=True)
    flags = {
        "least-outstanding": [],
        "least-outstanding+threshold": ["--local-prefill-threshold", str(a.threshold)],
        "cache-aware": ["--routing", "cache-aware", "--cache-aware-load-cap", str(a.load_cap)],
        "cache-aware+threshold": ["--routing", "cache-aware", "--cache-aware-load-cap",
                                  str(a.load_cap), "--local-prefill-threshold", str(a.threshold)],
    }
    tmp = tempfile.mkdtemp(prefix="kvpush-cache-aware-")
    names = a.configs.split(",")
    runs = {n: [] for n in names}
    try:
        for rep in range(a.repeat):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                print(f"run {rep + 1}/{a.repeat}: {name} ...", flush=True)
                runs[name].append(run_config(a, kv, model, tmp, f"{name}-{rep}", flags[name], trace))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = []
    for name in names:
        rs = runs[name]
        # Per configuration: TTFT percentiles over every request of every run; the other figures
        # summed (counts) or averaged (rates) over the runs.
        ttft = [x for r in rs for x in r["ttft_ms"]]
        later = [x for r in rs for x in r["ttft_later_ms"]]
        out.append({
            "config": name,
            "router_flags": flags[name],
            "runs": len(rs),
            "requests": sum(r["requests"] for r in rs),
            "errors": [e for r in rs for e in r["errors"]],
            "ttft_p50_ms": ph.pct(ttft, 0.5),
            "ttft_p99_ms": ph.pct(ttft, 0.99),
            "ttft_p50_later_turns_ms": ph.pct(later, 0.5),
            "ttft_p50_per_run_ms": [r["ttft_p50_ms"] for r in rs],
            "d_token_hit_rate": sum(r["d_cached_tokens"] for r in rs) /
            max(1.0, sum(r["d_prompt_tokens"] for r in rs)),
            "d_prefix_cache_hit_rate": sum(r["d_prefix_cache_hit_rate"] for r in rs) / len(rs),
            "d_not_needed": sum(r["d_not_needed"] for r in rs),
            "p_legs_skipped": sum(r["p_legs_skipped"] for r in rs),
            "router_prefix_hits": sum(r["router_prefix_hits"] for r in rs),
            "load_cap_overrides": sum(r["load_cap_overrides"] for r in rs),
            "d_requests": [sum(r["d_requests"][k] for r in rs) for k in range(2)],
        })
    base = next((r for r in out if r["config"] == "least-outstanding"), out[0])
    hdr = (f"{'config':28} {'TTFT p50':>9} {'p99':>8} {'p50 t>1':>8} {'vs LO':>6} "
           f"{'D hit':>6} {'NOT_NEEDED':>10} {'P skipped':>9} {'D reqs':>9} {'errors':>6}")
    print(hdr)
    for r in out:
        r["ttft_p50_vs_least_outstanding"] = r["ttft_p50_ms"] / base["ttft_p50_ms"]
        print(f"{r['config']:28} {r['ttft_p50_ms']:7.2f}ms {r['ttft_p99_ms']:6.2f}ms "
              f"{r['ttft_p50_later_turns_ms']:6.2f}ms {r['ttft_p50_vs_least_outstanding']:6.2f} "
              f"{r['d_token_hit_rate']:6.1%} {r['d_not_needed']:10.0f} {r['p_legs_skipped']:9.0f} "
              f"{'/'.join(str(int(x)) for x in r['d_requests']):>9} {len(r['errors']):6d}")
        print(f"{'':28} per-run p50: " + ", ".join(f"{x:.1f}" for x in r["ttft_p50_per_run_ms"]))
        for e in r["errors"][:5]:
            print("   error:", e)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "results": out}, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
