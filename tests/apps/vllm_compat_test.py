#!/usr/bin/env python3
"""vLLM's launch lines on kvpush (issue 23, docs/configuration.md "vLLM's flags").

P, D and a router are started with vLLM's documented P/D launch lines (NixlConnector usage guide:
`serve MODEL --port N --enforce-eager --kv-transfer-config '{"kv_connector":"NixlConnector",
"kv_role":...}'`, model path and ports aside), then with the same flags from a YAML --config,
and with --api-key. Checks: every answer (push and pull) equals a colocated instance's, token for
token; D's transferred-token counter grows (KV moved, not recomputed); 401 without or with a
wrong key on the router, P and D (the P/D endpoint /kv/abort too) and 200 with it; /version and
`kvpush --version` agree; the access log has one line per request with its request id and is
off with --disable-log-requests; flags without a meaning here are refused naming kvpush's
equivalent. Python 3 standard library only; exit 77 (skipped) without the model.

    tests/apps/vllm_compat_test.py --kvpush build/apps/kvpush \\
        --model ../shared/models/stories260K.gguf
"""

import argparse
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "vllm_compat"
KEY = "sk-vllm-compat-0123456789"
PROMPTS = [
    "Once upon a time there was a little girl who lived in a village near the forest and she",
    "The cat sat on the mat and looked out of the window at the birds that were singing in the",
    "Tom and his dog went to the park to play with a big red ball. They ran and ran until",
]
FAILURES = h.FAILURES
check = h.check


def call(port, method, path, body=None, key=None, timeout=60):
    """(status, parsed JSON or text) of one request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    c.request(method, path, json.dumps(body) if body is not None else None, headers)
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def completion(prompt, model):
    return {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0,
            "logprobs": 0}


def answer_key(doc):
    """What must equal colocated: text and token ids of every choice, finish reasons, usage."""
    if not isinstance(doc, dict) or "choices" not in doc:
        return doc
    return [(c["text"], c["finish_reason"], json.dumps(c.get("logprobs"), sort_keys=True))
            for c in doc["choices"]], doc.get("usage")


class Cluster:
    """Started processes, stopped together."""

    def __init__(self, args, logdir):
        self.args, self.logdir, self.procs = args, logdir, []

    def start(self, name, argv, env=None, port=None):
        port = port if port is not None else int(argv[argv.index("--port") + 1])
        inst = h.Instance(name, argv, "127.0.0.1", port, self.logdir, self.args.kvpush, env=env)
        inst.start()
        self.procs.append(inst)
        return inst

    def wait(self):
        for p in self.procs:
            if not p.wait_healthy(90):
                raise SystemExit("%s did not become healthy; log:\n%s" % (p.name, h.tail(
                    p.incarnations[-1]["log"])))

    def stop(self):
        for p in self.procs:
            if p.proc.poll() is None:
                p.proc.terminate()
        for p in self.procs:
            try:
                p.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.proc.kill()
        self.procs = []


def vllm_line(model, port, role, extra=()):
    """vLLM's documented instance line (NixlConnector usage guide), kvpush's binary."""
    cfg = json.dumps({"kv_connector": "NixlConnector", "kv_role": role})
    return ["serve", model, "--port", str(port), "--enforce-eager",
            "--kv-transfer-config", cfg] + list(extra)


def compare_modes(router_port, colo_port, d, model, key=None, label=""):
    """Every prompt, push and pull, through the router against colocated."""
    before = d.metrics().get("kvpush_prompt_tokens_transferred_total", 0)
    same = True
    for mode in ("push", "pull"):
        for p in PROMPTS:
            body = completion(p, model)
            s1, routed = call_mode(router_port, body, mode, key)
            s2, colo = call(colo_port, "POST", "/v1/completions", body, key)
            if s1 != 200 or s2 != 200 or answer_key(routed) != answer_key(colo):
                h.log("differs (%s): %s %s vs %s %s" % (mode, s1, routed, s2, colo))
                same = False
    check(same, "%s: push and pull answers equal colocated (%d prompts)" % (label, len(PROMPTS)))
    moved = d.metrics().get("kvpush_prompt_tokens_transferred_total", 0) - before
    check(moved > 0, "%s: D received KV (%d prompt tokens transferred)" % (label, moved))


def call_mode(port, body, mode, key):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", "x-kvpush-mode": mode}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    c.request("POST", "/v1/completions", json.dumps(body), headers)
    r = c.getresponse()
    doc = json.loads(r.read())
    c.close()
    return r.status, doc


def run_launch_lines(args, logdir, model_name):
    cl = Cluster(args, logdir)
    pp, dp, cp, rp = (h.free_port() for _ in range(4))
    try:
        p = cl.start("p", vllm_line(args.model, pp, "kv_producer"))
        d = cl.start("d", vllm_line(args.model, dp, "kv_consumer"))
        cl.start("colo", ["serve", args.model, "--port", str(cp), "--enforce-eager"])
        cl.start("router", ["router", "--port", str(rp), "--prefill", p.url, "--decode", d.url])
        cl.wait()
        compare_modes(rp, cp, d, model_name, label="kv_producer/kv_consumer lines")
        log = open(d.incarnations[-1]["log"]).read()
        check("role=decode" in log, "kv_role kv_consumer without --role made a decode instance")
    finally:
        cl.stop()
    # The guide's other form: kv_both on both instances, the router assigning the roles.
    try:
        p = cl.start("p-both", vllm_line(args.model, pp, "kv_both"))
        d = cl.start("d-both", vllm_line(args.model, dp, "kv_both"))
        cl.start("colo", ["serve", args.model, "--port", str(cp)])
        cl.start("router", ["router", "--port", str(rp), "--prefill", p.url, "--decode", d.url])
        cl.wait()
        compare_modes(rp, cp, d, model_name, label="kv_both lines")
    finally:
        cl.stop()


def run_yaml_and_keys(args, logdir, model_name):
    cl = Cluster(args, logdir)
    pp, dp, cp, rp = (h.free_port() for _ in range(4))
    ymls = {}
    for name, port, role in (("p", pp, "kv_producer"), ("d", dp, "kv_consumer")):
        path = os.path.join(logdir, name + ".yaml")
        with open(path, "w") as f:
            f.write("model: %s\nport: %d\nenforce_eager: true\nserved-model-name: [%s, alias]\n"
                    "kv-transfer-config:\n  kv_connector: NixlConnector\n  kv_role: %s\n"
                    "  kv_connector_extra_config:\n    backends: [UCX]\n    kv_lease_duration: 30\n"
                    % (args.model, port, model_name, role))
        ymls[name] = path
    try:
        p = cl.start("p-yaml", ["serve", "--config", ymls["p"], "--api-key", KEY,
                                "--log-format", "json"], port=pp)
        d = cl.start("d-yaml", ["serve", "--config", ymls["d"]], env={"VLLM_API_KEY": KEY},
                     port=dp)
        cl.start("colo", ["serve", args.model, "--port", str(cp), "--api-key", KEY,
                          "--disable-log-requests"])
        r = cl.start("router", ["router", "--port", str(rp), "--prefill", p.url, "--decode",
                                d.url, "--api-key", KEY])
        cl.wait()
        compare_modes(rp, cp, d, model_name, key=KEY, label="YAML --config, --api-key")
        body = dict(completion(PROMPTS[0], model_name), stream=True,
                    stream_options={"include_usage": True})
        s, text = call(rp, "POST", "/v1/completions", body, KEY)
        check(s == 200 and "[DONE]" in str(text), "a streamed request through the router")
        s, doc = call(cp, "POST", "/reset_prefix_cache", {}, KEY)
        check(s == 200 and doc.get("blocks_freed", 0) > 0,
              "colocated POST /reset_prefix_cache freed its cached blocks: %s" % doc)
        s, doc = call(rp, "POST", "/reset_prefix_cache", {}, KEY)
        check(s == 200 and len(doc.get("instances", [])) == 2 and
              all(i["status"] == 200 for i in doc["instances"]),
              "the router's POST /reset_prefix_cache reset P and D: %s" % doc)
        s, doc = call(dp, "POST", "/v1/completions", completion(PROMPTS[0], "alias"), KEY)
        check(s == 200 and doc.get("model") == model_name,
              "a second --served-model-name is served; responses name the first")
        for inst in (r, p, d):
            port = inst.port
            s_none, doc = call(port, "POST", "/v1/completions", completion(PROMPTS[0], model_name))
            s_bad, _ = call(port, "POST", "/v1/completions", completion(PROMPTS[0], model_name),
                            "sk-wrong")
            s_abort, _ = call(port, "POST", "/kv/abort", {"transfer_id": "x" * 32})
            s_health, _ = call(port, "GET", "/health")
            code = doc.get("error", {}).get("code") if isinstance(doc, dict) else None
            check(s_none == 401 and s_bad == 401 and s_abort == 401 and code == "invalid_api_key",
                  "%s: 401 invalid_api_key without or with a wrong key (/kv/abort too)"
                  % inst.name)
            check(s_health == 200, "%s: /health stays open" % inst.name)
        version = subprocess.run([args.kvpush, "--version"], capture_output=True,
                                 text=True).stdout.strip()
        for inst in (r, p, d):
            s, v = call(inst.port, "GET", "/version")
            check(s == 200 and version.startswith("kvpush " + v["version"] + " (git " +
                                                  v["git_commit"][:12]),
                  "%s: /version %s matches `kvpush --version` (%s)" % (inst.name, v, version))
        cl.stop()
        logs = {i.name: open(i.incarnations[-1]["log"]).read() for i in (p, d, r)}
        colo_log = open(os.path.join(logdir, "colo.0.log")).read()
        check(all("POST /v1/completions 200" in t and "request_id=" in t for t in logs.values()),
              "router, P and D log one access line per request with its request id")
        check("prompt_tokens=" in logs["d-yaml"] and "ttft_ms=" in logs["d-yaml"],
              "D's access line has token counts and TTFT")
        check("mode=push" in logs["router"] and "mode=pull" in logs["router"],
              "the router's access line names the mode")
        router_lines = [ln for ln in logs["router"].splitlines() if "POST /v1/completions 200" in ln]
        check(router_lines and all("prompt_tokens=" in ln and "output_tokens=16" in ln
                                   for ln in router_lines),
              "the router's access lines have the answer's token counts")
        check(any("ttft_ms=" in ln for ln in router_lines),
              "the router's access line of a streamed request has its client-side TTFT")
        check("POST /v1/completions" not in colo_log, "--disable-log-requests turns it off")
        parsed = [json.loads(line) for line in logs["p-yaml"].splitlines()
                  if line.startswith("{")]
        access = [j for j in parsed if j["message"].startswith("POST /v1/completions 200")]
        check(len(parsed) > 3 and all({"time", "level", "tid", "message"} <= set(j)
                                      for j in parsed) and access,
              "--log-format json: every log line of P is a JSON object (%d, %d access lines)"
              % (len(parsed), len(access)))
    finally:
        cl.stop()


def https_call(port, path, body, ca, key=None):
    """(status, JSON) of one request over HTTPS, the server verified against `ca`."""
    ctx = ssl.create_default_context(cafile=ca)
    c = http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=ctx)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    c.request("POST" if body is not None else "GET", path,
              json.dumps(body) if body is not None else None, headers)
    r = c.getresponse()
    doc = json.loads(r.read())
    c.close()
    return r.status, doc


def run_tls(args, logdir, model_name):
    """vLLM's --ssl-certfile/--ssl-keyfile on a colocated instance and on the router (clients
    verify a self-signed certificate for 127.0.0.1). P/D instances over TLS: tls_pd_test.py."""
    cert, keyf = os.path.join(logdir, "cert.pem"), os.path.join(logdir, "key.pem")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        keyf, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True)
    if r.returncode != 0:
        check(False, "openssl made a test certificate: %s" % r.stderr[-300:])
        return
    tls = ["--ssl-certfile", cert, "--ssl-keyfile", keyf]
    cl = Cluster(args, logdir)
    pp, dp, cp, rp = (h.free_port() for _ in range(4))
    try:
        cl.start("colo-tls", ["serve", args.model, "--port", str(cp), "--api-key", KEY] + tls)
        p = cl.start("p", vllm_line(args.model, pp, "kv_producer"))
        d = cl.start("d", vllm_line(args.model, dp, "kv_consumer"))
        cl.start("router-tls", ["router", "--port", str(rp), "--prefill", p.url, "--decode",
                                d.url] + tls)
        for u in (p, d):
            if not u.wait_healthy(90):
                raise SystemExit("%s did not start" % u.name)
        ready = subprocess.run([args.kvpush, "wait-ready", "--timeout-s", "90", "--ca-cert", cert,
                                "https://127.0.0.1:%d" % cp, "https://127.0.0.1:%d" % rp],
                               capture_output=True, text=True)
        check(ready.returncode == 0, "wait-ready --ca-cert over https: %s" % ready.stderr.strip())
        body = completion(PROMPTS[1], model_name)
        s1, a = https_call(cp, "/v1/completions", body, cert, KEY)
        s2, b = https_call(rp, "/v1/completions", body, cert)
        s3, _ = https_call(cp, "/v1/completions", body, cert)
        check(s1 == 200 and s2 == 200 and answer_key(a) == answer_key(b),
              "https: colocated and the router (push) answer alike (%d, %d)" % (s1, s2))
        check(s3 == 401, "https: the key is still required (%d)" % s3)
        try:
            plain = call(cp, "GET", "/health", timeout=5)[0]
        except (OSError, http.client.HTTPException):
            plain = "refused"
        check(plain != 200, "plain HTTP on a TLS port gets no answer (%s)" % plain)
    finally:
        cl.stop()


def run_refusals(args):
    for flags, needle in ((["--gpu-memory-utilization", "0.9"], "--kv-cache-memory-bytes"),
                          (["--dtype", "half"], "float32"),
                          (["--kv-cache-dtype", "fp8"], "only auto"),
                          (["--model", "/a.gguf", "/b.gguf"], "differ")):
        r = subprocess.run([args.kvpush, "serve", args.model] + flags if flags[0] != "--model"
                           else [args.kvpush, "serve"] + flags, capture_output=True, text=True,
                           timeout=60)
        check(r.returncode != 0 and needle in (r.stderr + r.stdout),
              "serve %s refused naming '%s' (rc %d)" % (" ".join(flags), needle, r.returncode))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print("vllm_compat: SKIPPED: no model at %s (../shared/models)" % args.model)
        return 77
    logdir = tempfile.mkdtemp(prefix="kvpush-vllm-compat-")
    model_name = os.path.basename(args.model)
    run_refusals(args)
    run_launch_lines(args, logdir, model_name)
    run_yaml_and_keys(args, logdir, model_name)
    run_tls(args, logdir, model_name)
    if FAILURES:
        h.log("%d check(s) failed; logs in %s" % (len(FAILURES), logdir))
        return 1
    h.log("all checks passed" + ("; logs in " + logdir if args.keep_logs else ""))
    if not args.keep_logs:
        subprocess.run(["rm", "-rf", logdir])
    return 0


if __name__ == "__main__":
    sys.exit(main())
