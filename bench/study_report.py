"""Turns bench/study.py's points into docs/benchmarks/study.md, PNG plots and results.json.

A point is one `kvpush bench` run: (part, x = request rate or prompt length, mode) with vLLM's
metric keys (median_ttft_ms, p99_ttft_ms, ...), the generated texts per prompt, the counter deltas
of every instance and whether the pools were back to their full free count afterwards.
"""
import hashlib
import json
import os

MODE_ORDER = ["push", "pull-vllm", "pull-fast", "colocated"]
PART_TITLES = {
    "base": "Base: ~2k-token prompts, 128-token outputs, request-rate sweep",
    "long": "(d) 8k-token prompts",
    "frag": "(a) Fragmented KV pools (`--kv-block-allocation scattered`)",
    "hit-pwarm": "(b) 100% prefix hits on D, P's prefix cache warm too",
    "hit-pcold": "(b') 100% prefix hits on D, P without a prefix cache",
    "link": "(c) Rate-limited P-D link (`tc tbf`, network namespaces, ucx:tcp)",
    "short": "Short prompts one at a time (crossover), 16 output tokens",
}
NUM_LAYERS = 64  # Qwen3-32B


def fmt(v, nd=1):
    return "–" if v is None else f"{v:.{nd}f}"


def groups(points, part):
    xs = []
    for p in points:
        if p["part"] == part and p["x"] not in xs:
            xs.append(p["x"])
    return [(x, {p["mode"]: p for p in points if p["part"] == part and p["x"] == x}) for x in xs]


def texts(p):
    """Per-prompt generated texts, or their hashes for points read back from results.json."""
    return p["texts"] if "texts" in p else p["text_sha1"]


def token_check(points):
    """Per (part, x, seed): prompts whose generated text differs between modes."""
    compared = mismatched = 0
    bad = []
    keys = {(p["part"], p["x"], p["seed"]) for p in points}
    for key in sorted(keys, key=str):
        same = [p for p in points if (p["part"], p["x"], p["seed"]) == key]
        if len(same) < 2:
            continue
        ref = same[0]
        for other in same[1:]:
            for i, (a, b) in enumerate(zip(texts(ref), texts(other))):
                compared += 1
                if a != b:
                    mismatched += 1
                    bad.append(f"{key} prompt {i}: {ref['mode']} vs {other['mode']}")
    return compared, mismatched, bad[:10]


def counter_sum(points, name, inst=None):
    return sum(v.get(name, 0) for p in points for i, v in p["counters"].items()
               if inst is None or i == inst)


def per_request(p, inst, name):
    n = p["completed"] or 1
    return p["counters"].get(inst, {}).get(name, 0) / n


def table(points, part):
    xlabel = "prompt tokens" if part == "short" else "rate (req/s)"
    rows = [f"| {xlabel} | mode | ok | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | "
            "E2EL p50 | out tok/s | TTFT p50 vs push |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for x, by_mode in groups(points, part):
        push = by_mode.get("push")
        for mode in MODE_ORDER:
            p = by_mode.get(mode)
            if not p:
                continue
            ratio = (p["median_ttft_ms"] / push["median_ttft_ms"]
                     if push and push["median_ttft_ms"] else None)
            rows.append(
                f"| {x} | {mode} | {p['completed']}/{p['num_prompts']} | {fmt(p['median_ttft_ms'])} | "
                f"{fmt(p['p99_ttft_ms'])} | {fmt(p['median_tpot_ms'], 2)} | {fmt(p['p99_tpot_ms'], 2)} | "
                f"{fmt(p['median_itl_ms'], 2)} | {fmt(p['median_e2el_ms'], 0)} | "
                f"{fmt(p['output_throughput'], 0)} | {fmt(ratio, 2)}x |")
    return "\n".join(rows)


def descriptor_table(points):
    rows = ["| part | rate | mode | descriptors / request | backend ops / request |",
            "| --- | ---: | --- | ---: | ---: |"]
    for part in ("base", "frag"):
        for x, by_mode in groups(points, part):
            for mode in ("push", "pull-vllm", "pull-fast"):
                p = by_mode.get(mode)
                if not p:
                    continue
                inst = "prefill" if mode == "push" else "decode"
                rows.append(f"| {part} | {x} | {mode} | "
                            f"{per_request(p, inst, 'kvpush_kv_transfer_descriptors_total'):,.0f} | "
                            f"{per_request(p, inst, 'kvpush_kv_transfer_ops_total'):,.0f} |")
    return "\n".join(rows)


def engine_ttft(p, *insts):
    """Mean TTFT (ms) the computing engine recorded for itself over a point (its /metrics
    histogram), pooled over `insts`; None without samples."""
    s = sum(p["counters"].get(i, {}).get("vllm:time_to_first_token_seconds_sum", 0) for i in insts)
    n = sum(p["counters"].get(i, {}).get("vllm:time_to_first_token_seconds_count", 0) for i in insts)
    return s / n * 1e3 if n else None


def targets(points):
    out = []

    def ratio_line(part, label, goal):
        for x, by_mode in groups(points, part):
            push, pull = by_mode.get("push"), by_mode.get("pull-vllm")
            if push and pull and push["median_ttft_ms"]:
                r = pull["median_ttft_ms"] / push["median_ttft_ms"]
                out.append(f"- {label} at {x} req/s: pull (vLLM) / push p50 TTFT = "
                           f"{pull['median_ttft_ms']:.1f} / {push['median_ttft_ms']:.1f} ms = "
                           f"**{r:.2f}x** (target ≥ {goal}x: {'met' if r >= goal else 'missed'})")

    ratio_line("hit-pwarm", "(b) prefix hits, P warm", 3)
    ratio_line("hit-pcold", "(b') prefix hits, P cold", 3)
    ratio_line("frag", "(a) fragmented", 1.5)
    worse = []
    checked = 0
    for part in ("base", "long", "frag", "link", "hit-pwarm", "hit-pcold"):
        for x, by_mode in groups(points, part):
            push = by_mode.get("push")
            for mode in ("pull-vllm", "pull-fast"):
                pull = by_mode.get(mode)
                if push and pull and push["median_tpot_ms"] and pull["median_tpot_ms"]:
                    checked += 1
                    if push["median_tpot_ms"] > pull["median_tpot_ms"]:
                        worse.append(f"{part} @ {x}: push {push['median_tpot_ms']:.2f} > {mode} "
                                     f"{pull['median_tpot_ms']:.2f} ms")
    out.append(f"- push p50 TPOT ≤ pull p50 TPOT: {checked - len(worse)} of {checked} points"
               + ("" if not worse else "; not at: " + "; ".join(worse)))
    short = groups(points, "short")
    if short:
        x, by_mode = short[-1]  # the longest prompt, one request at a time: no queueing
        push, colo, fast = by_mode.get("push"), by_mode.get("colocated"), by_mode.get("pull-fast")
        if push and colo:
            h = push["median_ttft_ms"] - colo["median_ttft_ms"]
            layer = None
            if fast:
                c = fast["counters"].get("decode", {})
                n = c.get("kvpush_kv_transfer_read_seconds_count", 0)
                if n:
                    layer = c["kvpush_kv_transfer_read_seconds_sum"] / n / NUM_LAYERS * 1e3
            goal = None if layer is None else layer + 1.0
            eng = engine_ttft(push, "prefill"), engine_ttft(colo, "colocated-a", "colocated-b")
            out.append(f"- low load ({x}-token prompts, one at a time): H(push) = TTFT(push) − "
                       f"TTFT(colocated) = {h:.2f} ms (p50 difference); one layer's transfer ≈ "
                       f"{fmt(layer, 3)} ms (pull-fast READ time / {NUM_LAYERS}) → target ≤ "
                       f"{fmt(goal, 2)} ms: {'met' if goal is not None and h <= goal else 'missed'}"
                       + ("" if None in eng else
                          f"; the computing engines' own mean TTFT: P {eng[0]:.2f} ms, colocated "
                          f"{eng[1]:.2f} ms (P slower by {eng[0] - eng[1]:.2f} ms)"))
    slower = []
    for part in PART_TITLES:
        for x, by_mode in groups(points, part):
            push = by_mode.get("push")
            for mode in ("pull-vllm", "pull-fast"):
                pull = by_mode.get(mode)
                if push and pull and push["median_ttft_ms"] > pull["median_ttft_ms"]:
                    slower.append(f"{part} @ {x}: push {push['median_ttft_ms']:.2f} > {mode} "
                                  f"{pull['median_ttft_ms']:.2f} ms")
    out.append("- push p50 TTFT ≤ pull p50 TTFT at every prompt length, rate and variant: " +
               ("yes" if not slower else "no, at " + "; ".join(slower)))
    return "\n".join(out)


def checks(points):
    compared, mismatched, bad = token_check(points)
    failed = sum(p["failed"] for p in points)
    completed = sum(p["completed"] for p in points)
    verified = counter_sum(points, "kvpush_kv_transfer_blocks_verified_total", "decode")
    mism = counter_sum(points, "kvpush_kv_transfer_checksum_mismatches_total")
    xfail = counter_sum(points, "kvpush_kv_transfer_failed_total")
    not_full = [f"{p['part']}@{p['x']}/{p['mode']}" for p in points if not p["pools_full"]]
    lines = [
        f"- requests: {completed} completed, {failed} failed"
        + ("" if not failed else " (" + "; ".join(e for p in points for e in p["errors"])[:500] + ")"),
        f"- colocated == pull == push: {compared} prompt outputs compared across modes, "
        f"{mismatched} differ" + ("" if not bad else " (" + "; ".join(bad) + ")"),
        f"- KV blocks verified on D (XXH3, before decoding): {verified:,.0f}; checksum mismatches: "
        f"{mism:.0f}; transfers failed: {xfail:.0f}",
        "- block pools back to their full free count after every point: " +
        ("yes" if not not_full else "no: " + ", ".join(not_full)),
    ]
    return "\n".join(lines), (failed == 0 and mismatched == 0 and mism == 0 and not not_full)


def plot(points, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    files = []
    for metric, title in (("ttft", "TTFT"), ("tpot", "TPOT")) if groups(points, "base") else ():
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, stat in zip(axes, ("median", "p99")):
            for mode in MODE_ORDER:
                pts = [(x, by[mode][f"{stat}_{metric}_ms"]) for x, by in groups(points, "base")
                       if mode in by and by[mode][f"{stat}_{metric}_ms"] is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(f"{title} {'p50' if stat == 'median' else 'p99'} (ms)")
            ax.set_title(f"{title} {'p50' if stat == 'median' else 'p99'}, sim Qwen3-32B / H200")
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.tight_layout()
        name = f"{metric}_vs_rate.png"
        fig.savefig(os.path.join(out_dir, name), dpi=90)
        plt.close(fig)
        files.append(name)
    short = groups(points, "short")
    if short:
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode in ("push", "pull-vllm", "pull-fast"):
            pts = [(x, by[mode]["median_ttft_ms"] - by["colocated"]["median_ttft_ms"])
                   for x, by in short if mode in by and "colocated" in by]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("H = TTFT − TTFT(colocated), p50 (ms)")
        ax.set_title("Handoff overhead, one request at a time")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "short_prompt_overhead.png"), dpi=90)
        plt.close(fig)
        files.append("short_prompt_overhead.png")
    return files


def write(points, meta, out_dir):
    fig_dir = os.path.join(out_dir, "study")
    os.makedirs(fig_dir, exist_ok=True)
    slim = []
    for p in points:
        q = dict(p)
        if "texts" in p:
            q["text_sha1"] = [hashlib.sha1(t.encode()).hexdigest()[:12] for t in p["texts"]]
            del q["texts"]
        slim.append(q)
    with open(os.path.join(fig_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "points": slim}, f, indent=1)
    figs = plot(points, fig_dir)
    check_text, ok = checks(points)
    head = dict(meta, load=", ".join(f"{v:.1f}" for v in meta["load"]))
    md = [MD_HEAD.format(**head),
          "## Checks\n", check_text, "",
          "## Targets (issue 10)\n", targets(points), ""]
    for f in figs:
        md.append(f"![{f}](study/{f})\n")
    for part, title in PART_TITLES.items():
        if any(p["part"] == part for p in points):
            md += [f"## {title}\n", table(points, part), ""]
    if any(p["part"] in ("base", "frag") for p in points):
        md += ["## Descriptors per request (P's WRITEs in push, D's READs in pull)\n",
               descriptor_table(points), ""]
    md.append(MD_TAIL)
    with open(os.path.join(out_dir, "study.md"), "w") as f:
        f.write("\n".join(md))
    return ok


MD_HEAD = """# The push vs pull study under load

Generated by {command}; kvpush at commit {commit}; the last run started {started} and took
{minutes} min; load average at its end {load}.
Raw points: [study/results.json](study/results.json). Method: bench/study.py's docstring; the
analysis of these figures is in [study-notes.md](study-notes.md).

Setup: `kvpush serve --executor sim --sim-model qwen3-32b --sim-hw h200` (roofline-timed
Qwen3-32B on H200, efficiencies 0.65 compute / 0.85 memory: assumptions, not calibrated —
docs/sim.md), KV at `--sim-kv-scale 0.125` (32 KiB per token instead of 256 KiB), 16-token blocks,
512-token prefill chunks. 1P1D: P on CPU 0, D on CPU 1, KV over ucx:shm, `kvpush router` in
front (the handoff chosen per request by `x-kvpush-mode`). Colocated: two `--role both`
instances (CPU 0, CPU 1) behind `kvpush router --colocated` (round robin) — the same two
accelerators. Load: `kvpush bench`, vLLM's random dataset (token ids), greedy, streamed,
Poisson arrivals; the prefix cache is off except in (b). All times in ms; TPOT = (E2EL − TTFT) /
(output tokens − 1) per request.
"""

MD_TAIL = """## Reproduce

```sh
scripts/build.sh && apt-get install -y python3-matplotlib   # plots; iproute2 for (c)
bench/study.py            # as root for part (c); --quick for a short try-out; --parts to choose
```
"""


if __name__ == "__main__":
    # Regenerates study.md and the plots from a results.json: study_report.py RESULTS [OUT_DIR]
    import sys
    with open(sys.argv[1]) as f:
        data = json.load(f)
    write(data["points"], data["meta"], sys.argv[2] if len(sys.argv) > 2 else
          os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks"))
