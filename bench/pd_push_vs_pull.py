#!/usr/bin/env python3
"""Push vs pull, the whole matrix: handoff overhead H per transport, prompt length and mode, over
several runs, on a quiet machine and with both cores busy.

Runs bench/pd_timeline.py (one cluster per run: colocated, P, D and a router on loopback, modes
interleaved prompt by prompt in rotating order, fresh random prompts, prefix cache off) once per
(load, transport, run), then prints per transport and length:
  - H = TTFT(mode) - TTFT(colocated) of the same prompt, p50 / p90 / p99 over every run's requests
    pooled, for push, pull (vLLM default) and pull (fast);
  - in how many runs push's p50, p90 and p99 were <= both pulls' (the issue's criterion);
  - wake-ups (context switches of router+P+D) and P<->D messages per request, medians;
  - how many P/D answers' tokens differ from colocated's for the same prompt (must be 0).
Writes the pooled figures and every run's summary as JSON (--out), the tables as Markdown
(--markdown FILE), and with --resume DIR keeps every run's raw records there and reuses them.

Load: "busy" runs two CPU-bound processes (one per core of this machine) beside the cluster for
the whole run; "quiet" runs nothing. The load average is printed with every run.

Only the Python standard library is used.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pd_bench_util import pct  # noqa: E402

MODES = ["push", "pull-vllm", "pull-fast"]


def hog(n):
    """Starts n CPU-bound processes; returns them."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_timeline(args, backend, lengths, out):
    cmd = [sys.executable, os.path.join(HERE, "pd_timeline.py"), "--backend", backend,
           "--lengths", lengths, "--requests", str(args.requests), "--raw", "--out", out,
           "--seed", str(args.seed)]
    if args.kvpush:
        cmd += ["--kvpush", args.kvpush]
    if args.model:
        cmd += ["--model", args.model]
    if args.kv_extra:
        cmd += ["--kv-extra", args.kv_extra]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout[-4000:])
        raise RuntimeError(f"pd_timeline.py failed for {backend}")
    with open(out) as f:
        return json.load(f)


def mismatches(doc):
    """(P/D answers, answers whose tokens differ from colocated's for the same prompt)."""
    n = bad = 0
    for r in doc["raw"]:
        colo = {(x["round"], x["prompt"]): x["tokens"] for x in r["requests"]
                if x["mode"] == "colocated"}
        for x in r["requests"]:
            if x["mode"] != "colocated":
                n += 1
                bad += x["tokens"] != colo.get((x["round"], x["prompt"]))
    return n, bad


def run_entry(doc):
    """What the report keeps of one run's raw document (pd_timeline --raw, with the load
    averages this script adds)."""
    return {"loadavg_before": doc.get("loadavg_before"), "loadavg_after": doc.get("loadavg_after"),
            "answers": mismatches(doc), "summaries": doc["summaries"],
            "h": {str(r["length"]): h_values(r) for r in doc["raw"]}}


def h_values(raw_len):
    """{mode: [H ms]} of one length's raw requests (pd_timeline --raw)."""
    rs = raw_len["requests"]
    colo = {(r["round"], r["prompt"]): r["ttft_ms"] for r in rs if r["mode"] == "colocated"}
    out = {m: [] for m in MODES}
    for r in rs:
        key = (r["round"], r["prompt"])
        if r["mode"] in out and key in colo:
            out[r["mode"]].append(r["ttft_ms"] - colo[key])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvpush", default=None, help="kvpush binary (pd_timeline.py's default)")
    ap.add_argument("--model", default=None, help="model (pd_timeline.py's default: stories260K)")
    ap.add_argument("--backends", default="ucx:tcp,ucx:shm,libfabric:tcp")
    ap.add_argument("--lengths", default="8,16,17,24,64,256,1024,2000")
    ap.add_argument("--requests", type=int, default=40, help="prompts per length and run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--loads", default="quiet,busy", help="quiet and/or busy")
    ap.add_argument("--seed", type=int, default=1, help="run k uses seed + k")
    ap.add_argument("--kv-extra", default=None, help="pd_timeline.py --kv-extra (a control "
                    "run with another kv_connector_extra_config; use its own --resume DIR)")
    ap.add_argument("--out", default="pd_push_vs_pull.json")
    ap.add_argument("--markdown", default=None, metavar="FILE",
                    help="also write every table as Markdown (docs/benchmarks/pd.md)")
    ap.add_argument("--resume", default=None, metavar="DIR",
                    help="keep every run's raw JSON in DIR and reuse a run already there (same "
                         "load, transport and run number) instead of measuring it again; the "
                         "runs of an interrupted matrix are not lost")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    tmp = args.resume or tempfile.mkdtemp(prefix="kvpush-pvp-")
    os.makedirs(tmp, exist_ok=True)
    results = {}
    md = []
    base_seed = args.seed
    for load in args.loads.split(","):
        for backend in args.backends.split(","):
            runs = []
            for k in range(args.runs):
                raw_path = os.path.join(tmp, f"{load}-{backend}-{k}.json")
                if args.resume and os.path.exists(raw_path):
                    with open(raw_path) as f:
                        doc = json.load(f)
                    print(f"[{load} {backend} run {k + 1}/{args.runs}] reused {raw_path}",
                          flush=True)
                    runs.append(run_entry(doc))
                    continue
                hogs = hog(os.cpu_count() or 2) if load == "busy" else []
                try:
                    if hogs:
                        time.sleep(1.0)
                    la0 = os.getloadavg()
                    args.seed = base_seed + k
                    t0 = time.time()
                    doc = run_timeline(args, backend, args.lengths, raw_path + ".part")
                    la1 = os.getloadavg()
                    doc["loadavg_before"], doc["loadavg_after"] = la0, la1
                    with open(raw_path, "w") as f:
                        json.dump(doc, f)
                    os.remove(raw_path + ".part")
                finally:
                    for h in hogs:
                        h.kill()
                print(f"[{load} {backend} run {k + 1}/{args.runs}] {time.time() - t0:.0f} s, "
                      f"load average before {la0[0]:.2f} after {la1[0]:.2f}", flush=True)
                runs.append(run_entry(doc))
            results[f"{load} {backend}"] = runs
            report(load, backend, runs, lengths)
            md.append(markdown(load, backend, runs, lengths))
    with open(args.out, "w") as f:
        json.dump({"lengths": lengths, "requests": args.requests, "runs": args.runs,
                   "results": results}, f, indent=1)
    print(f"\nwrote {args.out}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(md))
        print(f"wrote {args.markdown}")
    return 0


def rows(runs, lengths):
    """Per length: pooled H percentiles per mode, runs won, pooled verdicts, wake-ups, messages."""
    out = []
    for n in lengths:
        pooled = {m: [] for m in MODES}
        won = [0, 0, 0]
        for run in runs:
            h = run["h"][str(n)]
            for m in MODES:
                pooled[m] += h[m]
            for i, q in enumerate(QS):
                if pct(h["push"], q) <= min(pct(h["pull-vllm"], q), pct(h["pull-fast"], q)):
                    won[i] += 1
        h = {m: [pct(pooled[m], q) for q in QS] for m in MODES}
        verdict = [h["push"][i] <= min(h["pull-vllm"][i], h["pull-fast"][i]) for i in range(3)]
        wake, msgs = [], []
        for m in MODES:
            w = [s["modes"][m]["ctx_switches_p50"] for run in runs for s in run["summaries"]
                 if s["length"] == n]
            g = [s["modes"][m]["messages_p50"] for run in runs for s in run["summaries"]
                 if s["length"] == n and s["modes"][m]["messages_p50"] is not None]
            wake.append(f"{pct(w, 0.5):.0f}" if w else "-")
            msgs.append(f"{pct(g, 0.5):.0f}" if g else "-")
        out.append({"length": n, "h": h, "won": won, "verdict": verdict, "wake": wake,
                    "msgs": msgs})
    return out


QS = (0.5, 0.9, 0.99)


def report(load, backend, runs, lengths):
    print(f"\n== {backend}, {load}: H ms (p50 / p90 / p99, {len(runs)} runs x "
          f"{len(runs[0]['h'][str(lengths[0])]['push'])} requests pooled); push <= both pulls "
          f"in how many runs (p50/p90/p99); wake-ups and P<->D messages per request (medians)")
    print(f"{'tokens':>6}  {'push':>20}  {'pull-vllm':>20}  {'pull-fast':>20}  "
          f"{'push won':>9}  {'wake-ups p/v/f':>15}  {'msgs p/v/f':>10}")
    n = sum(run["answers"][0] for run in runs)
    bad = sum(run["answers"][1] for run in runs)
    print(f"tokens: {n} P/D answers, {bad} differ from colocated's")
    for r in rows(runs, lengths):
        cells = ["{:>6.2f} {:>6.2f} {:>6.2f}".format(*r["h"][m]) for m in MODES]
        won_text = "/".join(str(w) for w in r["won"])
        print(f"{r['length']:>6}  {cells[0]:>20}  {cells[1]:>20}  {cells[2]:>20}  "
              f"{won_text:>9}  {'/'.join(r['wake']):>15}  {'/'.join(r['msgs']):>10}", flush=True)


def markdown(load, backend, runs, lengths):
    """The same figures as one Markdown table (docs/benchmarks/pd.md); a pooled push figure
    above a pull's is in italics."""
    la = [run["loadavg_after"][0] for run in runs if run.get("loadavg_after")]
    lines = [f"**{backend}, {load}** ({len(runs)} runs x "
             f"{len(runs[0]['h'][str(lengths[0])]['push'])} prompts per length; load average "
             f"after each run: {', '.join(f'{x:.2f}' for x in la)}; "
             f"{sum(run['answers'][1] for run in runs)} of "
             f"{sum(run['answers'][0] for run in runs)} P/D answers differ from colocated's "
             f"tokens)", "",
             "| prompt | H push p50 / p90 / p99 | H pull-vllm | H pull-fast | push <= both, "
             "runs (p50/p90/p99) | wake-ups push / vllm / fast | P↔D messages push / pull |",
             "| ---: | --- | --- | --- | --- | --- | --- |"]
    for r in rows(runs, lengths):
        push = " / ".join(f"{v:.2f}" if ok else f"*{v:.2f}*"
                          for v, ok in zip(r["h"]["push"], r["verdict"]))
        cells = [" / ".join(f"{v:.2f}" for v in r["h"][m]) for m in MODES[1:]]
        msgs = f"{r['msgs'][0]} / {r['msgs'][1]}"
        lines.append(f"| {r['length']} | {push} | {cells[0]} | {cells[1]} | "
                     f"{'/'.join(str(w) for w in r['won'])} | {' / '.join(r['wake'])} | {msgs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
