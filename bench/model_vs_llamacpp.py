#!/usr/bin/env python3
"""kvpush's CPU executor against llama.cpp on the same GGUF files (issue 25).

For each weight type, prompt length and thread count, runs one greedy generation in
kvpush (build/bench/model/kvpush_model_greedy_bench: LlamaExecutor called directly) and in
llama.cpp (bench/llamacpp/greedy.mjs: npm node-llama-cpp@3.22.1, prebuilt CPU build,
getLlama({gpu: false, build: "never"})), alternating the engines (the order flips every rep),
each run in its own process with an untimed warm-up generation first. Reports the median of
--reps runs of

  prefill tok/s = prompt_len / (time until generated token 1)
  decode tok/s  = decode / (time of the next `decode` single-token steps)

and the ratio kvpush / llama.cpp (> 1: kvpush is faster), and compares the greedy tokens
(first position where they differ, and the share of equal positions). The load average
(/proc/loadavg) is printed before and after every configuration.

Models: written once per type with kvpush's generator (`kvpush gen-model --arch llama3 --dim
1024 --layers 8 --heads 16 --kv-heads 4 --hidden-dim 2816 --vocab 32000 --dtype T`, seed 1; with
--dim 2048: 32 heads, 8 KV heads, hidden 5632).
Prompt: deterministic pseudo-random token ids in [300, 32000) (no BOS).

  npm install --prefix bench/llamacpp      # once (node_modules is git-ignored)
  ninja -C build kvpush_model_greedy_bench
  bench/model_vs_llamacpp.py --types q8_0,q4_k --prompts 128 --threads 1,2 --reps 5
Writes --json (default build/bench-results/model-vs-llamacpp.json). Figures: docs/benchmarks/model.md.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --dim picks the model: 1024 (the issue's, ~122M parameters) or 2048 (~420M: 8 layers, 32 x 64
# heads, 8 KV heads, hidden 5632 as TinyLlama's).
SHAPES = {
    1024: ["--arch", "llama3", "--dim", "1024", "--layers", "8", "--heads", "16",
           "--kv-heads", "4", "--hidden-dim", "2816", "--vocab", "32000"],
    2048: ["--arch", "llama3", "--dim", "2048", "--layers", "8", "--heads", "32",
           "--kv-heads", "8", "--hidden-dim", "5632", "--vocab", "32000"],
}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_json(cmd, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        return None, (p.stderr.strip() or p.stdout.strip())[-400:]
    return json.loads(p.stdout.strip().splitlines()[-1]), None


def agreement(a, b):
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), n)
    same = sum(1 for i in range(n) if a[i] == b[i])
    return first, same / n if n else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="f16,q8_0,q4_k,q6_k")
    ap.add_argument("--prompts", default="128")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dim", type=int, default=1024, choices=sorted(SHAPES))
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--kvpush-bench", default="",
                    help="kvpush_model_greedy_bench to run (default: BUILD_DIR's; give a copy "
                         "when rebuilding while the benchmark runs)")
    ap.add_argument("--float-path", action="store_true",
                    help="also run kvpush with --quant-math f32 (the float path) as a third "
                         "engine, 'kvpush-f32'")
    ap.add_argument("--models-dir", default=os.path.join(ROOT, "build", "bench-results", "models"))
    ap.add_argument("--json", default=os.path.join(ROOT, "build", "bench-results",
                                                   "model-vs-llamacpp.json"))
    args = ap.parse_args()

    bench = args.kvpush_bench or os.path.join(args.build_dir, "bench", "model",
                                              "kvpush_model_greedy_bench")
    mjs = os.path.join(ROOT, "bench", "llamacpp", "greedy.mjs")
    if not os.path.exists(os.path.join(ROOT, "bench", "llamacpp", "node_modules")):
        sys.exit("run `npm install --prefix bench/llamacpp` first")
    os.makedirs(args.models_dir, exist_ok=True)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    print(f"load average at start: {loadavg()}  (cores: {os.cpu_count()})")

    results = []
    print(f"{'type':<5} {'prompt':>6} {'thr':>3} | {'prefill tok/s kv':>16} {'llama':>8} "
          f"{'ratio':>6} | {'decode tok/s kv':>15} {'llama':>8} {'ratio':>6} | "
          f"{'greedy agree':>12} | load before/after")
    for dtype in args.types.split(","):
        model = os.path.join(args.models_dir, f"llama3-{args.dim}-{dtype}.gguf")
        if not os.path.exists(model):
            subprocess.run([bench, "--gen", model, "--dtype", dtype] + SHAPES[args.dim], check=True)
        for plen in [int(p) for p in args.prompts.split(",")]:
            rng = random.Random(plen)
            prompt_file = os.path.join(args.models_dir, f"prompt-{plen}.txt")
            with open(prompt_file, "w") as f:
                f.write(" ".join(str(rng.randrange(300, 32000)) for _ in range(plen)) + "\n")
            for thr in [int(t) for t in args.threads.split(",")]:
                row = run_config(bench, mjs, model, prompt_file, dtype, plen, thr, args)
                results.append(row)
                print_row(row)
    with open(args.json, "w") as f:
        json.dump({"shape": SHAPES[args.dim], "decode": args.decode, "reps": args.reps,
                   "results": results}, f, indent=1)
    print(f"load average at end: {loadavg()}; JSON: {args.json}")


def run_config(bench, mjs, model, prompt_file, dtype, plen, thr, args):
    common = ["--model", model, "--prompt-file", prompt_file, "--decode", str(args.decode),
              "--threads", str(thr)]
    cmds = {"kvpush": [bench] + common, "llama.cpp": ["node", mjs] + common}
    if args.float_path:
        cmds["kvpush-f32"] = [bench] + common + ["--quant-math", "f32"]
    runs = {eng: [] for eng in cmds}
    errors = {}
    load_before = loadavg()
    for rep in range(args.reps):
        order = list(cmds) if rep % 2 == 0 else list(reversed(list(cmds)))
        for eng in order:
            if eng in errors:
                continue
            out, err = run_json(cmds[eng])
            if out is None:
                errors[eng] = err
                continue
            runs[eng].append(out)
        time.sleep(0.2)
    row = {"type": dtype, "prompt_len": plen, "threads": thr, "load_before": load_before,
           "load_after": loadavg(), "errors": errors}
    for eng, rs in runs.items():
        if not rs:
            continue
        row[eng] = {
            "prefill_tok_s": statistics.median(plen / r["prefill_s"] for r in rs),
            "decode_tok_s": statistics.median(args.decode / r["decode_s"] for r in rs),
            "runs": [{"prefill_s": r["prefill_s"], "decode_s": r["decode_s"]} for r in rs],
            "tokens": rs[0]["tokens"],
            "tokens_stable": all(r["tokens"] == rs[0]["tokens"] for r in rs),
        }
        if eng.startswith("kvpush"):
            row[eng]["gemm"] = rs[0].get("gemm")
    if "kvpush" in row and "llama.cpp" in row:
        first, share = agreement(row["kvpush"]["tokens"], row["llama.cpp"]["tokens"])
        row["greedy_first_difference"] = first
        row["greedy_equal_share"] = share
    return row


def print_row(r):
    k, l = r.get("kvpush"), r.get("llama.cpp")

    def f(d, key):
        return f"{d[key]:.1f}" if d else "n/a"

    def ratio(key):
        return f"{k[key] / l[key]:.2f}" if k and l else "n/a"

    agree = (f"{r['greedy_first_difference']}/{len(k['tokens'])}"
             if "greedy_first_difference" in r else "n/a")
    print(f"{r['type']:<5} {r['prompt_len']:>6} {r['threads']:>3} | {f(k, 'prefill_tok_s'):>16} "
          f"{f(l, 'prefill_tok_s'):>8} {ratio('prefill_tok_s'):>6} | {f(k, 'decode_tok_s'):>15} "
          f"{f(l, 'decode_tok_s'):>8} {ratio('decode_tok_s'):>6} | {agree:>12} | "
          f"{r['load_before']} / {r['load_after']}", flush=True)
    if "kvpush-f32" in r and l:
        f = r["kvpush-f32"]
        first, _ = agreement(f["tokens"], l["tokens"])
        print(f"      kvpush float path: prefill {f['prefill_tok_s']:.1f} "
              f"({f['prefill_tok_s'] / l['prefill_tok_s']:.2f}x), decode {f['decode_tok_s']:.1f} "
              f"({f['decode_tok_s'] / l['decode_tok_s']:.2f}x), greedy agree {first}/"
              f"{len(f['tokens'])}")
    for eng, err in r["errors"].items():
        print(f"      {eng} failed: {err.splitlines()[-1] if err else '?'}")


if __name__ == "__main__":
    main()
