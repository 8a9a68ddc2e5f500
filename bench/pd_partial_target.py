#!/usr/bin/env python3
"""A long push request arriving while D's pool is held by a running decode: D reserving its
target in parts (kv_connector_extra_config partial_targets, the default) against waiting for the
whole pool (partial_targets false) and pull (fast), side by side in one run.

Set-up (sim executor, docs/sim.md; prefix cache off): a colocated instance (CPU 0) for the
reference tokens, P (CPU 0), two decode instances (CPU 1) that differ only in partial_targets,
and a router in front of P and each D. D's pool holds the busy request's whole sequence plus
`--fraction` of the long prompt's blocks. Each round, for each mode in rotating order: a busy
request (`--busy-tokens` prompt, `--busy-output` tokens) is sent to D directly; once its first
token is out (it runs), the long request (`--tokens`) goes through the router. Reported per mode
(medians over rounds): the long request's TTFT and its first token's delay after the busy
request's last token (what the transfer adds once D's pool can hold the prompt). Checked on every
P/D answer: tokens identical to colocated, D's transferred-token counter grew by the prompt, no
KV-load recompute, the reservation counter (kvpush_kv_transfer_push_targets_partial_total) moved
for partial targets and only there, and both pools whole at the end. Exits 1 on a failed check.

    python3 bench/pd_partial_target.py --rounds 5
"""
import argparse
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time

from pd_bench_util import (HOST, add_kvpush_and_model_args, delta, metrics, pct, read1_pieces,
                           sse_events, start_kvpush, stop_all, stream_tokens, wait_healthy)

# Llama 3.1 8B's KV shape (src/model/sim_model.cc): layers, KV heads, head dim.
LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128
PARTIAL = "kvpush_kv_transfer_push_targets_partial_total"


class Busy(threading.Thread):
    """A streamed request to `port`; `started` is set at its first token, `end_ns` at its last."""

    def __init__(self, port, body):
        super().__init__(daemon=True)
        self.port, self.body = port, dict(body, stream=True, return_token_ids=True)
        self.started = threading.Event()
        self.end_ns = 0
        self.error = None

    def run(self):
        try:
            c = http.client.HTTPConnection(HOST, self.port, timeout=600)
            c.request("POST", "/v1/completions", json.dumps(self.body),
                      {"content-type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"busy request: HTTP {r.status}")
            for _, ev in sse_events(read1_pieces(r)):
                if b"token_ids" in ev:
                    self.started.set()
                    self.end_ns = time.monotonic_ns()
        except Exception as e:  # reported by the caller
            self.error = e
        finally:
            self.started.set()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_kvpush_and_model_args(ap)
    ap.add_argument("--tokens", type=int, default=16384, help="the long request's prompt")
    ap.add_argument("--busy-tokens", type=int, default=8192, help="the busy request's prompt")
    ap.add_argument("--busy-output", type=int, default=128, help="the busy request's output")
    ap.add_argument("--fraction", type=float, default=0.66,
                    help="of the long prompt's blocks D's pool holds beside the busy request")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kv-scale", type=float, default=0.0625, help="--sim-kv-scale")
    ap.add_argument("--backend", default="ucx:tcp")
    ap.add_argument("--out", help="write every round as JSON here")
    a = ap.parse_args()

    kv_bytes_token = LAYERS * 2 * KV_HEADS * max(4, round(HEAD_DIM * a.kv_scale)) * 2
    out_tokens = 4
    long_blocks = -(-(a.tokens + out_tokens) // 16)
    busy_blocks = -(-(a.busy_tokens + a.busy_output) // 16)
    d_blocks = busy_blocks + int(long_blocks * a.fraction)
    max_len = max(a.tokens + out_tokens, a.busy_tokens + a.busy_output)
    tmp = tempfile.mkdtemp(prefix="kvpush-partial-")
    procs, ports = [], {}

    def start(name, cpu, args):
        return start_kvpush(a.kvpush, tmp, procs, ports, name, cpu, args)

    def serve(name, cpu, blocks, extra):
        common = ["serve", "--executor", "sim", "--sim-model", "llama-3.1-8b", "--sim-hw", "h200",
                  "--sim-kv-scale", str(a.kv_scale),
                  "--kv-cache-memory", str(blocks * 16 * kv_bytes_token),
                  "--max-model-len", str(max_len), "--no-enable-prefix-caching",
                  "--log-level", "warn"]
        p = start(name, cpu, common + extra)
        wait_healthy(ports[name], p, 300)

    def cfg(partial):
        return json.dumps({"kv_connector_extra_config": {
            "backend": a.backend, "watchdog_ms": 600000, "lease_ms": 900000,
            "partial_targets": partial}})

    failures, rounds = [], []
    try:
        p_blocks = long_blocks + 64
        serve("colocated", 0, p_blocks, ["--role", "both"])
        serve("prefill", 0, p_blocks, ["--role", "prefill", "--kv-transfer-config", cfg(True)])
        serve("decode-parts", 1, d_blocks, ["--role", "decode", "--kv-transfer-config", cfg(True)])
        serve("decode-whole", 1, d_blocks, ["--role", "decode", "--kv-transfer-config", cfg(False)])
        for d in ("decode-parts", "decode-whole"):
            r = start("router-" + d, None, ["router", "--prefill", f"http://{HOST}:{ports['prefill']}",
                                            "--decode", f"http://{HOST}:{ports[d]}",
                                            "--log-level", "warn"])
            wait_healthy(ports["router-" + d], r)
        # (label, router's decode instance, x-kvpush-mode)
        modes = [("push, target in parts", "decode-parts", "push"),
                 ("push, whole target", "decode-whole", "push"),
                 ("pull-fast", "decode-parts", "pull-fast")]
        rng = random.Random(53)
        vocab = 128256
        warm = {"prompt": [rng.randrange(3, vocab) for _ in range(600)], "max_tokens": 2,
                "temperature": 0, "ignore_eos": True}
        for _, d, m in modes:
            stream_tokens(ports["router-" + d], warm, m)
        print(f"load average {os.getloadavg()[0]:.2f}; D's pool {d_blocks} blocks (busy request "
              f"{busy_blocks}, long prompt {long_blocks}); {a.rounds} rounds", flush=True)
        for rnd in range(a.rounds):
            body = {"prompt": [rng.randrange(3, vocab) for _ in range(a.tokens)],
                    "max_tokens": out_tokens, "temperature": 0, "ignore_eos": True}
            ref = stream_tokens(ports["colocated"], body)[3]
            order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
            got = {}
            for label, d, m in order:
                busy = Busy(ports[d], {"prompt": [rng.randrange(3, vocab)
                                                  for _ in range(a.busy_tokens)],
                                       "max_tokens": a.busy_output, "temperature": 0,
                                       "ignore_eos": True})
                m0 = metrics(ports[d])
                busy.start()
                busy.started.wait(600)
                t0, times, _, toks = stream_tokens(ports["router-" + d], body, m, timeout=600)
                busy.join()
                m1 = metrics(ports[d])
                if busy.error:
                    failures.append(f"{label}: busy request failed: {busy.error}")
                r = {"ttft_ms": (times[0] - t0) / 1e6,
                     "after_busy_ms": (times[0] - busy.end_ns) / 1e6,
                     "transferred": int(delta(m0, m1, "kvpush_prompt_tokens_transferred_total")),
                     "recomputes": int(delta(m0, m1, "kvpush_kv_load_recomputes_total")),
                     "partial": int(delta(m0, m1, PARTIAL))}
                want_partial = 1 if label.startswith("push, target in parts") else 0
                checks = {"tokens identical to colocated": toks == ref,
                          f"transferred {r['transferred']} == {a.tokens}":
                              r["transferred"] == a.tokens,
                          f"recomputes {r['recomputes']} == 0": r["recomputes"] == 0,
                          f"partial reservations {r['partial']} == {want_partial}":
                              r["partial"] == want_partial}
                for what, ok in checks.items():
                    if not ok:
                        failures.append(f"round {rnd} {label}: {what}")
                got[label] = r
            rounds.append(got)
            print(f"  round {rnd}: " + "  ".join(
                f"{k}: TTFT {v['ttft_ms']:.0f} ms, {v['after_busy_ms']:+.1f} ms after the busy "
                f"request" for k, v in got.items()), flush=True)
        time.sleep(1.0)
        for name in ("prefill", "decode-parts", "decode-whole"):
            mt = metrics(ports[name])
            if mt.get("kvpush_kv_blocks_used", -1) != 0:
                failures.append(f"{name}'s pool not whole: {mt.get('kvpush_kv_blocks_used')} used")
    finally:
        stop_all(procs)
    print(f"\nlong prompt {a.tokens} tokens ({a.tokens * kv_bytes_token / 2**20:.0f} MiB of KV), "
          f"medians of {len(rounds)} rounds; load average {os.getloadavg()[0]:.2f}")
    print("| mode | TTFT ms | first token after the busy request's last, ms |")
    print("| --- | ---: | ---: |")
    for label, _, _ in modes:
        rs = [r[label] for r in rounds]
        if rs:
            print(f"| {label} | {pct([r['ttft_ms'] for r in rs], 0.5):.1f} | "
                  f"{pct([r['after_busy_ms'] for r in rs], 0.5):.1f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "d_blocks": d_blocks, "rounds": rounds}, f, indent=1)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
