#!/usr/bin/env python3
"""Compares kvpush's POST /tokenize and /detokenize with the reference tokenizations written by
oracle.mjs, string by string.

For every corpus string s (gen_corpus.py):
  * valid UTF-8: /tokenize {"prompt": s, "add_special_tokens": false} must return exactly the
    reference ids; /detokenize of those ids must return the reference decode, which is s itself
    except where the tokenizer normalizes (Qwen: NFC) — then it must equal NFC(s);
  * invalid UTF-8: a JSON body holding the raw bytes must be refused with 400 (JSON text is UTF-8,
    as in vLLM), and the U+FFFD-replaced text (what the JS reference tokenized) must give the
    reference ids.
Also checks count, max_model_len and that add_special_tokens=true prepends BOS exactly when the
vocabulary says so. Prints one summary line per vocabulary and the first mismatches; exit 1 on
any mismatch.

Usage: compare.py --url http://127.0.0.1:PORT --corpus corpus.jsonl --oracle oracle.jsonl
                  --name qwen3 [--expect-bos ID|none]
"""
import argparse
import http.client
import json
import sys
import unicodedata
import urllib.parse


class Client:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port

    def post(self, path, body_bytes):
        # A fresh connection per request: on a keep-alive connection a response written in two
        # segments can wait ~40 ms for the client's delayed ACK (Nagle), 2 minutes per corpus.
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("POST", path, body=body_bytes,
                         headers={"Content-Type": "application/json", "Connection": "close"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def post_json(self, path, obj):
        status, data = self.post(path, json.dumps(obj, ensure_ascii=False).encode("utf-8"))
        return status, json.loads(data)


def json_escape_bytes(raw):
    """JSON string content for raw bytes: quotes, backslashes and control characters escaped, every
    other byte (including the invalid UTF-8 ones) left as it is."""
    out = bytearray()
    for b in raw:
        if b in (0x22, 0x5C):
            out += b"\\" + bytes([b])
        elif b < 0x20:
            out += b"\\u%04x" % b
        else:
            out.append(b)
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--expect-bos", default="none")
    ap.add_argument("--nfc", action="store_true", help="the tokenizer normalizes to NFC")
    args = ap.parse_args()

    corpus = {}
    with open(args.corpus) as f:
        for line in f:
            row = json.loads(line)
            corpus[row["i"]] = (row["cat"], bytes.fromhex(row["hex"]))
    oracle = {}
    with open(args.oracle) as f:
        for line in f:
            row = json.loads(line)
            oracle[row["i"]] = row
    if set(corpus) != set(oracle):
        print(f"{args.name}: corpus and oracle differ in their string indices")
        return 1

    c = Client(args.url)
    stats = {"strings": 0, "id_mismatch": 0, "detok_mismatch": 0, "roundtrip_exact": 0,
             "roundtrip_normalized": 0, "invalid_utf8": 0, "invalid_refused": 0, "tokens": 0}
    failures = []
    max_model_len = None
    for i in sorted(corpus):
        cat, raw = corpus[i]
        ref = oracle[i]
        stats["strings"] += 1
        try:
            original = raw.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        if not valid:
            stats["invalid_utf8"] += 1
            body = b'{"prompt": "' + json_escape_bytes(raw) + b'", "add_special_tokens": false}'
            status, _ = c.post("/tokenize", body)
            if status == 400:
                stats["invalid_refused"] += 1
            else:
                failures.append(f"#{i} [{cat}] raw invalid UTF-8 body got HTTP {status}, not 400")
        text = ref["text"]  # = original for valid UTF-8; U+FFFD-replaced otherwise
        status, got = c.post_json("/tokenize", {"prompt": text, "add_special_tokens": False})
        if status != 200:
            failures.append(f"#{i} [{cat}] /tokenize HTTP {status}: {got}")
            stats["id_mismatch"] += 1
            continue
        max_model_len = got.get("max_model_len")
        stats["tokens"] += len(got["tokens"])
        if got["tokens"] != ref["ids"] or got["count"] != len(ref["ids"]):
            stats["id_mismatch"] += 1
            failures.append(f"#{i} [{cat}] {text!r}: kvpush {got['tokens']} != reference {ref['ids']}")
            continue
        status, det = c.post_json("/detokenize", {"tokens": got["tokens"]})
        expected = unicodedata.normalize("NFC", text) if args.nfc else text
        if status != 200 or det.get("prompt") != ref["decoded"] or det.get("prompt") != expected:
            stats["detok_mismatch"] += 1
            failures.append(f"#{i} [{cat}] /detokenize {det!r} != reference {ref['decoded']!r}")
            continue
        if valid and det["prompt"] == original:
            stats["roundtrip_exact"] += 1
        elif valid:
            stats["roundtrip_normalized"] += 1

    # add_special_tokens=true: BOS first exactly when the vocabulary adds it.
    status, with_special = c.post_json("/tokenize", {"prompt": "Hello world", "add_special_tokens": True})
    status2, without = c.post_json("/tokenize", {"prompt": "Hello world", "add_special_tokens": False})
    want = without["tokens"] if args.expect_bos == "none" else [int(args.expect_bos)] + without["tokens"]
    if status != 200 or status2 != 200 or with_special["tokens"] != want:
        failures.append(f"add_special_tokens=true gave {with_special}, expected {want}")
    # Chat messages are checked against the Jinja goldens by chat_compare.py.

    ok = not failures
    print(f"tokenizer oracle {args.name}: {stats['strings']} strings ({stats['tokens']} tokens), "
          f"id mismatches {stats['id_mismatch']}, detokenize mismatches {stats['detok_mismatch']}, "
          f"detokenize(tokenize(s)) == s for {stats['roundtrip_exact']} valid strings "
          f"(== NFC(s) for {stats['roundtrip_normalized']} more), invalid UTF-8 {stats['invalid_utf8']} "
          f"(raw body refused with 400: {stats['invalid_refused']}), max_model_len {max_model_len}: "
          f"{'PASS' if ok else 'FAIL'}")
    for f in failures[:25]:
        print("  " + f)
    if len(failures) > 25:
        print(f"  ... and {len(failures) - 25} more")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
