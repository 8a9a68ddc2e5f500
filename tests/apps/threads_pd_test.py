#!/usr/bin/env python3
"""P and D with different executor thread counts give colocated's bits (issue 25 item 2).

For three weight types (q4_k: the K-quant integer path; q8_0: the Q8_0 integer path; f16: the
fused and tiled float paths), a generated model (llama3 shape, dim 256, 2 layers, 4 heads of 64,
2 KV heads, hidden 768, vocab 4096) is served by a colocated instance with `--threads 1`, a
prefill instance with `--threads 2` and a decode instance with `--threads 3`, behind a router.
Every prompt (short, and long enough for several attention blocks and prefill chunks) is sent
colocated and through the router in push and in pull, greedy and seeded-sampled, with logprobs:
the token ids, the text and every logprob must be equal to colocated's, byte for byte. A row's
result does not depend on the thread that computes it (docs/model.md, Threading), so this holds
only if that is true end to end: P's KV, written by 2 threads, continued by D's 3.

    tests/apps/threads_pd_test.py --kvpush build/apps/kvpush
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "threads_pd"
check = h.check
SHAPE = ["--arch", "llama3", "--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
         "--hidden-dim", "768", "--vocab", "4096", "--context", "1024"]
PROMPTS = ["hello world",
           " ".join("word%d" % i for i in range(150))]  # about 300+ tokens: several blocks


def post(port, body, mode=None):
    headers = {"Content-Type": "application/json"}
    if mode:
        headers["x-kvpush-mode"] = mode
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps(body), headers)
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    return r.status, raw


def post_json(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def transferred(inst):
    """Prompt tokens `inst` got as KV from a prefill instance, so far."""
    return (inst.metrics(timeout=5.0) or {}).get("kvpush_prompt_tokens_transferred_total", 0.0)


def comparable(raw):
    """The answer's choices (tokens, text, logprobs) without ids and timestamps."""
    doc = json.loads(raw)
    return json.dumps(doc.get("choices"), sort_keys=True)


def run_type(args, logdir, dtype):
    model = os.path.join(logdir, "%s.gguf" % dtype)
    subprocess.run([args.kvpush, "gen-model", "--out", model, "--dtype", dtype] + SHAPE,
                   check=True, stdout=subprocess.DEVNULL)
    ports = [h.free_port() for _ in range(4)]
    procs = []

    def serve(name, argv, port):
        inst = h.Instance("%s-%s" % (dtype, name), argv, "127.0.0.1", port, logdir, args.kvpush)
        inst.start()
        procs.append(inst)
        return inst

    cfg = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
    try:
        colo = serve("colocated", ["serve", model, "--port", str(ports[0]), "--threads", "1"],
                     ports[0])
        p = serve("p", ["serve", model, "--port", str(ports[1]), "--threads", "2",
                        "--kv-transfer-config", cfg % "kv_producer"], ports[1])
        d = serve("d", ["serve", model, "--port", str(ports[2]), "--threads", "3",
                        "--kv-transfer-config", cfg % "kv_consumer"], ports[2])
        serve("router", ["router", "--port", str(ports[3]), "--prefill", p.url, "--decode",
                         d.url], ports[3])
        for inst in procs:
            if not inst.wait_healthy(90):
                raise SystemExit("%s did not become healthy" % inst.name)
        for prompt in PROMPTS:
            for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 7}):
                body = dict(sampling, prompt=prompt, max_tokens=24, logprobs=2,
                            return_token_ids=True, ignore_eos=True)
                status, ref = post(colo.port, body)
                check(status == 200, "%s: colocated answers (%d)" % (dtype, status))
                if status != 200:
                    continue
                for mode in ("push", "pull"):
                    # D's prefix cache emptied, so that the whole prompt's KV moves again.
                    post_json(d.port, "/reset_prefix_cache", {})
                    before = transferred(d)
                    status, got = post(ports[3], body, mode)
                    moved = transferred(d) - before
                    label = "%s, %d-char prompt, %s, %s" % (
                        dtype, len(prompt), "greedy" if not sampling["temperature"] else "seeded",
                        mode)
                    check(status == 200 and comparable(got) == comparable(ref),
                          "%s: P (2 threads) + D (3 threads) equal colocated (1 thread), "
                          "tokens and logprobs (%d; %d prompt tokens' KV moved)"
                          % (label, status, moved))
                    if len(prompt) > 100:
                        check(moved > 100, "%s: D took the prompt's KV from P (%d tokens)"
                              % (label, moved))
    finally:
        h.stop_all(procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvpush", required=True)
    args = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="kvpush-threads-pd-")
    for dtype in ("q4_k", "q8_0", "f16"):
        run_type(args, logdir, dtype)
    if h.FAILURES:
        print("threads_pd: %d check(s) failed; logs in %s" % (len(h.FAILURES), logdir))
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
