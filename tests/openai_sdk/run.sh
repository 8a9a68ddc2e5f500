#!/usr/bin/env bash
# The OpenAI Node SDK session (ctest: openai_sdk_session): starts a prefill and a decode instance
# (kvpush serve --role prefill|decode, KV over UCX TCP) and a router in front of them, then runs
# session.mjs through the router in push and in pull mode. The model is ../shared/models'
# stories260K when present, else a generated one. Exit 77 (ctest SKIP) when node or the npm
# package `openai` is absent: run scripts/openai-sdk-setup.sh first (scripts/test.sh does).
#
# Usage: run.sh KVPUSH_BINARY WORK_DIR [SHARED_MODELS_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kvpush=$1
work=$2
models=${3:-$here/../../../shared/models}
if ! command -v node >/dev/null || [ ! -f "$here/node_modules/openai/package.json" ]; then
  echo "SKIP: the OpenAI SDK session needs node and $here/node_modules/openai" \
       "(run scripts/openai-sdk-setup.sh; scripts/test.sh does)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
model="$models/stories260K.gguf"
if [ ! -f "$model" ]; then
  model="$work/gen.gguf"
  "$kvpush" gen-model --dim 64 --layers 2 --heads 2 --kv-heads 1 --hidden-dim 128 --vocab 512 \
    --context 512 --seed 7 --out "$model" >/dev/null
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# start NAME ARGS...: runs kvpush ARGS in the background (log: $work/NAME.log) and sets `url` to
# the URL it prints once listening. Runs in this shell (not a $(...) subshell), so that its pid
# reaches `pids` and the EXIT trap stops it.
url=""
start() {
  local name=$1 log="$work/$1.log"
  shift
  # Created here: the background child opens it only once forked, and a `sed` of a log that does
  # not exist yet fails the assignment below, which `set -e` turns into the script's exit (the
  # fresh-clone CI run of 2026-12-07: "sed: can't read .../decode.log").
  : >"$log"
  "$kvpush" "$@" >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  url=""
  for _ in $(seq 1 600); do
    url=$(sed -n 's/^kvpush [a-z]*: listening on \(http:[^ ]*\)$/\1/p' "$log")
    [ -n "$url" ] && return 0
    kill -0 "$pid" 2>/dev/null || { echo "$name exited:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  echo "$name did not start:" >&2
  cat "$log" >&2
  exit 1
}

kv='{"kv_connector_extra_config":{"backend":"ucx:tcp"}}'
serve=(serve --model "$model" --host 127.0.0.1 --port 0 --num-kv-blocks 1024 --log-level warn
       --kv-transfer-config "$kv")
start prefill "${serve[@]}" --role prefill
p_url=$url
start decode "${serve[@]}" --role decode
d_url=$url
start router router --prefill "$p_url" --decode "$d_url" --host 127.0.0.1 --port 0 \
  --log-level warn
r_url=$url
for _ in $(seq 1 100); do
  curl -sf "$r_url/health" >/dev/null && break
  sleep 0.1
done

status=0
for mode in push pull; do
  echo "== OpenAI Node SDK through the router, $mode"
  node "$here/session.mjs" "$r_url/v1" "$mode" || status=1
done
if [ $status -ne 0 ]; then
  for f in prefill decode router; do echo "---- $f log tail"; tail -20 "$work/$f.log"; done
fi
exit $status
