#!/usr/bin/env python3
"""Long-context P/D handoff (issue 27; docs/benchmarks/pd.md, *Long contexts*): prompts of 16k to
128k tokens answered colocated (directly, and behind a router of its own), in push, pull (vLLM
default) and pull (fast), on the sim executor (docs/sim.md) with a model preset's real shapes and a
fraction of its KV bytes.

H = TTFT(mode) - TTFT(colocated, direct) also counts the front door: the router receives, parses
and forwards the prompt (~800 KB of JSON at 131,000 ids) before P parses it again, which a client
talking to one instance never pays. HR = TTFT(mode) - TTFT(colocated behind a router) compares
like with like (the same front door, one instance behind it): what disaggregation adds. Both mix
in the prefill's run-to-run spread, and on this 2-core machine P's connector work (hashing,
posting) shares the core of P's engine; Hc, as in pd_handoff.py, takes each request's client TTFT
minus the TTFT the computing engine (P, or the colocated instance) recorded for itself, minus the
same for colocated: the handoff alone; HcR the same against colocated behind its router: the
handoff without the front door's share. Each length runs --repeat rounds (a fresh request of every
mode per round, in rotating order); the table gives medians, the JSON every round.

Starts on loopback, per model: a colocated instance and a router in front of it, one prefill (P),
one decode (D) and a router,
all `kvpush serve --executor sim --sim-model M --sim-kv-scale S`, prefix cache off, KV pools sized
for the longest prompt. Requests go one at a time; for each prompt every mode runs in turn. For
every P/D request it checks, from D's and P's /metrics before and after:

- the tokens equal colocated's;
- D's kvpush_prompt_tokens_transferred_total grew by the whole prompt (pull-vllm: all but the
  last token, which D computes to sample the first token, as vLLM does) and nothing was
  recomputed (kvpush_kv_load_recomputes_total unchanged) and kvpush_kv_transfer_blocks_verified_total by
  its blocks;
- the KV bytes moved (P's bytes written for push, D's READ count for pull) and the control
  messages and bytes of P and D together.

At the end both pools must be whole (no block used or quarantined). Reports TTFT per mode, H, HR
and Hc, the push timeline of the last round, prints a table and the load average, writes JSON.
Any check that fails is printed and makes the exit status 1.

    python3 bench/pd_long_context.py                       # both models, 16k..128k
    python3 bench/pd_long_context.py --models llama-3.1-8b --lengths 16384 --kv-scale 0.0625

Only the Python standard library is used.
"""
import argparse
import json
import os
import random
import sys
import tempfile
import time

from pd_bench_util import (HOST, TTFT_SUM, add_kvpush_and_model_args, delta, handoff_timelines,
                           metrics, pct, start_kvpush, stop_all, stream_tokens, wait_healthy)

# Preset shapes (src/model/sim_model.cc): layers, KV heads, head dim, vocab, context.
PRESETS = {
    "llama-3.1-8b": (32, 8, 128, 128256, 131072),
    "qwen3-32b": (64, 8, 128, 151936, 40960),
    "llama-3.1-70b": (80, 8, 128, 128256, 131072),
}
# (name, x-kvpush-mode header); colocated-router is the colocated instance behind a router of its
# own (`kvpush router --colocated`): the same front door as P/D, one instance behind it.
MODES = [("colocated", None), ("colocated-router", None), ("push", "push"),
         ("pull-vllm", "pull-vllm"), ("pull-fast", "pull-fast")]
PD_MODES = [m for m in MODES if m[1]]
ENTRY = {"colocated": "colocated", "colocated-router": "router-colocated", "push": "router",
         "pull-vllm": "router", "pull-fast": "router"}  # the port each mode's request goes to


def summarize(rs):
    """Medians over the rounds of one mode; counters and timelines from the last round."""
    out = dict(rs[-1])
    for k in ("ttft_ms", "h_ms", "hr_ms", "hc_ms", "hcr_ms", "overhead_ms"):
        if k in rs[0]:
            out[k] = pct([r[k] for r in rs], 0.5)
            out[k + "_all"] = [round(r[k], 1) for r in rs]
    return out


def one_request(a, ports, body, name, m, row, model, failures):
    """One request of mode `name`, checked (P/D: KV transferred, verified, nothing recomputed)."""
    length = row["tokens"]
    eng = ports["prefill"] if m else ports["colocated"]  # the instance that computes the prompt
    p0, d0, e0 = metrics(ports["prefill"]), metrics(ports["decode"]), metrics(eng)
    t0, times, _, toks = stream_tokens(ports[ENTRY[name]], body, m, timeout=1800)
    p1, d1, e1 = metrics(ports["prefill"]), metrics(ports["decode"]), metrics(eng)
    r = {"ttft_ms": (times[0] - t0) / 1e6, "tokens": toks,
         "engine_ttft_ms": delta(e0, e1, TTFT_SUM) * 1e3}
    r["overhead_ms"] = r["ttft_ms"] - r["engine_ttft_ms"]
    if m is None:
        return r
    r["transferred"] = int(delta(d0, d1, "kvpush_prompt_tokens_transferred_total"))
    r["recomputes"] = int(delta(d0, d1, "kvpush_kv_load_recomputes_total"))
    r["verified_blocks"] = int(delta(d0, d1, "kvpush_kv_transfer_blocks_verified_total"))
    r["bytes_written"] = int(delta(p0, p1, "kvpush_kv_transfer_bytes_written_total"))
    r["control_messages"] = int(delta(p0, p1, "kvpush_kv_transfer_control_messages_sent_total") +
                                delta(d0, d1, "kvpush_kv_transfer_control_messages_sent_total"))
    r["control_bytes"] = int(delta(p0, p1, "kvpush_kv_transfer_control_bytes_sent_total") +
                             delta(d0, d1, "kvpush_kv_transfer_control_bytes_sent_total"))
    r["descriptors"] = int(delta(p0, p1, "kvpush_kv_transfer_descriptors_total") +
                           delta(d0, d1, "kvpush_kv_transfer_descriptors_total"))
    if name == "push":
        r["timeline_ms"] = push_timeline(ports, t0, a.all_phases)
    # The vLLM profile, like vLLM's NIXL connector, loads all but the last prompt token and
    # computes that one on D to sample the first token.
    want = length - 1 if m == "pull-vllm" else length
    checks = {
        f"transferred {r['transferred']} == {want}": r["transferred"] == want,
        f"recomputes {r['recomputes']} == 0": r["recomputes"] == 0,
        f"verified {r['verified_blocks']} == {row['blocks']}": r["verified_blocks"] == row["blocks"],
    }
    for what, ok in checks.items():
        if not ok:
            failures.append(f"{model} {length} {name}: {what}")
    return r


# Phases of a push request's timeline (docs/pd_protocol.md §7), in the order they happen.
PUSH_PHASES = [("R", "received"), ("R", "prefill_leg_written"), ("R", "decode_leg_written"),
               ("D", "consumer_start"), ("P", "producer_start"), ("P", "target_attached"),
               ("P", "first_write_posted"), ("P", "prefill_done"), ("P", "kv_ready_posted"),
               ("D", "kv_arrived"), ("D", "verified"), ("D", "load_finished"),
               ("R", "first_output_relayed")]


def push_timeline(ports, t0, a_all=False):
    """The newest push transfer's timeline: ms after the client sent the request (t0, the same
    CLOCK_MONOTONIC the router, P and D stamp with on this host), per (role, phase)."""
    recs = {role: {rec["transfer_id"]: rec for rec in handoff_timelines(ports[name], limit=16)}
            for role, name in (("R", "router"), ("P", "prefill"), ("D", "decode"))}
    pushes = [r for r in recs["R"].values() if r.get("mode") == "push"]
    if not pushes:
        return {}
    tid = max(pushes, key=lambda r: r["t_ns"].get("received", 0))["transfer_id"]
    out = {}
    for role in ("R", "P", "D"):
        for ph, ns in recs[role].get(tid, {}).get("t_ns", {}).items():
            if ns and (a_all or (role, ph) in PUSH_PHASES):
                out[f"{role}.{ph}"] = round((ns - t0) / 1e6, 2)
    return out


def run_model(a, model, failures):
    layers, kv_heads, head_dim, vocab, context = PRESETS[model]
    # bf16 at --sim-kv-scale, which scales the head dimension with a floor of 4
    # (src/model/sim_executor.cc): below 1/32 the KV stays at 1/32 of the model's.
    kv_bytes_token = layers * 2 * kv_heads * max(4, round(head_dim * a.kv_scale)) * 2
    lengths = [n for n in (int(x) for x in a.lengths.split(",")) if n + a.max_tokens <= context]
    if not lengths:
        return None
    longest = max(lengths) + a.max_tokens
    blocks = -(-longest // 16) + 64
    pool_bytes = int(blocks * 16 * kv_bytes_token)
    tmp = tempfile.mkdtemp(prefix="kvpush-long-")
    procs, ports = [], {}
    cfg = json.dumps({"kv_connector_extra_config": {
        "backend": a.backend, "watchdog_ms": 600000, "lease_ms": 900000,
        "stall_ms": a.stall_ms, **json.loads(a.kv_extra)}})
    common = ["serve", "--executor", "sim", "--sim-model", model, "--sim-hw", a.sim_hw,
              "--sim-kv-scale", str(a.kv_scale), "--kv-cache-memory", str(pool_bytes),
              "--max-model-len", str(longest), "--no-enable-prefix-caching", "--log-level", "warn",
              "--max-num-batched-tokens", str(a.max_num_batched_tokens)]

    def start(name, cpu, args):
        return start_kvpush(a.kvpush, tmp, procs, ports, name, cpu, args)

    try:
        for name, cpu, extra in (("colocated", 0, ["--role", "both"]),
                                 ("prefill", a.prefill_cpus, ["--role", "prefill", "--kv-transfer-config", cfg]),
                                 ("decode", 1, ["--role", "decode", "--kv-transfer-config", cfg])):
            proc = start(name, cpu, common + extra)
            wait_healthy(ports[name], proc, 300)
        rtr = start("router", None, ["router", "--prefill", f"http://{HOST}:{ports['prefill']}",
                                     "--decode", f"http://{HOST}:{ports['decode']}",
                                     "--log-level", "warn"])
        wait_healthy(ports["router"], rtr)
        rc = start("router-colocated", None, ["router", "--colocated",
                                              f"http://{HOST}:{ports['colocated']}",
                                              "--log-level", "warn"])
        wait_healthy(ports["router-colocated"], rc)
        rng = random.Random(27)
        warm = {"prompt": [rng.randrange(3, vocab) for _ in range(600)], "max_tokens": 2,
                "temperature": 0, "ignore_eos": True}
        for name, m in MODES:
            stream_tokens(ports[ENTRY[name]], warm, m)
        rows = []
        for length in lengths:
            prompt = [rng.randrange(3, vocab) for _ in range(length)]
            body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                    "ignore_eos": True}
            row = {"tokens": length, "blocks": -(-length // 16),
                   "kv_bytes": int(length * kv_bytes_token), "rounds": []}
            for rnd in range(a.repeat):
                # Rotating order: no mode always runs first (or right after another's prefill).
                order = MODES[rnd % len(MODES):] + MODES[:rnd % len(MODES)]
                got = {name: one_request(a, ports, body, name, m, row, model, failures)
                       for name, m in order}
                ref = got["colocated"]["tokens"]
                for name, m in MODES[1:]:
                    r = got[name]
                    if r["tokens"] != ref:
                        failures.append(f"{model} {length} {name}: tokens differ from colocated")
                    r["same_tokens"] = r["tokens"] == ref
                    r["h_ms"] = r["ttft_ms"] - got["colocated"]["ttft_ms"]
                    r["hr_ms"] = r["ttft_ms"] - got["colocated-router"]["ttft_ms"]
                    r["hc_ms"] = r["overhead_ms"] - got["colocated"]["overhead_ms"]
                    r["hcr_ms"] = r["overhead_ms"] - got["colocated-router"]["overhead_ms"]
                for r in got.values():
                    r.pop("tokens")
                row["rounds"].append(got)
            row["modes"] = {name: summarize([g[name] for g in row["rounds"]])
                            for name, _ in MODES}
            rows.append(row)
            print(f"  {model} {length:>6} tokens: " + "  ".join(
                f"{n} {row['modes'][n]['ttft_ms']:.0f}" for n, _ in MODES) + " ms", flush=True)
        time.sleep(1.0)
        pools = {}
        for name in ("prefill", "decode"):
            mt = metrics(ports[name])
            pools[name] = {"used": mt.get("kvpush_kv_blocks_used", -1),
                           "quarantined": mt.get("kvpush_kv_blocks_quarantined", -1)}
            if pools[name]["used"] != 0 or pools[name]["quarantined"] != 0:
                failures.append(f"{model}: {name}'s pool not whole: {pools[name]}")
        return {"model": model, "kv_scale": a.kv_scale, "pool_bytes": pool_bytes,
                "pool_blocks": blocks, "rows": rows, "pools": pools}
    finally:
        stop_all(procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_kvpush_and_model_args(ap)
    ap.add_argument("--models", default="llama-3.1-8b,qwen3-32b")
    ap.add_argument("--lengths", default="16384,32768,65536,131072",
                    help="prompt tokens; those beyond a model's context are skipped")
    ap.add_argument("--kv-scale", type=float, default=0.0625, help="--sim-kv-scale")
    ap.add_argument("--sim-hw", default="h200")
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--stall-ms", type=int, default=5000,
                    help="stall_ms of P and D (the default of kvpush; see docs/benchmarks/pd.md "
                         "*Long contexts* for what a 4 GiB push needs)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="the prefill chunk (token budget of a step) of every instance")
    ap.add_argument("--prefill-cpus", default="0",
                    help="taskset CPU list of the prefill instance (colocated: 0, decode: 1)")
    ap.add_argument("--kv-extra", default="{}",
                    help="more kv_connector_extra_config members for P and D, as JSON (e.g. "
                         "'{\"layerwise\": false}' to compare push without per-layer WRITEs)")
    ap.add_argument("--all-phases", action="store_true",
                    help="print every phase of the push timelines, not only the main ones")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds per prompt length (each a fresh request of every mode, in "
                         "rotating order); the table gives medians")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "pd_long_context.json"))
    a = ap.parse_args()
    failures, results = [], []
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    for model in a.models.split(","):
        r = run_model(a, model, failures)
        if r:
            results.append(r)
    print()
    print("| model | prompt tokens | blocks | KV MiB | TTFT colocated | colocated via router | push "
          "| pull-vllm | pull-fast | H push | H pull-vllm | H pull-fast | HR push | HR pull-vllm "
          "| HR pull-fast | Hc push | HcR push | HcR pull-vllm | HcR pull-fast | ctl msgs push/pull "
          "| ctl bytes push/pull |")
    print("| --- |" + " ---: |" * 20)
    for r in results:
        for row in r["rows"]:
            m = row["modes"]
            print(f"| {r['model']} | {row['tokens']} | {row['blocks']} | "
                  f"{row['kv_bytes'] / 2**20:.0f} | " +
                  " | ".join(f"{m[n]['ttft_ms']:.0f}" for n, _ in MODES) + " | " +
                  " | ".join(f"{m[n]['h_ms']:+.0f}" for n, _ in PD_MODES) + " | " +
                  " | ".join(f"{m[n]['hr_ms']:+.1f}" for n, _ in PD_MODES) +
                  f" | {m['push']['hc_ms']:+.1f} | " +
                  " | ".join(f"{m[n]['hcr_ms']:+.1f}" for n, _ in PD_MODES) +
                  f" | {m['push']['control_messages']}/{m['pull-fast']['control_messages']}"
                  f" | {m['push']['control_bytes']}/{m['pull-fast']['control_bytes']} |")
    print("\npush timelines, ms after the client sent the request (R router, P, D):")
    for r in results:
        for row in r["rows"]:
            tl = row["modes"]["push"].get("timeline_ms", {})
            cells = "  ".join(f"{k} {v:.1f}" for k, v in sorted(tl.items(), key=lambda kv: kv[1]))
            print(f"  {r['model']} {row['tokens']}: {cells}  "
                  f"client.first_token {row['rounds'][-1]['push']['ttft_ms']:.1f}")
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with open(a.out, "w") as f:
        json.dump({"backend": a.backend, "kv_scale": a.kv_scale, "results": results,
                   "failures": failures}, f, indent=1)
    print(f"wrote {a.out}")
    for f_ in failures:
        print("FAILED:", f_)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
