#!/usr/bin/env python3
"""Checks a served model's chat prompts against the Jinja goldens (issue 12, chat templates).

For every golden row of the served model's own template (tests/model/chat_template_goldens.json,
rendered by @huggingface/jinja from the template text the model carries) that renders without an
error:
  * POST /tokenize {"messages", "add_generation_prompt", "chat_template_kwargs"} must equal
    POST /tokenize {"prompt": <golden text>, "add_special_tokens": false}, whose ids the tokenizer
    oracle (compare.py) checks against the JS reference tokenizer;
  * POST /v1/chat/completions with the same messages (max_tokens 1) must report that many
    prompt tokens.
And a /v1/completions text prompt must count what /tokenize gives with add_special_tokens.
Exit 1 on any mismatch.

Usage: chat_compare.py --url http://127.0.0.1:PORT --goldens GOLDENS.json --template qwen3|llama3
"""
import argparse
import http.client
import json
import sys
import urllib.parse


def post(url, path, body):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--goldens", required=True)
    ap.add_argument("--template", required=True)
    a = ap.parse_args()
    rows = [r for r in json.load(open(a.goldens))["rows"]
            if r["template"] == a.template and "text" in r]
    bad = 0
    for r in rows:
        body = {"messages": r["messages"], "add_generation_prompt": r["add_generation_prompt"]}
        if "enable_thinking" in r:
            body["chat_template_kwargs"] = {"enable_thinking": r["enable_thinking"]}
        s1, chat = post(a.url, "/tokenize", body)
        s2, text = post(a.url, "/tokenize", {"prompt": r["text"], "add_special_tokens": False})
        s3, comp = post(a.url, "/v1/chat/completions", dict(body, max_tokens=1, temperature=0))
        what = f'{r["conversation"]} gen={r["add_generation_prompt"]} think={r.get("enable_thinking")}'
        if s1 != 200 or s2 != 200 or chat["tokens"] != text["tokens"]:
            bad += 1
            print(f"  MISMATCH {what}: /tokenize messages {s1} {chat} vs text {s2} {text}")
        elif s3 != 200 or comp["usage"]["prompt_tokens"] != len(text["tokens"]):
            bad += 1
            print(f"  MISMATCH {what}: chat completion {s3} {comp}")
    # A completion's text prompt is what /tokenize gives with add_special_tokens (BOS only when the
    # vocabulary adds one: Llama 3 yes, Qwen no).
    for prompt in ["Hello world", "<|im_start|>user\nhi", " leading space"]:
        s1, tok = post(a.url, "/tokenize", {"prompt": prompt, "add_special_tokens": True})
        s2, comp = post(a.url, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
        if s1 != 200 or s2 != 200 or comp["usage"]["prompt_tokens"] != tok["count"]:
            bad += 1
            print(f"  MISMATCH completion prompt {prompt!r}: /tokenize {tok} vs {s2} {comp}")
    print(f"chat_compare {a.template}: {len(rows)} conversations + 3 completion prompts, "
          f"{bad} mismatches")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
