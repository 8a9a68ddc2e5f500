#!/usr/bin/env python3
"""P/D handoff timeline: where the time of a P/D request goes, push vs pull, phase by phase.

Starts, on loopback, a colocated instance, one prefill (P) and one decode (D) instance and a
router (prefix cache off everywhere: every request moves its whole prompt's KV), warms every mode
up, then sends prompts of random token ids of each --lengths, one request at a time, each prompt
in every mode (colocated, push, pull-vllm, pull-fast) in rotating order. For every request it
records the client's send and first-token times (time.monotonic_ns: CLOCK_MONOTONIC, the clock
the router, P and D stamp their handoff timelines with on this host), the context switches of the
router, P and D (/proc/PID/task/*/status, read between requests) and afterwards joins their
records (GET /debug/handoff_timeline) to it: D's by the request's time window, P's and the
router's (R) by transfer id.

Prints, per prompt length: H = TTFT(mode) - TTFT(colocated) of the same prompt (p50/p90/p99),
then the median timeline of each P/D mode (ms after the client sent the request), the wake-ups
(context switches) of router+P+D and the P<->D messages per request. Writes everything as JSON.

Only the Python standard library is used.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from pd_bench_util import (HOST, add_kvpush_and_model_args, ctx_switches, free_port,
                           handoff_timelines, pct, stop_all, stream_tokens, wait_healthy)
MODES = ["colocated", "push", "pull-vllm", "pull-fast"]
# The phases shown, in the order a request normally passes them; (role, phase) as recorded.
PUSH_PHASES = [("R", "received"), ("R", "prefill_leg_written"), ("R", "decode_leg_written"),
               ("D", "consumer_start"), ("D", "request_sent"), ("P", "producer_start"),
               ("P", "prefill_done"), ("P", "target_attached"), ("P", "first_write_posted"),
               ("P", "kv_ready_posted"), ("D", "kv_arrived"), ("D", "verified"),
               ("D", "load_finished"), ("P", "writes_done"), ("R", "prefill_answered"),
               ("R", "first_output_relayed")]
PULL_PHASES = [("R", "received"), ("R", "prefill_leg_written"), ("P", "producer_start"), ("P", "prefill_done"), ("D", "consumer_start"),
               ("D", "request_sent"), ("P", "pin_answered"), ("D", "pinned_received"),
               ("R", "prefill_answered"), ("R", "decode_leg_written"), ("D", "read_posted"),
               ("D", "kv_arrived"), ("D", "verified"), ("D", "load_finished"),
               ("R", "first_output_relayed")]


def start_cluster(args, tmp):
    model = args.model
    kv = json.dumps({"kv_connector_extra_config": {"backend": args.backend,
                                                   **json.loads(args.kv_extra)}})
    serve = [args.kvpush, "serve", "--model", model, "--no-enable-prefix-caching",
             "--log-level", "warn", "--host", HOST]
    procs, ports = {}, {}
    for name, extra in [("colocated", ["--role", "both"]),
                        ("prefill", ["--role", "prefill", "--kv-transfer-config", kv]),
                        ("decode", ["--role", "decode", "--kv-transfer-config", kv])]:
        ports[name] = free_port()
        log = open(os.path.join(tmp, name + ".log"), "w")
        procs[name] = subprocess.Popen(serve + extra + ["--port", str(ports[name])], stdout=log,
                                       stderr=subprocess.STDOUT)
    for name in ("colocated", "prefill", "decode"):
        wait_healthy(ports[name], procs[name])
    ports["router"] = free_port()
    log = open(os.path.join(tmp, "router.log"), "w")
    procs["router"] = subprocess.Popen(
        [args.kvpush, "router", "--prefill", f"http://{HOST}:{ports['prefill']}",
         "--decode", f"http://{HOST}:{ports['decode']}", "--mode", "push", "--port",
         str(ports["router"]), "--host", HOST, "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(ports["router"], procs["router"])
    return procs, ports


def run_request(ports, pids, mode, prompt, max_tokens):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    port = ports["colocated"] if mode == "colocated" else ports["router"]
    cs0 = sum(ctx_switches(p) for p in pids)
    t0, times, end, tokens = stream_tokens(port, body, None if mode == "colocated" else mode)
    first = times[0]
    cs1 = sum(ctx_switches(p) for p in pids)
    return {"mode": mode, "t0": t0, "first": first, "end": end, "tokens": tokens,
            "ttft_ms": (first - t0) / 1e6, "ctx_switches": cs1 - cs0}


def join(results, p_recs, d_recs, r_recs):
    """Attaches to each P/D result the D record whose consumer_start lies in its window and the P
    and router records of the same transfer id."""
    p_by_tid = {r["transfer_id"]: r for r in p_recs}
    r_by_tid = {r["transfer_id"]: r for r in r_recs}
    d_sorted = sorted(d_recs, key=lambda r: r["t_ns"].get("consumer_start", 0))
    for res in results:
        if res["mode"] == "colocated":
            continue
        for r in d_sorted:
            t = r["t_ns"].get("consumer_start", 0)
            if res["t0"] <= t <= res["end"]:
                res["D"] = r
                res["P"] = p_by_tid.get(r["transfer_id"])
                res["R"] = r_by_tid.get(r["transfer_id"])
                break


def summarize(results, length):
    out = {"length": length, "modes": {}}
    colo = {(r["round"], r["prompt"]): r for r in results if r["mode"] == "colocated"}
    for mode in MODES[1:]:
        rs = [r for r in results if r["mode"] == mode]
        h = [r["ttft_ms"] - colo[(r["round"], r["prompt"])]["ttft_ms"] for r in rs
             if (r["round"], r["prompt"]) in colo]
        phases = PUSH_PHASES if mode == "push" else PULL_PHASES
        tl = {}
        for role, ph in phases:
            v = [(r[role]["t_ns"][ph] - r["t0"]) / 1e6 for r in rs
                 if r.get(role) and ph in r[role]["t_ns"]]
            if v:
                tl[f"{role}.{ph}"] = pct(v, 0.5)
        tl["client.first_token"] = pct([r["ttft_ms"] for r in rs], 0.5)
        msgs = [r["P"]["messages_sent"] + r["P"]["write_notifications"] + r["D"]["messages_sent"]
                for r in rs if r.get("P") and r.get("D")]
        out["modes"][mode] = {
            "n": len(rs), "joined": sum(1 for r in rs if r.get("D")),
            "h_p50": pct(h, 0.5), "h_p90": pct(h, 0.9), "h_p99": pct(h, 0.99),
            "ttft_p50": pct([r["ttft_ms"] for r in rs], 0.5),
            "timeline_ms": tl,
            "ctx_switches_p50": pct([r["ctx_switches"] for r in rs], 0.5),
            "messages_p50": pct(msgs, 0.5) if msgs else None,
            "writes_p50": pct([r["P"]["writes"] for r in rs if r.get("P")], 0.5)
            if mode == "push" else None,
            "tokens_equal": all(r["tokens"] == colo[(r["round"], r["prompt"])]["tokens"]
                                for r in rs if (r["round"], r["prompt"]) in colo),
        }
    cs = [r["ctx_switches"] for r in results if r["mode"] == "colocated"]
    out["colocated"] = {"ttft_p50": pct([r["ttft_ms"] for r in results
                                         if r["mode"] == "colocated"], 0.5),
                        "ctx_switches_p50": pct(cs, 0.5)}
    return out


def print_summary(s):
    print(f"\n== prompt {s['length']} tokens: colocated TTFT p50 {s['colocated']['ttft_p50']:.2f} "
          f"ms, wake-ups {s['colocated']['ctx_switches_p50']:.0f}")
    print(f"{'mode':<10} {'n':>4} {'H p50':>7} {'H p90':>7} {'H p99':>7} {'TTFT p50':>9} "
          f"{'wake-ups':>9} {'msgs':>5} {'WRITEs':>6} tokens")
    for mode, m in s["modes"].items():
        msgs = "-" if m["messages_p50"] is None else f"{m['messages_p50']:.0f}"
        writes = "-" if m["writes_p50"] is None else f"{m['writes_p50']:.0f}"
        print(f"{mode:<10} {m['n']:>4} {m['h_p50']:>7.2f} {m['h_p90']:>7.2f} {m['h_p99']:>7.2f} "
              f"{m['ttft_p50']:>9.2f} {m['ctx_switches_p50']:>9.0f} {msgs:>5} {writes:>6} "
              f"{'same' if m['tokens_equal'] else 'DIFFERENT'}")
    print("median timeline, ms after the client sent the request:")
    for mode, m in s["modes"].items():
        cells = "  ".join(f"{k} {v:.2f}" for k, v in
                          sorted(m["timeline_ms"].items(), key=lambda kv: kv[1]))
        print(f"  {mode:<10} {cells}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_kvpush_and_model_args(ap)
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--lengths", default="8,16,17,24,64,256", help="prompt lengths (tokens)")
    ap.add_argument("--requests", type=int, default=40, help="prompts per length (per mode)")
    ap.add_argument("--warmup", type=int, default=4, help="warm-up requests per mode")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512, help="token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kv-extra", default="{}", help="JSON members added to P's and D's "
                    "kv_connector_extra_config (docs/configuration.md), e.g. a control run's "
                    "'{\"layerwise_min_bytes\": 524288}'")
    ap.add_argument("--out", default="pd_timeline.json")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    ap.add_argument("--raw", action="store_true",
                    help="also write every request's record (client times, joined R/P/D records)")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"pd_timeline: model {args.model} not found", file=sys.stderr)
        return 77
    lengths = [int(x) for x in args.lengths.split(",")]
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="kvpush-timeline-")
    procs, ports = start_cluster(args, tmp)
    pids = [procs[n].pid for n in ("router", "prefill", "decode")]
    try:
        print(f"backend {args.backend}, model {os.path.basename(args.model)}, load average "
              f"{os.getloadavg()}")
        for i in range(args.warmup):
            prompt = [rng.randrange(1, args.vocab) for _ in range(max(lengths))]
            for mode in MODES:
                run_request(ports, pids, mode, prompt, args.max_tokens)
        summaries = []
        raw = []
        for length in lengths:
            results = []
            for i in range(args.requests):
                prompt = [rng.randrange(1, args.vocab) for _ in range(length)]
                for j in range(len(MODES)):
                    mode = MODES[(i + j) % len(MODES)]
                    r = run_request(ports, pids, mode, prompt, args.max_tokens)
                    r.update(round=0, prompt=i)
                    results.append(r)
            join(results, handoff_timelines(ports["prefill"]), handoff_timelines(ports["decode"]),
                 handoff_timelines(ports["router"]))
            s = summarize(results, length)
            if args.raw:
                raw.append({"length": length, "requests": results})
            print_summary(s)
            summaries.append(s)
        print(f"\nload average at the end {os.getloadavg()}")
        with open(args.out, "w") as f:
            doc = {"backend": args.backend, "model": args.model, "summaries": summaries,
                   "loadavg_end": os.getloadavg()}
            if args.raw:
                doc["raw"] = raw
            json.dump(doc, f, indent=1)
    finally:
        stop_all(procs.values())
        if args.keep:
            print(f"logs in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
