#!/usr/bin/env bash
# The llama.cpp greedy oracle (issue 25): for every architecture kvpush runs (llama, llama3, qwen2,
# qwen3) and the float weight types (F32, F16), a random GGUF written by kvpush's generator is run
# greedily by kvpush's executor (kvpush_model_greedy_bench) and by llama.cpp (npm
# node-llama-cpp@3.22.1, its prebuilt CPU build: bench/llamacpp/greedy.mjs), and the generated
# token ids must be identical. llama.cpp is an independent engine: its own GGUF reader, RoPE,
# attention and sampling. Quantized types are not compared here (the two engines round
# activations differently; their agreement is reported by bench/model_vs_llamacpp.py).
#
#   run.sh KVPUSH_MODEL_GREEDY_BENCH WORK_DIR
# Skips (exit 77, saying why) when node or the npm package is absent
# (scripts/llamacpp-setup.sh installs it).
set -euo pipefail
BENCH=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MJS=$ROOT/bench/llamacpp/greedy.mjs
if ! command -v node >/dev/null; then
  echo "llamacpp oracle: SKIPPED: node not found (apt-get install nodejs npm)"
  exit 77
fi
if [ ! -d "$ROOT/bench/llamacpp/node_modules/node-llama-cpp" ]; then
  echo "llamacpp oracle: SKIPPED: node-llama-cpp not installed (scripts/llamacpp-setup.sh)"
  exit 77
fi
mkdir -p "$WORK"
# A small shape: dim 256, 2 layers, 4 heads of 64, 2 KV heads (GQA), hidden 704, vocab 32000.
SHAPE=(--dim 256 --layers 2 --heads 4 --kv-heads 2 --hidden-dim 704 --vocab 32000)
python3 -c "
import random
r = random.Random(7)
print(' '.join(str(r.randrange(300, 32000)) for _ in range(40)))" > "$WORK/prompt.txt"
fail=0
for arch in llama llama3 qwen2 qwen3; do
  for dtype in f32 f16; do
    model=$WORK/$arch-$dtype.gguf
    "$BENCH" --gen "$model" --arch "$arch" --dtype "$dtype" "${SHAPE[@]}"
    args=(--model "$model" --prompt-file "$WORK/prompt.txt" --decode 32 --threads 1)
    "$BENCH" "${args[@]}" | tail -n 1 > "$WORK/$arch-$dtype.kvpush.json"
    node "$MJS" "${args[@]}" | tail -n 1 > "$WORK/$arch-$dtype.llamacpp.json"
    if ! python3 - "$WORK/$arch-$dtype.kvpush.json" "$WORK/$arch-$dtype.llamacpp.json" \
        "$arch $dtype" <<'PY'
import json, sys
k = json.load(open(sys.argv[1]))["tokens"]
l = json.load(open(sys.argv[2]))["tokens"]
n = min(len(k), len(l))
first = next((i for i in range(n) if k[i] != l[i]), n)
ok = len(k) == len(l) and first == n
print(f"{sys.argv[3]:<12} {'same' if ok else 'DIFFERENT'}: {n} tokens"
      + ("" if ok else f", first difference at {first}: kvpush {k[first:first + 4]} "
         f"llama.cpp {l[first:first + 4]}"))
sys.exit(0 if ok else 1)
PY
    then
      fail=1
    fi
  done
done
exit $fail
