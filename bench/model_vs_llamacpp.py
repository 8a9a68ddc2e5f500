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

With --serve, a third engine 'kvpush-serve' is `kvpush serve MODEL --threads N
--no-enable-prefix-caching` (one server per configuration, one untimed request first) answering
one streamed /v1/completions request at a time (prompt as token ids, temperature 0, ignore_eos,
max_tokens decode + 1, return_token_ids), timed by the client: prefill = time to the first
streamed token, decode = the rest. Its figures include HTTP, the engine loop and detokenization.

Models: written once per type with kvpush's generator (`kvpush gen-model --arch llama3 (or --arch) --dim
1024 --layers 8 --heads 16 --kv-heads 4 --hidden-dim 2816 --vocab 32000 --dtype T`, seed 1; with
--dim 2048: 32 heads, 8 KV heads, hidden 5632).
Prompt: deterministic pseudo-random token ids in [300, 32000) (no BOS).

  npm install --prefix bench/llamacpp      # once (node_modules is git-ignored)
  ninja -C build kvpush_model_greedy_bench
  bench/model_vs_llamacpp.py --types q8_0,q4_k --prompts 128 --threads 1,2 --reps 5
Writes --json (default build/bench-results/model-vs-llamacpp.json). Figures: docs/benchmarks/model.md.
"""
import argparse
import http.client
import json
import os
import random
import socket
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
    ap.add_argument("--arch", default="llama3", choices=["llama3", "qwen2", "qwen3"],
                    help="the architecture written (qwen2: Q/K/V biases; qwen3: q/k norms); "
                         "the shape is --dim's")
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--kvpush-bench", default="",
                    help="kvpush_model_greedy_bench to run (default: BUILD_DIR's; give a copy "
                         "when rebuilding while the benchmark runs)")
    ap.add_argument("--float-path", action="store_true",
                    help="also run kvpush with --quant-math f32 (the float path) as a third "
                         "engine, 'kvpush-f32'")
    ap.add_argument("--serve", action="store_true",
                    help="also time `kvpush serve` end to end as a third engine, 'kvpush-serve'")
    ap.add_argument("--kvpush", default="",
                    help="the kvpush binary for --serve (default: BUILD_DIR/apps/kvpush)")
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
        model = os.path.join(args.models_dir, f"{args.arch}-{args.dim}-{dtype}.gguf")
        if not os.path.exists(model):
            shape = [args.arch if a == "llama3" else a for a in SHAPES[args.dim]]
            subprocess.run([bench, "--gen", model, "--dtype", dtype] + shape, check=True)
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
        json.dump({"arch": args.arch, "shape": SHAPES[args.dim], "decode": args.decode, "reps": args.reps,
                   "results": results}, f, indent=1)
    print(f"load average at end: {loadavg()}; JSON: {args.json}")


class Server:
    """`kvpush serve` on a free loopback port, one streamed greedy request at a time."""

    def __init__(self, kvpush, model, threads):
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            self.port = sk.getsockname()[1]
        self.proc = subprocess.Popen(
            [kvpush, "serve", model, "--port", str(self.port), "--threads", str(threads),
             "--no-enable-prefix-caching"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("kvpush serve did not become healthy in 60 s")

    def generate(self, ids, decode):
        """One request; returns {prefill_s, decode_s, tokens} like the greedy benches."""
        body = json.dumps({"prompt": ids, "max_tokens": decode + 1, "temperature": 0,
                           "ignore_eos": True, "stream": True, "return_token_ids": True})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        tokens, t_first, t_last = [], None, None
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            got = json.loads(line[6:])["choices"][0].get("token_ids") or []
            if got:
                t_last = time.perf_counter()
                t_first = t_first or t_last
                tokens += got
        c.close()
        return {"prefill_s": t_first - t0, "decode_s": t_last - t_first, "tokens": tokens}

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_config(bench, mjs, model, prompt_file, dtype, plen, thr, args):
    common = ["--model", model, "--prompt-file", prompt_file, "--decode", str(args.decode),
              "--threads", str(thr)]
    cmds = {"kvpush": [bench] + common, "llama.cpp": ["node", mjs] + common}
    if args.float_path:
        cmds["kvpush-f32"] = [bench] + common + ["--quant-math", "f32"]
    server = None
    if args.serve:
        with open(prompt_file) as f:
            ids = [int(t) for t in f.read().split()]
        server = Server(args.kvpush or os.path.join(args.build_dir, "apps", "kvpush"), model, thr)
        server.generate(ids, args.decode)  # untimed, as the others' warm-up generation
        cmds["kvpush-serve"] = lambda: server.generate(ids, args.decode)
    runs = {eng: [] for eng in cmds}
    errors = {}
    load_before = loadavg()
    for rep in range(args.reps):
        order = list(cmds) if rep % 2 == 0 else list(reversed(list(cmds)))
        for eng in order:
            if eng in errors:
                continue
            if callable(cmds[eng]):
                try:
                    out, err = cmds[eng](), None
                except (OSError, RuntimeError, ValueError) as e:
                    out, err = None, str(e)
            else:
                out, err = run_json(cmds[eng])
            if out is None:
                errors[eng] = err
                continue
            runs[eng].append(out)
        time.sleep(0.2)
    if server:
        server.close()
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
    if "kvpush-serve" in r and l:
        v = r["kvpush-serve"]
        same = "same tokens" if k and v["tokens"] == k["tokens"] else "TOKENS DIFFER"
        print(f"      kvpush serve: prefill {v['prefill_tok_s']:.1f} "
              f"({v['prefill_tok_s'] / l['prefill_tok_s']:.2f}x), decode {v['decode_tok_s']:.1f} "
              f"({v['decode_tok_s'] / l['decode_tok_s']:.2f}x), {same} as the executor's")
    for eng, err in r["errors"].items():
        print(f"      {eng} failed: {err.splitlines()[-1] if err else '?'}")


if __name__ == "__main__":
    main()
