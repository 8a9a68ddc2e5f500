#!/usr/bin/env python3
"""kvpush's metrics read by a real Prometheus server, and the Grafana dashboard that ships with it
(issue 23 item 3; packaging/grafana/kvpush-dashboard.json, docs/server.md "Metrics").

A router, a prefill and a decode instance run under a short load of push and pull requests,
streamed and not; Debian's `prometheus` scrapes all three every second. Checks:
  - every target scrapes (`up` == 1): Prometheus's own parser accepts each /metrics page;
  - every query of every panel of the dashboard returns a non-empty result with a finite value
    ($model_name = the served model, $__rate_interval = 5m);
  - the families vLLM's example Grafana dashboard reads (examples/online_serving/
    prometheus_grafana) exist on the instances under vLLM's names, with the model_name label.
Python 3 standard library only; exit 77 (skipped) without the model or without `prometheus`.

    tests/apps/prometheus_dashboard_test.py --kvpush build/apps/kvpush \\
        --model ../shared/models/stories260K.gguf \\
        --dashboard packaging/grafana/kvpush-dashboard.json
"""

import argparse
import http.client
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "prometheus_dashboard"
FAILURES = h.FAILURES
check = h.check
# The families vLLM's example dashboard queries (names only; the dashboard is vLLM's).
VLLM_EXAMPLE_FAMILIES = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
    "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_sum",
]
PROMPTS = [
    "Once upon a time there was a little girl who lived in a village near the forest and she",
    "The cat sat on the mat and looked out of the window at the birds that were singing in the",
    "Tom and his dog went to the park to play with a big red ball. They ran and ran until",
]


def request(port, body, mode, stream):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=stream)),
              {"Content-Type": "application/json", "x-kvpush-mode": mode})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def prom_query(port, expr):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    doc = json.loads(c.getresponse().read())
    c.close()
    return doc


def finite_values(doc):
    out = []
    for s in doc.get("data", {}).get("result", []):
        v = float(s["value"][1])
        if not math.isnan(v) and not math.isinf(v):
            out.append(v)
    return out


def panel_queries(dashboard, model_name):
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"].replace("$model_name", model_name)
            yield p["title"], t["refId"], expr.replace("$__rate_interval", "5m")


def start_prometheus(prom, logdir, port, targets):
    cfg = os.path.join(logdir, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                "scrape_configs:\n  - job_name: kvpush\n    static_configs:\n"
                "      - targets: [%s]\n" % ", ".join("'127.0.0.1:%d'" % t for t in targets))
    log = open(os.path.join(logdir, "prometheus.log"), "w")
    return subprocess.Popen([prom, "--config.file=" + cfg,
                             "--storage.tsdb.path=" + os.path.join(logdir, "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % port],
                            stdout=log, stderr=subprocess.STDOUT)


def wait_prometheus(port, n_targets, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            ups = prom_query(port, "up")
            if len(ups.get("data", {}).get("result", [])) == n_targets:
                return True
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    return False


def run(args, logdir):
    model_name = os.path.basename(args.model)
    pp, dp, rp, mp = (h.free_port() for _ in range(4))
    procs = []

    def serve(name, argv, port):
        inst = h.Instance(name, argv, "127.0.0.1", port, logdir, args.kvpush)
        inst.start()
        procs.append(inst)
        return inst

    prom = None
    try:
        cfg = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
        p = serve("p", ["serve", args.model, "--port", str(pp), "--kv-transfer-config",
                        cfg % "kv_producer"], pp)
        d = serve("d", ["serve", args.model, "--port", str(dp), "--kv-transfer-config",
                        cfg % "kv_consumer"], dp)
        serve("router", ["router", "--port", str(rp), "--prefill", p.url, "--decode", d.url], rp)
        for inst in procs:
            if not inst.wait_healthy(90):
                raise SystemExit("%s did not become healthy" % inst.name)
        prom = start_prometheus(args.prometheus, logdir, mp, [rp, pp, dp])
        check(wait_prometheus(mp, 3), "Prometheus is up with 3 targets")
        # A short load over several scrapes: push and pull, streamed and not.
        statuses = []
        for rnd in range(args.rounds):
            for i, prompt in enumerate(PROMPTS):
                # A new first block each round: D's prefix cache cannot make the KV moot.
                body = {"model": model_name, "prompt": "Round %d. %s" % (rnd, prompt),
                        "max_tokens": 12 + 4 * i,
                        "temperature": 0}
                for mode in ("push", "pull"):
                    for stream in (False, True):
                        statuses.append(request(rp, body, mode, stream))
            time.sleep(0.7)
        check(all(s == 200 for s in statuses), "%d requests answered 200" % len(statuses))
        time.sleep(3)  # at least two scrapes after the load
        ups = prom_query(mp, "up")["data"]["result"]
        check(len(ups) == 3 and all(u["value"][1] == "1" for u in ups),
              "every /metrics page parses (up == 1 for router, P and D): %s" %
              [(u["metric"]["instance"], u["value"][1]) for u in ups])
        dashboard = json.load(open(args.dashboard))
        n = 0
        for title, ref, expr in panel_queries(dashboard, model_name):
            doc = prom_query(mp, expr)
            vals = finite_values(doc) if doc.get("status") == "success" else []
            check(bool(vals), "panel '%s' query %s returns data (%d series): %s" %
                  (title, ref, len(doc.get("data", {}).get("result", [])), expr[:110]))
            n += 1
        check(n >= 20, "%d panel queries checked" % n)
        for fam in VLLM_EXAMPLE_FAMILIES:
            doc = prom_query(mp, 'count(%s{model_name="%s"})' % (fam, model_name))
            check(bool(finite_values(doc)), "vLLM's example dashboard family %s exists" % fam)
        # Semantics spot checks: the router saw every request in its mode; D's transferred
        # tokens are KV that came from P.
        for mode in ("push", "pull"):
            doc = prom_query(mp, 'kvpush_router_e2e_request_latency_seconds_count{mode="%s"}' %
                             mode)
            vals = finite_values(doc)
            check(vals and vals[0] == len(statuses) / 2,
                  "router e2e histogram counted every %s request (%s)" % (mode, vals))
        doc = prom_query(mp, "vllm:external_prefix_cache_hits_total{instance='127.0.0.1:%d'}" % dp)
        check(finite_values(doc) and finite_values(doc)[0] > 0,
              "D's external prefix-cache hits (tokens transferred) > 0: %s" % finite_values(doc))
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        h.stop_all(procs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print("prometheus_dashboard: SKIPPED: no model at %s (../shared/models)" % args.model)
        return 77
    if not args.prometheus:
        print("prometheus_dashboard: SKIPPED: no prometheus binary (Debian package prometheus; "
              "scripts/setup-debian.sh installs it)")
        return 77
    logdir = tempfile.mkdtemp(prefix="kvpush-prometheus-")
    run(args, logdir)
    if FAILURES:
        print("prometheus_dashboard: %d check(s) failed; logs in %s" % (len(FAILURES), logdir))
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    print("prometheus_dashboard: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
