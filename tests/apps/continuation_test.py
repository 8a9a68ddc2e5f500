#!/usr/bin/env python3
"""Continuation after a failed decode instance (issue 24 item 3; docs/reliability.md
"Continuation").

Part 1, the resume table (stories260K, one colocated instance): for every case (completions and
chat; greedy; seeded sampling with penalties; logprobs; a stop string that ends the answer;
min_tokens; n = 2 seeded) a reference stream with `x-kvpush-resume-info: 1`, then, cut after the
first e events for e in {0, the first token, the middle, one token before the end}, the request
again with `kvpush_resume` built from the comments of those events (as the router's ResumeLedger
builds it). The reference's first e events followed by the continuation's events must equal the
reference, choice by choice (data apart from id and created; usage; [DONE]).

Part 2, crashes (and an operator's move, POST /admin/migrate) through the router (a generated model slow enough to kill mid-stream): a colocated
reference instance, P, D1 and D2 behind a router. For push and pull, streamed: after a few events
the decode instance running the request is SIGKILLed; the client's one stream must equal the
colocated reference and the router must count one continuation. Not streamed: the same, the
answer sent again whole. Drain: a D with --drain-timeout-s 1 gets SIGTERM mid-stream; the stream
goes on on the other D. Then the router in --colocated mode over two colocated instances.
Exit 77 (skipped) without the model.

    tests/apps/continuation_test.py --kvpush build/apps/kvpush \\
        --model ../shared/models/stories260K.gguf
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
import kvpush_harness as h  # noqa: E402

h.LOG_PREFIX = "continuation"
FAILURES = h.FAILURES
check = h.check
PROMPT = "Once upon a time there was a little girl who"
RESUME = {"x-kvpush-resume-info": "1"}


def post(port, path, body, headers=None, timeout=120):
    """(status, raw body text)."""
    hd = {"Content-Type": "application/json"}
    hd.update(headers or {})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), hd)
    r = c.getresponse()
    raw = r.read().decode("utf-8", "replace")
    c.close()
    return r.status, raw


def parse_events(raw):
    """[(data text or None, resume info dict or None)] of an SSE body."""
    out = []
    for ev in raw.split("\n\n"):
        if not ev.strip():
            continue
        data, info = None, None
        for line in ev.split("\n"):
            if line.startswith("data: "):
                data = line[6:]
            elif line.startswith(": kvpush-resume "):
                info = json.loads(line[len(": kvpush-resume "):])
        out.append((data, info))
    return out


def norm(data):
    """A data event without what may differ between two runs (id, created)."""
    if data is None or data == "[DONE]":
        return data
    j = json.loads(data)
    j.pop("id", None)
    j.pop("created", None)
    return j


def per_choice(datas):
    """Data events grouped by choice index (the interleaving of choices may differ); the
    choice-less tail (usage, [DONE]) under "tail"."""
    out = {}
    for d in datas:
        j = norm(d)
        if isinstance(j, dict) and j.get("choices"):
            out.setdefault(j["choices"][0]["index"], []).append(j)
        else:
            out.setdefault("tail", []).append(j)
    return out


def ledger(events):
    """kvpush_resume from the comments of `events` (what router/resume_ledger.cc builds)."""
    choices = {}
    usage_sent = any(d and '"usage":{' in d for d, _ in events)
    for _, info in events:
        if info is None:
            continue
        c = choices.setdefault(info["index"], {"index": info["index"], "token_ids": [],
                                               "text_bytes": 0, "finished": False})
        c["token_ids"] += info["token_ids"]
        c["text_bytes"] = info["text_bytes"]
        c["finished"] = c["finished"] or info["finished"]
    out = {"choices": [choices[k] for k in sorted(choices)]}
    if usage_sent:
        out["usage_sent"] = True
    return out


CASES = [
    ("completions greedy", "/v1/completions", {"temperature": 0, "max_tokens": 24}),
    ("completions seeded, penalties", "/v1/completions",
     {"temperature": 0.9, "top_p": 0.9, "seed": 11, "max_tokens": 30, "presence_penalty": 0.5,
      "frequency_penalty": 0.3, "repetition_penalty": 1.1}),
    ("completions logprobs, usage", "/v1/completions",
     {"temperature": 0.8, "seed": 3, "max_tokens": 20, "logprobs": 3,
      "stream_options": {"include_usage": True}}),
    ("completions stop string, min_tokens", "/v1/completions",
     {"temperature": 0, "max_tokens": 60, "min_tokens": 4, "stop": None}),
    ("completions n=2 seeded, echo", "/v1/completions",
     {"temperature": 1.0, "seed": 5, "max_tokens": 16, "n": 2, "echo": True,
      "stream_options": {"include_usage": True}}),
    ("chat seeded, logprobs", "/v1/chat/completions",
     {"temperature": 0.7, "seed": 9, "max_tokens": 20, "logprobs": True, "top_logprobs": 2,
      "stream_options": {"include_usage": True}}),
    ("chat n=2 greedy", "/v1/chat/completions", {"temperature": 0, "max_tokens": 12, "n": 2}),
    # No seed: the instance draws one; its resume comments carry it and the continuation (as
    # the router builds it) samples with it.
    ("completions unseeded sampling", "/v1/completions", {"temperature": 1.0, "max_tokens": 20}),
]


def case_body(path, params, stop_from=None):
    body = {"stream": True}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    body.update(params)
    if "stop" in body:
        body["stop"] = stop_from
    return body


def resume_table(args, logdir):
    port = h.free_port()
    inst = h.Instance("colocated", ["serve", args.model, "--port", str(port)], "127.0.0.1", port,
                      logdir, args.kvpush)
    inst.start()
    try:
        if not inst.wait_healthy(60):
            check(False, "the colocated instance became healthy")
            return
        for name, path, params in CASES:
            stop = None
            if "stop" in params:
                # A stop string from the greedy answer's middle: it ends this answer.
                _, raw = post(port, "/v1/completions",
                              {"prompt": PROMPT, "temperature": 0, "max_tokens": 60})
                text = json.loads(raw)["choices"][0]["text"]
                stop = [text[len(text) // 2:len(text) // 2 + 5]]
            body = case_body(path, params, stop)
            status, raw = post(port, path, body, RESUME)
            ref = parse_events(raw)
            if status != 200 or not ref:
                check(False, "%s: reference stream (%d %s)" % (name, status, raw[:200]))
                continue
            if stop is not None:
                finishes = [norm(d)["choices"][0].get("stop_reason") for d, _ in ref
                            if isinstance(norm(d), dict) and norm(d).get("choices")
                            and norm(d)["choices"][0].get("finish_reason")]
                check(finishes == stop, "%s: the stop string %r ends the reference" % (name, stop))
            with_token = [i for i, (_, info) in enumerate(ref) if info and info["token_ids"]]
            cuts = {0, with_token[0] + 1, with_token[len(with_token) // 2] + 1, with_token[-2] + 1}
            # After every choice finished (only usage and [DONE], or [DONE], left), and after
            # the usage chunk (only [DONE] left).
            cuts.add(with_token[-1] + 1)
            cuts |= {i + 1 for i, (d, _) in enumerate(ref) if d and '"usage":{' in d}
            cuts = sorted(cuts)
            want = per_choice([d for d, _ in ref if d is not None])
            seeds = {info["seed"] for _, info in ref if info}
            check(len(seeds) == 1 and ("seed" not in body or seeds == {body["seed"]}),
                  "%s: the resume comments carry the request's seed (%s)" % (name, seeds))
            for e in cuts:
                cont = dict(body)
                cont["kvpush_resume"] = ledger(ref[:e])
                if "seed" not in cont:
                    cont["seed"] = next(iter(seeds))  # what router/continuation_flow.cc adds
                status, raw2 = post(port, path, cont, RESUME)
                spliced = [d for d, _ in ref[:e] if d is not None]
                spliced += [d for d, _ in parse_events(raw2) if d is not None]
                got = per_choice(spliced)
                same = status == 200 and got == want
                check(same, "%s: continued after %d of %d events (%d tokens): the spliced "
                      "stream equals the uninterrupted one" % (
                          name, e, len(ref), sum(len(c["token_ids"])
                                                 for c in cont["kvpush_resume"]["choices"])))
                if not same:
                    h.log("  status %d; continuation: %s" % (status, raw2[:600]))
        # Refusals: a continuation that could not have come from a run still going.
        body = case_body("/v1/completions", {"temperature": 0, "max_tokens": 8})
        _, raw = post(port, "/v1/completions", body, RESUME)
        led = ledger(parse_events(raw)[:3])
        bad = dict(body, kvpush_resume={"choices": [dict(led["choices"][0],
                                                         text_bytes=led["choices"][0]
                                                         ["text_bytes"] + 1)]})
        status, raw = post(port, "/v1/completions", bad)
        check(status == 400 and "text_bytes" in raw,
              "a continuation whose text_bytes do not match its tokens: 400 (%d %s)"
              % (status, raw[:160]))
        status, raw = post(port, "/v1/completions",
                           dict(body, stream=False, kvpush_resume={"choices": []}))
        check(status == 400 and "kvpush_resume" in raw,
              "kvpush_resume without stream: 400 (%d)" % status)
        full = dict(body, kvpush_resume={"choices": [{"index": 0, "token_ids": [5] * 8}]})
        status, raw = post(port, "/v1/completions", full)
        check(status == 400 or "max_tokens" in raw,
              "a continuation already at max_tokens is refused (%d %s)" % (status, raw[:160]))
    finally:
        h.stop_all([inst])


# ------------------------------------------------------------------------------------------------
# Part 2: crashes through the router


def running(inst):
    m = inst.metrics(timeout=2.0)
    return (m or {}).get("vllm:num_requests_running", 0.0)


class Cluster:
    def __init__(self, args, logdir, model):
        self.args, self.logdir, self.model = args, logdir, model
        self.procs = []

    def serve(self, name, argv):
        port = h.free_port()
        inst = h.Instance(name, argv + ["--port", str(port)], "127.0.0.1", port, self.logdir,
                          self.args.kvpush)
        inst.start()
        self.procs.append(inst)
        return inst

    def wait(self, insts):
        for inst in insts:
            if not inst.wait_healthy(90):
                raise SystemExit("%s did not become healthy: %s" % (
                    inst.name, h.tail(inst.incarnations[-1]["log"])))

    def restart(self, inst):
        if inst.proc.poll() is None:
            inst.kill()
        inst.start()
        self.wait([inst])


def stream_and_fail(router_port, path, body, serving, fail, headers=None, after_events=4):
    """Sends `body` streamed through the router; once `after_events` events arrived, applies
    `fail` to the instance of `serving` running it. Returns (status, raw body, failed instance)."""
    hd = {"Content-Type": "application/json"}
    hd.update(headers or {})
    c = http.client.HTTPConnection("127.0.0.1", router_port, timeout=120)
    c.request("POST", path, json.dumps(body), hd)
    r = c.getresponse()
    raw = b""
    victim = None
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        raw += chunk
        if victim is None and raw.count(b"\n\n") >= after_events:
            for inst in serving:
                if running(inst) > 0:
                    victim = inst
                    fail(inst)
                    break
            if victim is None:
                victim = False  # finished before it could be failed
    c.close()
    return r.status, raw.decode("utf-8", "replace"), victim


def router_sees(router, url, healthy, timeout=15.0):
    """Waits until the router's GET /health lists `url` as healthy (or not); returns whether
    it did within `timeout`."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", router.port, timeout=5)
            c.request("GET", "/health")
            doc = json.loads(c.getresponse().read())
            c.close()
            if any(i["url"] == url and i["healthy"] == healthy for i in doc.get("instances", [])):
                return True
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.05)
    return False


def log_has(inst, text):
    with open(inst.incarnations[-1]["log"], errors="replace") as f:
        return text in f.read()


def ucx_wireup_abort(inst):
    """True when `inst`'s current process was aborted by UCX 1.13's wireup assertion."""
    return inst.proc.poll() is not None and log_has(inst, "got REP message")


def kv_counters(insts, reset=False):
    """Per instance: (prompt tokens it got as pushed KV, KV-load recomputes). `reset`: empty
    their prefix caches first (an earlier case's continuation may have cached this very context:
    a new D with every block cached takes no KV, as it should)."""
    out = {}
    for inst in insts:
        if reset:
            post(inst.port, "/reset_prefix_cache", {})
        m = inst.metrics(timeout=5.0) or {}
        out[inst.url] = (m.get("kvpush_prompt_tokens_transferred_total", 0.0),
                         m.get("kvpush_kv_load_recomputes_total", 0.0))
    return out


def pushed_move_check(label, before, after, router, raw, prompt_tokens):
    """A move by push: the new D got the whole context (prompt + the tokens streamed before the
    move) as pushed KV and recomputed nothing (docs/reliability.md, *Migration*)."""
    grew = {u: after[u][0] - before[u][0] for u in after if u in before}
    recomputed = {u: after[u][1] - before[u][1] for u in after if u in before}
    got = sum(grew.values())
    streamed = len(per_choice([d for d, _ in parse_events(raw) if d is not None]).get(0, []))
    check(got > prompt_tokens and got < prompt_tokens + streamed and
          not any(recomputed.values()) and log_has(router, "with the context's KV pushed from"),
          "%s: the new D took prompt + streamed tokens as pushed KV (%d of %d + %d), recomputed "
          "nothing (%s)" % (label, got, prompt_tokens, streamed, recomputed))
    # Two rounds: the first while the stream went on, and none failed.
    check(log_has(router, "pushing its context") and
          not log_has(router, "first round of its move to"),
          "%s: the move's first round pushed the context while the stream went on" % label)


def move_stream(router, ds, body, rid, after_events):
    """Streams completion `body` (x-request-id `rid`) through the router and asks POST
    /admin/migrate after `after_events` events, the Ds' prefix caches emptied first. Returns
    (status, raw stream, the D it ran on, tokens the Ds took as pushed KV, KV-load recomputes)."""
    before = kv_counters(ds, reset=True)
    status, raw, victim = stream_and_fail(
        router.port, "/v1/completions", body, list(ds),
        lambda _i: post(router.port, "/admin/migrate", {"request_id": rid}),
        {"x-request-id": rid}, after_events=after_events)
    after = kv_counters(ds)
    return (status, raw, victim, sum(after[u][0] - before[u][0] for u in after),
            sum(after[u][1] - before[u][1] for u in after))


def same_stream(raw, ref_raw):
    a = per_choice([d for d, _ in parse_events(raw) if d is not None])
    b = per_choice([d for d, _ in parse_events(ref_raw) if d is not None])
    return a == b


def stream_text(raw):
    """The concatenated text of a stream's choice 0 (completions or chat)."""
    out = ""
    for d, _ in parse_events(raw):
        if d is None or d == "[DONE]":
            continue
        for c in json.loads(d).get("choices", []):
            out += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return out


def moved_cases(router, colo, d1, d2, cl):
    """Migration by push beyond the basic move: chat with a stop string that ends the answer
    after the move (held-back text replayed), a move at the first token, and the source SIGKILLed
    while the move's first round runs (the stream is continued as after any crash)."""
    chat = {"messages": [{"role": "user", "content": "tell me a story"}], "max_tokens": 200,
            "temperature": 0.7, "seed": 9, "stream": True, "logprobs": True, "top_logprobs": 2,
            "frequency_penalty": 0.3}
    _, ref = post(colo.port, "/v1/chat/completions", chat)
    text = stream_text(ref)
    stop = None
    for at in range(len(text) * 2 // 3, len(text) - 4):
        cand = text[at:at + 4]
        if cand.strip() and text.find(cand) == at:
            stop = cand
            break
    if stop is None:
        check(False, "no stop string found in the reference chat text")
        return
    chat["stop"] = [stop]
    _, ref = post(colo.port, "/v1/chat/completions", chat)
    n = 0

    def move(_inst):
        post(router.port, "/admin/migrate", {"request_id": "move-me-%d" % n})

    for label, after, path, body, ref_raw in [
            ("chat with a stop string, moved mid-stream", 30, "/v1/chat/completions", chat, ref),
            ("chat with a stop string, moved at the first token", 2, "/v1/chat/completions",
             chat, ref)]:
        n += 1
        status, raw, victim = stream_and_fail(router.port, path, body, [d1, d2], move,
                                              {"x-request-id": "move-me-%d" % n}, after_events=after)
        check(victim and status == 200 and same_stream(raw, ref_raw),
              "%s: the stream equals the colocated run (%d, %d events)" % (
                  label, status, len(parse_events(raw))))
    # Greedy, moved mid-stream; and a move asked two tokens before the end, which the stream's
    # end overtakes (its first round takes longer than two tokens): the stream ends on the
    # source, unchanged, and the ask is answered 409 not_moved.
    greedy = {"prompt": "tell me a story", "max_tokens": 120, "temperature": 0,
              "ignore_eos": True, "stream": True}
    _, ref = post(colo.port, "/v1/completions", greedy)
    answers = {}

    def move_late(_inst):
        answers["late"] = post(router.port, "/admin/migrate", {"request_id": "move-me-late"})

    for label, rid, after, fail in [("greedy, moved mid-stream", "move-me-greedy", 40, None),
                                    ("greedy, a move asked 2 tokens before the end",
                                     "move-me-late", 119, move_late)]:
        status, raw, victim = stream_and_fail(
            router.port, "/v1/completions", greedy, [d1, d2],
            fail or (lambda _i, rid=rid: post(router.port, "/admin/migrate", {"request_id": rid})),
            {"x-request-id": rid}, after_events=after)
        check(status == 200 and same_stream(raw, ref),
              "%s: the stream equals the colocated run (%d)" % (label, status))
    late = answers.get("late")
    check(late is None or late[0] in (200, 409),
          "a move asked 2 tokens before the end: moved or 409 not_moved, never an error (%s)" % (
              late and late[0]))
    # n = 2, seeded: each choice's context (prompt + its own output) is a sequence of its own,
    # pushed in a first round of its own; the switch continues both choices on the target.
    two = {"prompt": "tell me a story", "max_tokens": 90, "temperature": 0.9, "seed": 4, "n": 2,
           "ignore_eos": True, "logprobs": 1, "stream": True}
    _, ref = post(colo.port, "/v1/completions", two)
    _, tok = post(colo.port, "/tokenize", {"prompt": two["prompt"]})
    prompt_tokens = json.loads(tok)["count"]
    status, raw, victim, got, recomputed = move_stream(router, (d1, d2), two, "move-me-n2", 70)
    streamed = sum(len(v) for v in per_choice([d for d, _ in parse_events(raw)
                                               if d is not None]).values())
    check(victim and status == 200 and same_stream(raw, ref),
          "n = 2, moved mid-stream: both choices equal the colocated run (%d)" % status)
    check(got > 2 * prompt_tokens and got < 2 * prompt_tokens + streamed and recomputed == 0
          and log_has(router, "2 sequence(s)"),
          "n = 2, moved mid-stream: the new D took both choices' contexts as pushed KV in two "
          "first rounds (%d of 2 x %d + %d), recomputed nothing" % (got, prompt_tokens, streamed))
    # min_tokens above what was streamed at the move: the first round's one-token D leg clamps
    # it (a D leg refuses min_tokens > max_tokens), so the stream still moves with its KV.
    mt = {"prompt": "tell me a story", "max_tokens": 120, "min_tokens": 100, "temperature": 0.8,
          "seed": 17, "logprobs": 1, "stream": True}  # logprobs: an event per token
    _, ref = post(colo.port, "/v1/completions", mt)
    status, raw, victim, got, recomputed = move_stream(router, (d1, d2), mt, "move-me-min", 30)
    check(victim and status == 200 and same_stream(raw, ref) and got > prompt_tokens and
          recomputed == 0 and not log_has(router, "min_tokens must be"),
          "min_tokens 100, moved after 30 tokens: equals the colocated run, KV pushed (%d "
          "tokens; victim %s, status %d)" % (got, victim and victim.name, status))
    # Not streamed, the chat with a stop string that ends it after the hand-back (the text the
    # first D held back is the continuation's to emit), penalties and top logprobs.
    whole_chat = dict(chat, stream=False)
    status, a, b, victim = whole_and_fail(router, colo, "/v1/chat/completions", whole_chat,
                                          (d1, d2),
                                          lambda inst: inst.proc.send_signal(signal.SIGTERM))
    handed = handed_back_tokens(router)
    check(victim and status == 200 and a == b and handed and handed[-1] > 0,
          "chat with a stop string, not streamed, SIGTERM mid-answer: handed back (%s token(s)), "
          "the answer equals the colocated run (%d)" % (handed and handed[-1], status))
    if victim:
        victim.proc.wait(timeout=30)
        cl.restart(victim)
        router_sees(router, victim.url, True)
    # The source, or the target, dies while the first round pushes the context: a dead source
    # is a crash (continued as such), a dead target leaves the stream on its source.
    _, ref = post(colo.port, "/v1/completions", dict(chat_free(chat)))
    for who in ("source", "target"):
        rid = "move-me-kill-" + who
        killed = []

        def move_and_kill(inst, rid=rid, who=who, killed=killed):
            dead = inst if who == "source" else (d2 if inst is d1 else d1)
            t = threading.Thread(target=post, args=(router.port, "/admin/migrate",
                                                    {"request_id": rid}))
            t.start()
            time.sleep(0.01)
            dead.kill()
            killed.append(dead)
            t.join()

        status, raw, victim = stream_and_fail(router.port, "/v1/completions", chat_free(chat),
                                              [d1, d2], move_and_kill, {"x-request-id": rid},
                                              after_events=30)
        label = "%s SIGKILLed during the move's first round" % who
        # The survivor lives: connections wire up one way (UCX client-server on tcp, docs/xfer.md
        # "Wire-up"), so a peer dying mid-wire-up is an ordinary connection error for it.
        dead = [i for i in (d1, d2) if i not in killed and i.proc.poll() is not None]
        check(not dead, "%s: the other D lives (%s)" % (
            label, ["%s (%s)" % (i.name, "UCX wire-up abort" if ucx_wireup_abort(i) else
                                 "exit %s" % i.proc.returncode) for i in dead]))
        killed.extend(dead)
        check(victim and status == 200 and same_stream(raw, ref),
              "%s: the stream equals the colocated run (%d)" % (label, status))
        for inst in killed:
            inst.proc.wait(timeout=30)
            cl.restart(inst)
            router_sees(router, inst.url, True)


def chat_free(chat):
    """The chat case as a completion (prompt text, no chat-only fields)."""
    body = {k: v for k, v in chat.items() if k not in ("messages", "top_logprobs", "logprobs")}
    body["prompt"] = "tell me a story"
    body["logprobs"] = 2
    return body


def crash_cases(args, logdir):
    model = os.path.join(logdir, "slow.gguf")
    subprocess.run([args.kvpush, "gen-model", "--out", model, "--context", "1024"], check=True,
                   stdout=subprocess.DEVNULL)
    cl = Cluster(args, logdir, model)
    try:
        cfg = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
        colo = cl.serve("colocated", ["serve", model])
        p = cl.serve("p", ["serve", model, "--kv-transfer-config", cfg % "kv_producer"])
        d1 = cl.serve("d1", ["serve", model, "--kv-transfer-config", cfg % "kv_consumer",
                             "--drain-timeout-s", "1.5"])
        d2 = cl.serve("d2", ["serve", model, "--kv-transfer-config", cfg % "kv_consumer",
                             "--drain-timeout-s", "1.5"])
        cl.wait([colo, p, d1, d2])
        router = cl.serve("router", ["router", "--prefill", p.url, "--decode", d1.url,
                                     "--decode", d2.url, "--health-interval-ms", "200"])
        cl.wait([router])
        status, raw = post(router.port, "/v1/completions",
                           {"prompt": "hi", "stream": True, "kvpush_resume": {"choices": []}})
        check(status == 400 and "kvpush_resume" in raw,
              "a client's own kvpush_resume through the router: 400 (%d)" % status)
        body = {"prompt": "hello world", "max_tokens": 300, "ignore_eos": True,
                "temperature": 0.9, "seed": 21, "logprobs": 1, "stream": True,
                "stream_options": {"include_usage": True}}
        _, ref = post(colo.port, "/v1/completions", body)
        conts = 0.0
        _, tok = post(colo.port, "/tokenize", {"prompt": body["prompt"]})
        prompt_tokens = json.loads(tok)["count"]
        for mode, fail_name in [("push", "SIGKILL"), ("pull", "SIGKILL"), ("push", "SIGTERM"),
                                ("pull", "SIGTERM")]:
            fail = (lambda inst: inst.kill()) if fail_name == "SIGKILL" else (
                lambda inst: inst.proc.send_signal(signal.SIGTERM))
            before = kv_counters([d1, d2], reset=True)
            # 40 events: a context of whole blocks, which a move pushes (a context within one
            # block is the new D's to compute, as a short prompt is in push).
            status, raw, victim = stream_and_fail(router.port, "/v1/completions", body,
                                                  [d1, d2], fail, {"x-kvpush-mode": mode},
                                                  after_events=40)
            label = "%s stream, %s of its D mid-stream" % (mode, fail_name)
            check(victim, "%s: the D running it was failed mid-stream" % label)
            check(status == 200 and same_stream(raw, ref),
                  "%s: the client's one stream equals the colocated run (%d, %d events)" % (
                      label, status, len(parse_events(raw))))
            n = router.metrics().get("kvpush_router_continuations_total", 0.0)
            check(n == conts + 1, "%s: the router counted one continuation (%s)" % (label, n))
            conts = n
            if fail_name == "SIGTERM":
                # The draining D offered the stream at once (not cut by its 1 s timeout), and
                # pushed the stream's context to the other D.
                check(log_has(router, "offered the stream"),
                      "%s: the draining D offered the stream and the router took it" % label)
                pushed_move_check(label, before, kv_counters([d for d in (d1, d2)
                                                              if d is not victim]),
                                  router, raw, prompt_tokens)
            if victim:
                victim.proc.wait(timeout=30)
                cl.restart(victim)
                router_sees(router, victim.url, True)
        # An operator moves a stream: POST /admin/migrate on the router.
        moved = {}

        def migrate(_inst):
            moved["status"], moved["body"] = post(router.port, "/admin/migrate",
                                                  {"request_id": "move-me-1"})

        before = kv_counters([d1, d2], reset=True)
        status, raw, victim = stream_and_fail(router.port, "/v1/completions", body, [d1, d2],
                                              migrate, {"x-request-id": "move-me-1"},
                                              after_events=40)
        pushed_move_check("POST /admin/migrate", before, kv_counters([d1, d2]), router, raw,
                          prompt_tokens)
        answer = json.loads(moved.get("body") or "{}")
        check(victim and moved.get("status") == 200 and answer.get("from") == victim.url
              and answer.get("to") in (d1.url, d2.url) and answer.get("to") != victim.url,
              "POST /admin/migrate moves a stream to the other D: %s %s" % (
                  moved.get("status"), moved.get("body")))
        check(status == 200 and same_stream(raw, ref),
              "the moved stream equals the colocated run (%d)" % status)
        status, raw = post(router.port, "/admin/migrate", {"request_id": "no-such-stream"})
        check(status == 404 and "stream_not_found" in raw,
              "POST /admin/migrate of an unknown request id: 404 (%d)" % status)
        moved_cases(router, colo, d1, d2, cl)
        # A drain offer no other D can take: the stream stays until D's drain timeout (1.5 s)
        # cuts it, and then goes on on the other D, which is back by then. The stream must
        # outlast the timeout: 1,000 tokens (the model's context is 1,024; 300 took 0.86 s).
        long_body = dict(body, max_tokens=1000)
        _, long_ref = post(colo.port, "/v1/completions", long_body)
        d2.proc.send_signal(signal.SIGSTOP)
        check(router_sees(router, d2.url, False), "the router marks a stopped D2 unhealthy")
        status, raw, victim = stream_and_fail(
            router.port, "/v1/completions", long_body, [d1],
            lambda inst: (inst.proc.send_signal(signal.SIGTERM),
                          # D2 back only once D1's offer was declined (it comes within 50 ms).
                          threading.Timer(0.4, d2.proc.send_signal, [signal.SIGCONT]).start()))
        label = "push stream, SIGTERM of its D while the other D is stopped"
        check(victim is d1 and status == 200 and same_stream(raw, long_ref),
              "%s: the stream equals the colocated run after the drain timeout cut it (%d)" % (
                  label, status))
        check(log_has(router, "drain timeout cut the request"),
              "%s: the router continued it after the cut (draining_timeout)" % label)
        d1.proc.wait(timeout=30)
        cl.restart(d1)
        router_sees(router, d1.url, True)
        router_sees(router, d2.url, True)
        # Not streamed: SIGKILL — the answer is sent again whole; SIGTERM — the draining D hands
        # the answer so far back and the router continues it on the other D (kind
        # whole_resumed), the whole answer including what the first D generated.
        whole = dict(body, stream=False)
        whole.pop("stream_options")
        chat_whole = {"messages": [{"role": "user", "content": "tell me a story"}],
                      "max_tokens": 250, "temperature": 0.8, "seed": 3, "n": 2,
                      "logprobs": True, "top_logprobs": 2, "ignore_eos": True}
        term = lambda inst: inst.proc.send_signal(signal.SIGTERM)  # noqa: E731
        for label, path, req, mode, fail in [
                ("not streamed, SIGKILL of its D mid-answer", "/v1/completions", whole, "push",
                 lambda inst: inst.kill()),
                ("not streamed, SIGTERM of its D mid-answer", "/v1/completions", whole, "push",
                 term),
                ("pull, not streamed, SIGTERM of its D mid-answer", "/v1/completions", whole,
                 "pull", term),
                ("chat, n = 2, logprobs, not streamed, SIGTERM of its D mid-answer",
                 "/v1/chat/completions", chat_whole, "push", term)]:
            before = router.metrics().get("kvpush_router_continuations_total", 0.0)
            status, a, b, victim = whole_and_fail(router, colo, path, req, (d1, d2), fail,
                                                  {"x-kvpush-mode": mode})
            check(victim is not None and status == 200 and a == b,
                  "%s: the answer equals the colocated run (%d)" % (label, status))
            if "SIGTERM" in label:
                n = router.metrics().get("kvpush_router_continuations_total", 0.0)
                handed = handed_back_tokens(router)
                check(n == before + 1 and handed and handed[-1] > 0,
                      "%s: the draining D handed the answer back mid-answer (%s token(s)) and the "
                      "router continued it (%s continuation(s))" % (
                          label, handed[-1] if handed else None, n - before))
            if victim:
                victim.proc.wait(timeout=30)
                cl.restart(victim)
                router_sees(router, victim.url, True)
    finally:
        h.stop_all(cl.procs)
    colocated_mode(args, logdir, model, body, ref)


def handed_back_tokens(router):
    """The token counts of the hand-backs the router logged, in order."""
    with open(router.incarnations[-1]["log"], errors="replace") as f:
        return [int(m) for m in re.findall(r"handed back the answer so far \((\d+) token",
                                           f.read())]


def whole_and_fail(router, colo, path, body, serving, fail, headers=None):
    """Sends the whole (not streamed) `body` through the router; once one of `serving` runs it
    and had time to generate some tokens (0.1 s: the slow model makes about 2.5 ms a token, and
    the shortest answer here, the chat that a stop string ends, takes 0.35 s), applies `fail` to
    it. Returns (status, answer,
    colocated answer, failed instance), the answers without id and created."""
    _, ref_json = post(colo.port, path, body)
    c = http.client.HTTPConnection("127.0.0.1", router.port, timeout=120)
    hd = {"Content-Type": "application/json"}
    hd.update(headers or {})
    c.request("POST", path, json.dumps(body), hd)
    victim = None
    t_end = time.time() + 10
    while victim is None and time.time() < t_end:
        for inst in serving:
            if running(inst) > 0:
                victim = inst
                time.sleep(0.1)
                fail(inst)
                break
        time.sleep(0.02)
    r = c.getresponse()
    got = r.read().decode()
    c.close()
    a, b = json.loads(got) if r.status == 200 else {}, json.loads(ref_json)
    for j in (a, b):
        j.pop("id", None)
        j.pop("created", None)
    return r.status, a, b, victim


def colocated_mode(args, logdir, model, body, ref):
    cl = Cluster(args, logdir, model)
    try:
        c1 = cl.serve("c1", ["serve", model])
        c2 = cl.serve("c2", ["serve", model])
        cl.wait([c1, c2])
        router = cl.serve("router-colocated", ["router", "--colocated", c1.url, c2.url,
                                               "--health-interval-ms", "200"])
        cl.wait([router])
        status, raw, victim = stream_and_fail(router.port, "/v1/completions", body, [c1, c2],
                                              lambda inst: inst.kill())
        check(victim and status == 200 and same_stream(raw, ref),
              "router --colocated, SIGKILL mid-stream: the stream equals the uninterrupted run")
        cl.restart(victim)
        router_sees(router, victim.url, True)
        # A whole answer on a colocated instance that begins draining: handed back, continued.
        whole = dict(body, stream=False)
        whole.pop("stream_options", None)
        status, a, b, victim = whole_and_fail(router, c1, "/v1/completions", whole, [c1, c2],
                                              lambda inst: inst.proc.send_signal(signal.SIGTERM))
        handed = handed_back_tokens(router)
        check(victim and status == 200 and a == b and handed and handed[-1] > 0,
              "router --colocated, not streamed, SIGTERM mid-answer: handed back (%s token(s)), "
              "the answer equals the uninterrupted run (%d)" % (handed and handed[-1], status))
    finally:
        h.stop_all(cl.procs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpush", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print("continuation: SKIPPED: no model at %s (../shared/models)" % args.model)
        return 77
    logdir = tempfile.mkdtemp(prefix="kvpush-continuation-")
    resume_table(args, logdir)
    crash_cases(args, logdir)
    if FAILURES:
        print("continuation: %d check(s) failed; logs in %s" % (len(FAILURES), logdir))
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    print("continuation: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
