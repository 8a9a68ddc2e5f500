#!/usr/bin/env python3
"""TLS between the router and its P/D instances (issue 23; docs/router.md "TLS to instances").

P and D serve HTTPS only (--ssl-certfile/--ssl-keyfile, a CA-signed certificate for 127.0.0.1);
D verifies P's certificate for its handshake (--ssl-ca-certs); the router reaches both over
https:// URLs verified against --ssl-ca-certs and serves its own clients over HTTPS. Checks:
`kvpush wait-ready --ca-cert` over https on P, D and the router; push and pull, streamed and
not, answer token for token as a colocated instance does; D's transferred-token counter grows
(KV moved over the transfer engine, the handshake over TLS); one request with curl --cacert;
a router without the CA (the system's store) and one with another CA answer 502 naming the
certificate verification, and neither sends anything to P or D (no plain-HTTP fallback: the
instances log no request from them); with node and the npm package `openai` installed
(tests/openai_sdk, scripts/openai-sdk-setup.sh), the OpenAI Node SDK session runs through the
router over https with NODE_EXTRA_CA_CERTS (skipped, and said so, otherwise); with etcd, https
instances registered by discovery are reached over TLS too. Python 3 standard
library and the openssl and curl binaries; exit 77 (skipped) without the model.

    tests/apps/tls_pd_test.py --kvpush build/apps/kvpush \\
        --model ../shared/models/stories260K.gguf
"""

import argparse
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "tls_pd"
HERE = os.path.dirname(os.path.abspath(__file__))
SDK_DIR = os.path.join(HERE, "..", "openai_sdk")
PROMPTS = [
    "Once upon a time there was a little girl who lived in a village near the forest and she",
    "The cat sat on the mat and looked out of the window at the birds that were singing in the",
    "Tom and his dog went to the park to play with a big red ball. They ran and ran until",
]
FAILURES = h.FAILURES
check = h.check


def make_pki(d):
    """A CA, a server certificate it signed for 127.0.0.1, and an unrelated CA (openssl CLI)."""
    def run(*argv):
        r = subprocess.run(["openssl"] + list(argv), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("openssl %s failed: %s" % (argv[0], r.stderr[-400:]))
    p = {k: os.path.join(d, k + ".pem") for k in
         ("ca", "ca-key", "other-ca", "other-ca-key", "server", "server-key", "server-csr")}
    for name in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", p[name + "-key"], "-out", p[name], "-days", "1",
            "-subj", "/CN=kvpush tls_pd test %s" % name,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", p["server-key"], "-out", p["server-csr"], "-subj", "/CN=127.0.0.1")
    ext = os.path.join(d, "server.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
                "basicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", p["server-csr"], "-CA", p["ca"], "-CAkey", p["ca-key"],
        "-CAcreateserial", "-out", p["server"], "-days", "1", "-extfile", ext)
    return p


class Proc:
    """One kvpush process (serve or router) and its log."""

    def __init__(self, kvpush, name, argv, logdir, port, ca=None, env=None):
        self.name, self.port, self.ca = name, port, ca
        self.log = os.path.join(logdir, name + ".log")
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen([kvpush] + argv, stdout=f, stderr=subprocess.STDOUT,
                                         env=full_env)

    def conn(self, timeout=60):
        if self.ca is None:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        ctx = ssl.create_default_context(cafile=self.ca)
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx)

    @property
    def url(self):
        return ("https" if self.ca else "http") + "://127.0.0.1:%d" % self.port

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, text) of one request."""
        c = self.conn(timeout)
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        c.request(method, path, json.dumps(body) if body is not None else None, hdrs)
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        return r.status, text

    def wait_listening(self, timeout=90):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                return False
            if "listening on" in open(self.log).read():
                return True
            time.sleep(0.1)
        return False

    def metric(self, name):
        s, text = self.request("GET", "/metrics")
        if s != 200:
            return None
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))

    def completions_logged(self):
        return open(self.log).read().count("POST /v1/completions")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def body_for(prompt, model, stream):
    b = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    if stream:
        b["stream"] = True
    return b


def answer_of(status, text, stream):
    """(status, generated text, finish reason) of a JSON or SSE answer."""
    if status != 200:
        return status, text[:300], None
    if not stream:
        doc = json.loads(text)
        return 200, doc["choices"][0]["text"], doc["choices"][0]["finish_reason"]
    out, finish, done = "", None, False
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            return "error-event", line, None
        for c in ev.get("choices", []):
            out += c.get("text", "")
            finish = c.get("finish_reason") or finish
    return (200 if done else "no-[DONE]"), out, finish


def compare(router, colo, d, model):
    """Every prompt in push and pull, streamed and not, against colocated."""
    before = d.metric("kvpush_prompt_tokens_transferred_total") or 0
    differ = 0
    n = 0
    for mode in ("push", "pull"):
        for stream in (False, True):
            for p in PROMPTS:
                s1, t1 = router.request("POST", "/v1/completions", body_for(p, model, stream),
                                        {"x-kvpush-mode": mode})
                s2, t2 = colo.request("POST", "/v1/completions", body_for(p, model, False))
                got, want = answer_of(s1, t1, stream), answer_of(s2, t2, False)
                n += 1
                if got != want:
                    differ += 1
                    h.log("differs (%s, stream=%s): %s vs %s" % (mode, stream, got, want))
    check(differ == 0, "https router: %d push/pull answers (streamed and not) equal colocated"
          % n)
    moved = (d.metric("kvpush_prompt_tokens_transferred_total") or 0) - before
    check(moved > 0, "D received KV over the transfer engine (%d prompt tokens)" % moved)


def check_curl(router, colo, ca, model):
    if shutil.which("curl") is None:
        h.log("skip curl --cacert: no curl")
        return
    body = body_for(PROMPTS[0], model, False)
    r = subprocess.run(["curl", "-sS", "--cacert", ca, "-H", "Content-Type: application/json",
                        "-d", json.dumps(body), router.url + "/v1/completions"],
                       capture_output=True, text=True, timeout=120)
    s, t = colo.request("POST", "/v1/completions", body)
    ok = r.returncode == 0 and answer_of(200, r.stdout, False) == answer_of(s, t, False)
    check(ok, "curl --cacert over https through the router equals colocated (rc %d %s)"
          % (r.returncode, r.stderr.strip()[:200]))
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", router.url + "/health"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "certificate" in r.stderr,
          "curl without --cacert refuses the router's certificate (%s)" % r.stderr.strip()[:120])


def check_untrusting_routers(kvpush, logdir, pki, p, d, model):
    """Routers that cannot verify P's and D's certificates: 502 naming the verification, and
    nothing reaches the instances (no plain-HTTP fallback)."""
    time.sleep(0.5)  # the access lines of the requests before are written
    seen = (p.completions_logged(), d.completions_logged())
    for name, extra in (("router-system-cas", []),
                        ("router-other-ca", ["--ssl-ca-certs", pki["other-ca"]])):
        port = h.free_port()
        r = Proc(kvpush, name, ["router", "--port", str(port), "--prefill", p.url, "--decode",
                                d.url, "--health-interval-ms", "200"] + extra, logdir, port)
        try:
            if not r.wait_listening():
                check(False, "%s started: %s" % (name, h.tail(r.log)))
                continue
            for stream in (False, True):
                s, text = r.request("POST", "/v1/completions", body_for(PROMPTS[0], model, stream))
                err = json.loads(text).get("error", {}) if s == 502 else {}
                check(s == 502 and "certificate verification failed" in err.get("message", "")
                      and err.get("code") == "decode_tls_failed",
                      "%s: 502 naming certificate verification (stream=%s): %s %s"
                      % (name, stream, s, text[:240]))
            s, _ = r.request("GET", "/health")
            check(s == 503, "%s: /health 503 (no verified instance): %s" % (name, s))
            log = open(r.log).read()
            check("TLS certificate verification failed" in log,
                  "%s: its log names the refused certificate" % name)
        finally:
            r.stop()
    check((p.completions_logged(), d.completions_logged()) == seen,
          "P and D received no request from the untrusting routers (%s -> %s)"
          % (seen, (p.completions_logged(), d.completions_logged())))


def check_decode_without_ca(args, logdir, pki, p, model):
    """A D that cannot verify P (no --ssl-ca-certs: the system's store) refuses the handshake
    over TLS and fails the leg naming the verification, in push and in pull; it never
    handshakes with P in plain HTTP."""
    tls = ["--ssl-certfile", pki["server"], "--ssl-keyfile", pki["server-key"]]
    dp, rp = h.free_port(), h.free_port()
    d = Proc(args.kvpush, "d-no-ca",
             ["serve", args.model, "--port", str(dp), "--kv-transfer-config",
              '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'] + tls, logdir, dp,
             pki["ca"])
    r = Proc(args.kvpush, "router-d-no-ca", ["router", "--port", str(rp), "--prefill", p.url,
                                        "--decode", d.url, "--ssl-ca-certs", pki["ca"]],
             logdir, rp)
    try:
        if not (d.wait_listening() and r.wait_listening()):
            check(False, "D without a CA and its router started")
            return
        ready = subprocess.run([args.kvpush, "wait-ready", "--timeout-s", "60", "--ca-cert",
                                pki["ca"], d.url, r.url], capture_output=True, text=True)
        check(ready.returncode == 0, "D without a CA is ready: %s" % ready.stderr.strip())
        for mode in ("push", "pull"):
            s, text = r.request("POST", "/v1/completions", body_for(PROMPTS[0], model, False),
                                {"x-kvpush-mode": mode})
            err = json.loads(text).get("error", {}) if s == 502 else {}
            check(s == 502 and err.get("code") == "kv_peer_unavailable" and
                  "TLS certificate verification failed" in err.get("message", ""),
                  "D without --ssl-ca-certs: %s leg refused naming the verification: %s %s"
                  % (mode, s, text[:240]))
    finally:
        h.stop_all([r, d])


def start_etcd(logdir):
    """A one-node etcd on loopback (Debian's etcd-server); None without the binary."""
    etcd = shutil.which("etcd")
    if etcd is None:
        return None, None
    cp, pp = h.free_port(), h.free_port()
    argv = ["--name", "tlspd", "--data-dir", os.path.join(logdir, "etcd-data"),
            "--listen-client-urls", "http://127.0.0.1:%d" % cp,
            "--advertise-client-urls", "http://127.0.0.1:%d" % cp,
            "--listen-peer-urls", "http://127.0.0.1:%d" % pp,
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % pp,
            "--initial-cluster", "tlspd=http://127.0.0.1:%d" % pp]
    with open(os.path.join(logdir, "etcd.log"), "w") as f:
        proc = subprocess.Popen([etcd] + argv, stdout=f, stderr=subprocess.STDOUT)
    return proc, cp


def check_discovery(args, logdir, pki, colo, model):
    """Instances serving TLS register https:// URLs in etcd; a router that learns them there
    reaches them over verified TLS (push and pull answers equal colocated)."""
    etcd, etcd_port = start_etcd(logdir)
    if etcd is None:
        h.log("skip discovery over https: no etcd binary (Debian: etcd-server)")
        return
    tls = ["--ssl-certfile", pki["server"], "--ssl-keyfile", pki["server-key"]]
    disc = ["--discovery", "etcd://127.0.0.1:%d" % etcd_port, "--discovery-prefix", "/tlspd/"]
    kv = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
    pp, dp, rp = h.free_port(), h.free_port(), h.free_port()
    procs = []
    try:
        p = Proc(args.kvpush, "p-etcd", ["serve", args.model, "--port", str(pp),
                                         "--kv-transfer-config", kv % "kv_producer"] + tls + disc,
                 logdir, pp, pki["ca"])
        d = Proc(args.kvpush, "d-etcd", ["serve", args.model, "--port", str(dp),
                                         "--kv-transfer-config", kv % "kv_consumer",
                                         "--ssl-ca-certs", pki["ca"]] + tls + disc,
                 logdir, dp, pki["ca"])
        r = Proc(args.kvpush, "router-etcd", ["router", "--port", str(rp), "--ssl-ca-certs",
                                              pki["ca"]] + disc, logdir, rp)
        procs = [p, d, r]
        ready = subprocess.run([args.kvpush, "wait-ready", "--timeout-s", "90", "--ca-cert",
                                pki["ca"], p.url, d.url, r.url], capture_output=True, text=True)
        check(ready.returncode == 0, "discovery: https P and D registered, the router ready: %s"
              % ready.stderr.strip())
        if ready.returncode != 0:
            return
        s, text = r.request("GET", "/health")
        urls = sorted(i["url"] for i in json.loads(text).get("instances", []))
        check(urls == sorted([p.url, d.url]),
              "discovery: the router learned the https:// URLs from etcd: %s" % urls)
        same = True
        for mode in ("push", "pull"):
            body = body_for(PROMPTS[2], model, False)
            s1, t1 = r.request("POST", "/v1/completions", body, {"x-kvpush-mode": mode})
            s2, t2 = colo.request("POST", "/v1/completions", body)
            same = same and answer_of(s1, t1, False) == answer_of(s2, t2, False)
        check(same, "discovery: push and pull over https equal colocated")
    finally:
        h.stop_all(procs)
        etcd.terminate()
        etcd.wait(timeout=30)


def check_sdk(router, ca):
    node = shutil.which("node")
    if node is None or not os.path.exists(os.path.join(SDK_DIR, "node_modules", "openai",
                                                       "package.json")):
        h.log("skip the OpenAI Node SDK over https: node or %s/node_modules/openai absent "
              "(scripts/openai-sdk-setup.sh)" % SDK_DIR)
        return
    env = dict(os.environ, NODE_EXTRA_CA_CERTS=ca)
    r = subprocess.run([node, os.path.join(SDK_DIR, "session.mjs"), router.url + "/v1", "push"],
                       capture_output=True, text=True, timeout=300, env=env)
    h.log("node session.mjs: " + r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
    check(r.returncode == 0, "the OpenAI Node SDK session over https (NODE_EXTRA_CA_CERTS): %s"
          % (r.stdout + r.stderr).strip()[-400:])


def run(args, logdir):
    pki = make_pki(logdir)
    ca = pki["ca"]
    tls = ["--ssl-certfile", pki["server"], "--ssl-keyfile", pki["server-key"]]
    model = os.path.basename(args.model)
    pp, dp, cp, rp = (h.free_port() for _ in range(4))
    kv = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
    procs = []
    try:
        p = Proc(args.kvpush, "p", ["serve", args.model, "--port", str(pp), "--kv-transfer-config",
                                    kv % "kv_producer"] + tls, logdir, pp, ca)
        d = Proc(args.kvpush, "d", ["serve", args.model, "--port", str(dp), "--kv-transfer-config",
                                    kv % "kv_consumer", "--ssl-ca-certs", ca] + tls, logdir, dp,
                 ca)
        colo = Proc(args.kvpush, "colo", ["serve", args.model, "--port", str(cp)], logdir, cp)
        router = Proc(args.kvpush, "router", ["router", "--port", str(rp), "--prefill", p.url,
                                              "--decode", d.url, "--ssl-ca-certs", ca] + tls,
                      logdir, rp, ca)
        procs = [p, d, colo, router]
        ready = subprocess.run([args.kvpush, "wait-ready", "--timeout-s", "120", "--ca-cert", ca,
                                p.url, d.url, router.url, colo.url],
                               capture_output=True, text=True)
        check(ready.returncode == 0,
              "kvpush wait-ready --ca-cert: https P, D and router ready: %s" % ready.stderr.strip())
        if ready.returncode != 0:
            for x in procs:
                h.log("---- %s\n%s" % (x.name, h.tail(x.log)))
            return
        for x in (p, d, router):
            check("listening on https://" in open(x.log).read(), "%s serves HTTPS" % x.name)
        compare(router, colo, d, model)
        plog = open(p.log).read()
        check("POST /kv/handshake 200" in plog and "kv_peer_unavailable" not in
              open(d.log).read(), "D handshook with P over TLS (P serves HTTPS only)")
        check_curl(router, colo, ca, model)
        check_untrusting_routers(args.kvpush, logdir, pki, p, d, model)
        check_decode_without_ca(args, logdir, pki, p, model)
        check_discovery(args, logdir, pki, colo, model)
        check_sdk(router, ca)
    finally:
        h.stop_all(procs)
    for x in procs:
        check(x.proc.returncode == 0, "%s exited 0 on SIGTERM (%s)" % (x.name, x.proc.returncode))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print("tls_pd: SKIPPED: no model at %s (../shared/models)" % args.model)
        return 77
    if shutil.which("openssl") is None:
        print("tls_pd: SKIPPED: no openssl binary to make the test certificates")
        return 77
    logdir = tempfile.mkdtemp(prefix="kvpush-tls-pd-")
    run(args, logdir)
    if FAILURES:
        h.log("%d check(s) failed; logs in %s" % (len(FAILURES), logdir))
        return 1
    h.log("all checks passed" + ("; logs in " + logdir if args.keep_logs else ""))
    if not args.keep_logs:
        shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
