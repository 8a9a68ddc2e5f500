#!/usr/bin/env python3
"""P/D handoff benchmark: TTFT and TPOT of colocated, pull (vLLM default), pull (fast) and push,
same prompts, same run (docs/benchmarks/pd.md).

Starts, on loopback: a colocated instance, one prefill (P) and one decode (D) instance and a
router, all on a generated Llama-shaped model (or --model). P and the colocated instance are pinned
to CPU 0 and D to CPU 1 (the machine has two), so P's compute does not steal D's core. Requests are
sent one at a time; for every prompt each mode runs in turn (rotating order) so that machine noise
falls on all modes alike. The prefix cache is off on every instance (the same prompt is sent in
every mode, and each must move its whole KV).

Reports, per prompt length: TTFT and TPOT median and p99 per mode, and the handoff overhead
H(mode) = TTFT(mode) - TTFT(colocated) (median of the per-prompt differences). Because the CPU
prefill itself jitters by a few percent (tens of ms) between runs, it also reports the
compute-corrected Hc: per request, client TTFT minus the TTFT that the computing engine (P, or the
colocated instance) recorded for itself (read from its /metrics histogram sum before and after the
request; requests run one at a time), minus the same for colocated. Then the decode
TPOT of a long stream on D alone vs while push requests (max_tokens=1: KV arrives, nothing more is
decoded) keep arriving, and the CPU use of the idle P+D pair. Prints a table and writes JSON.

Only the Python standard library is used.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from pd_bench_util import (HOST, TTFT_SUM, cpu_seconds, free_port, metrics, pct, stream_tokens,
                           wait_healthy)
VERIFY_SUM = "kvpush_kv_transfer_verify_seconds_sum"
VERIFY_EARLY_SUM = "kvpush_kv_transfer_verify_early_seconds_sum"


def stream(port, body, mode=None, timeout=600):
    """POSTs a streaming completion; returns dict(ttft_ms, tpot_ms, tokens, e2e_ms)."""
    t0, times, t1, tokens = stream_tokens(port, body, mode, timeout)
    n = len(times)
    return {
        "ttft_ms": (times[0] - t0) / 1e6,
        "tpot_ms": (times[-1] - times[0]) / 1e6 / (n - 1) if n > 1 else None,
        "e2e_ms": (t1 - t0) / 1e6,
        "tokens": tokens,
    }

def mean_delta(before, after, sum_name, count_name):
    n = after.get(count_name, 0) - before.get(count_name, 0)
    return (after.get(sum_name, 0) - before.get(sum_name, 0)) / n * 1e3 if n > 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvpush", default=os.path.join(os.path.dirname(__file__), "..", "build", "apps", "kvpush"))
    ap.add_argument("--model", help="GGUF model (default: generate the gen-model default shape, context 4096)")
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--lengths", default="512,2048", help="prompt lengths (tokens)")
    ap.add_argument("--requests", default="12,6", help="prompts per length")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--tpot-tokens", type=int, default=200, help="length of the TPOT probe stream")
    ap.add_argument("--out", default="pd_handoff.json")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, model)")
    ap.add_argument("--no-verify", action="store_true",
                    help="D skips the KV checksum check (verify_checksums false), for an A/B of its cost")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="kvpush-pd-bench-")
    kv = os.path.abspath(a.kvpush)
    procs = []
    try:
        model = a.model
        if not model:
            model = os.path.join(tmp, "gen.gguf")
            print(f"generating the benchmark model at {model} ...", flush=True)
            subprocess.run([kv, "gen-model", "--context", "4096", "--out", model], check=True,
                           stdout=subprocess.DEVNULL)
        # A 2048-token prefill of the generated model takes ~9 s on this CPU: the decode watchdog
        # (default 10 s, counted from D's admission) must leave room for it.
        cfg = json.dumps({"kv_connector_extra_config": {"backend": a.backend, "watchdog_ms": 120000,
                                                        "lease_ms": 180000,
                                                        "verify_checksums": not a.no_verify}})
        common = ["serve", "--model", model, "--no-enable-prefix-caching", "--log-level", "warn",
                  "--max-model-len", "4096"]
        ports = {}

        def start(name, cpu, args):
            ports[name] = free_port()
            cmd = (["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []) + \
                [kv] + args + ["--host", HOST, "--port", str(ports[name])]
            p = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, name + ".log"), "w"),
                                 stderr=subprocess.STDOUT)
            procs.append((name, p))
            return p

        colo = start("colocated", 0, common + ["--role", "both"])
        pre = start("prefill", 0, common + ["--role", "prefill", "--kv-transfer-config", cfg])
        dec = start("decode", 1, common + ["--role", "decode", "--kv-transfer-config", cfg])
        for name, p in procs:
            wait_healthy(ports[name], p)
        rtr = start("router", None, ["router", "--prefill", f"http://{HOST}:{ports['prefill']}",
                                     "--decode", f"http://{HOST}:{ports['decode']}", "--log-level", "warn"])
        wait_healthy(ports["router"], rtr)

        with open(model, "rb"):
            pass
        vocab = 4096
        rng = random.Random(1234)
        modes = [("colocated", None), ("push", "push"), ("pull (vLLM default)", "pull-vllm"),
                 ("pull (fast)", "pull-fast")]
        results = {"backend": a.backend, "model": model, "lengths": {}}
        # Warm-up: handshakes and first-touch of the arenas.
        warm = {"prompt": [1] + [rng.randrange(3, vocab) for _ in range(40)], "max_tokens": 4,
                "temperature": 0, "ignore_eos": True}
        for _, m in modes:
            stream(ports["colocated"] if m is None else ports["router"], warm, m)

        lengths = [int(x) for x in a.lengths.split(",")]
        counts = [int(x) for x in a.requests.split(",")]
        for length, count in zip(lengths, counts):
            per = {name: [] for name, _ in modes}
            mismatches = 0
            p0, d0 = metrics(ports["prefill"]), metrics(ports["decode"])
            for i in range(count):
                prompt = [1] + [rng.randrange(3, vocab) for _ in range(length - 1)]
                body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}
                order = modes[i % len(modes):] + modes[:i % len(modes)]
                ref = None
                got = {}
                for name, m in order:
                    # The instance that computes the prompt: its engine's TTFT (arrival -> first
                    # token sampled) for this request is the delta of its TTFT histogram sum.
                    eng = ports["colocated"] if m is None else ports["prefill"]
                    before = metrics(eng).get(TTFT_SUM, 0.0)
                    d_before = metrics(ports["decode"]) if m else {}
                    r = stream(ports["colocated"] if m is None else ports["router"], body, m)
                    r["engine_ttft_ms"] = (metrics(eng).get(TTFT_SUM, 0.0) - before) * 1e3
                    if m:  # D's checksum work for this request: on the TTFT path / overlapped
                        d_after = metrics(ports["decode"])
                        for key, metric in (("d_verify_ms", VERIFY_SUM), ("d_verify_early_ms", VERIFY_EARLY_SUM)):
                            r[key] = (d_after.get(metric, 0.0) - d_before.get(metric, 0.0)) * 1e3
                    r["overhead_ms"] = r["ttft_ms"] - r["engine_ttft_ms"]
                    got[name] = r
                for name, _ in modes:
                    per[name].append(got[name])
                    if got[name]["tokens"] != got["colocated"]["tokens"]:
                        mismatches += 1
                print(f"  {length}-token prompt {i + 1}/{count}: " + "  ".join(
                    f"{n.split()[0]} {got[n]['ttft_ms']:.1f}" for n, _ in modes) + " ms TTFT", flush=True)
            p1, d1 = metrics(ports["prefill"]), metrics(ports["decode"])
            recomputes = d1.get("kvpush_kv_load_recomputes_total", 0) - d0.get("kvpush_kv_load_recomputes_total", 0)
            transfers = 3 * count  # push, pull (vLLM default), pull (fast) per prompt

            def per_transfer_ms(before, after, name):
                return (after.get(name, 0) - before.get(name, 0)) * 1e3 / transfers

            row = {"mismatches": mismatches, "modes": {}, "d_recomputes": recomputes,
                   # End-to-end KV checksums: P's hashing per transfer (all P/D modes).
                   "p_checksum_ms_per_transfer": per_transfer_ms(p0, p1, "kvpush_kv_transfer_checksum_seconds_sum"),
                   "blocks_verified": d1.get("kvpush_kv_transfer_blocks_verified_total", 0)
                   - d0.get("kvpush_kv_transfer_blocks_verified_total", 0),
                   "checksum_mismatches": d1.get("kvpush_kv_transfer_checksum_mismatches_total", 0)
                   - d0.get("kvpush_kv_transfer_checksum_mismatches_total", 0),
                   "push_tail_ms_mean": mean_delta(p0, p1, "kvpush_kv_transfer_push_tail_seconds_sum",
                                                   "kvpush_kv_transfer_push_tail_seconds_count"),
                   "pull_read_ms_mean": mean_delta(d0, d1, "kvpush_kv_transfer_read_seconds_sum",
                                                   "kvpush_kv_transfer_read_seconds_count")}
            colo_ttft = [r["ttft_ms"] for r in per["colocated"]]
            colo_over = [r["overhead_ms"] for r in per["colocated"]]
            for name, _ in modes:
                ttft = [r["ttft_ms"] for r in per[name]]
                tpot = [r["tpot_ms"] for r in per[name]]
                h = [t - c for t, c in zip(ttft, colo_ttft)]
                # Compute-corrected: (client TTFT - the computing engine's own TTFT) minus the same
                # for colocated, per prompt. Removes the CPU jitter of the prefill itself.
                hc = [o["overhead_ms"] - c for o, c in zip(per[name], colo_over)]
                row["modes"][name] = {
                    "ttft_ms_median": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99),
                    "tpot_ms_median": pct(tpot, 0.5), "tpot_ms_p99": pct(tpot, 0.99),
                    "handoff_ms_median": None if name == "colocated" else pct(h, 0.5),
                    "handoff_ms_p99": None if name == "colocated" else pct(h, 0.99),
                    "handoff_corrected_ms_median": None if name == "colocated" else pct(hc, 0.5),
                    "handoff_corrected_ms_p99": None if name == "colocated" else pct(hc, 0.99),
                    "engine_ttft_ms": [r["engine_ttft_ms"] for r in per[name]],
                    "d_verify_ms_mean": None if name == "colocated" else statistics.mean(
                        r["d_verify_ms"] for r in per[name]),
                    "d_verify_early_ms_mean": None if name == "colocated" else statistics.mean(
                        r["d_verify_early_ms"] for r in per[name]),
                    "ttft_ms": ttft,
                }
            # KV bytes of one layer of this prompt (K and V): what layer-wise push leaves exposed.
            row["layer_kv_bytes"] = length * 2 * 4 * 64 * 4 if not a.model else None
            results["lengths"][str(length)] = row

        # Decode TPOT on D alone vs while push requests keep arriving.
        probe = {"prompt": [1] + [rng.randrange(3, vocab) for _ in range(30)], "max_tokens": a.tpot_tokens,
                 "temperature": 0, "ignore_eos": True}
        alone = [stream(ports["router"], probe, "push")["tpot_ms"] for _ in range(3)]
        stop = threading.Event()
        pushes = [0]

        def background():
            r = random.Random(99)
            while not stop.is_set():
                bg = {"prompt": [1] + [r.randrange(3, vocab) for _ in range(511)], "max_tokens": 1,
                      "temperature": 0, "ignore_eos": True}
                try:
                    stream(ports["router"], bg, "push")
                    pushes[0] += 1
                except Exception as e:  # noqa: BLE001 - report and stop
                    print("background push failed:", e, file=sys.stderr)
                    return

        th = threading.Thread(target=background)
        th.start()
        time.sleep(0.5)
        busy = [stream(ports["router"], probe, "push")["tpot_ms"] for _ in range(3)]
        stop.set()
        th.join()
        results["tpot_under_push"] = {"alone_ms": alone, "with_pushes_ms": busy,
                                      "ratio_median": statistics.median(busy) / statistics.median(alone),
                                      "background_pushes": pushes[0]}

        # Idle CPU of the P+D pair.
        time.sleep(1.0)
        c0 = {n: cpu_seconds(p.pid) for n, p in procs if n in ("prefill", "decode")}
        time.sleep(5.0)
        c1 = {n: cpu_seconds(p.pid) for n, p in procs if n in ("prefill", "decode")}
        results["idle_cpu_percent"] = {n: (c1[n] - c0[n]) / 5.0 * 100 for n in c0}

        # Report.
        print(f"\nP/D handoff benchmark — backend {a.backend}, model {os.path.basename(model)}, "
              f"{a.max_tokens} output tokens, requests one at a time")
        print(f"{'prompt':>7} {'mode':<20} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} "
              f"{'H p50':>8} {'H p99':>8} {'Hc p50':>8} {'Hc p99':>8}")
        for length, row in results["lengths"].items():
            for name, _ in modes:
                s = row["modes"][name]
                hm = "" if s["handoff_ms_median"] is None else f"{s['handoff_ms_median']:8.2f}"
                hp = "" if s["handoff_ms_p99"] is None else f"{s['handoff_ms_p99']:8.2f}"
                cm = "" if s["handoff_corrected_ms_median"] is None else f"{s['handoff_corrected_ms_median']:8.2f}"
                cp = "" if s["handoff_corrected_ms_p99"] is None else f"{s['handoff_corrected_ms_p99']:8.2f}"
                print(f"{length:>7} {name:<20} {s['ttft_ms_median']:9.2f} {s['ttft_ms_p99']:9.2f} "
                      f"{s['tpot_ms_median']:9.3f} {s['tpot_ms_p99']:9.3f} {hm:>8} {hp:>8} {cm:>8} {cp:>8}")
            hp = row["modes"]["push"]["handoff_corrected_ms_median"]
            hv = row["modes"]["pull (vLLM default)"]["handoff_corrected_ms_median"]
            print(f"{length:>7} Hc(push) / Hc(pull vLLM default) = {hp / hv if hv else float('nan'):.3f}"
                  f"   token mismatches vs colocated: {row['mismatches']}"
                  f"   failed loads recomputed on D: {row['d_recomputes']:.0f}")
            tail, rd = row["push_tail_ms_mean"], row["pull_read_ms_mean"]
            print(f"{length:>7} measured inside the instances (means): push tail on P (prefill "
                  f"finished -> KV_READY posted) {tail if tail is None else round(tail, 3)} ms; "
                  f"pull READ on D {rd if rd is None else round(rd, 3)} ms")
            print(f"{length:>7} KV checksums ({row['blocks_verified']:.0f} blocks verified, "
                  f"{row['checksum_mismatches']:.0f} mismatches; P hashes {row['p_checksum_ms_per_transfer']:.3f} ms "
                  f"per transfer). D, mean per request, on the TTFT path / overlapped with P's compute: " +
                  ", ".join(f"{n} {row['modes'][n]['d_verify_ms_mean']:.3f} / "
                            f"{row['modes'][n]['d_verify_early_ms_mean']:.3f} ms"
                            for n, m in modes if m))
        t = results["tpot_under_push"]
        print(f"\ndecode TPOT alone {statistics.median(t['alone_ms']):.3f} ms, with pushes arriving "
              f"{statistics.median(t['with_pushes_ms']):.3f} ms (ratio {t['ratio_median']:.3f}, "
              f"{t['background_pushes']} background pushes)")
        print("idle CPU: " + ", ".join(f"{n} {v:.2f}%" for n, v in results["idle_cpu_percent"].items()))
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"JSON: {a.out}")
        return 0
    finally:
        for _, p in procs:
            p.terminate()
        for _, p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if a.keep:
            print(f"logs and model kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
