#!/usr/bin/env bash
# Installs llama.cpp as the npm package node-llama-cpp@3.22.1 (its prebuilt CPU build) into
# bench/llamacpp/node_modules (gitignored): the independent engine of the greedy oracle test
# (tests/llamacpp_oracle) and the speed peer of bench/model_vs_llamacpp.py. Needs node and npm
# (scripts/setup-debian.sh) and the npm registry. Idempotent. Without them the oracle test skips
# and says why. (`npm install`, not `npm ci`: npm 11 refuses the lock file's missing entries for
# other platforms' optional binaries.)
set -euo pipefail
cd "$(dirname "$0")/../bench/llamacpp"
if [ -d node_modules/node-llama-cpp ]; then
  echo "llamacpp-setup: node-llama-cpp present"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "llamacpp-setup: npm not found (apt-get install nodejs npm)" >&2
  exit 1
fi
npm install --no-audit --no-fund --loglevel=error
echo "llamacpp-setup: installed node-llama-cpp $(node -p 'require("./node_modules/node-llama-cpp/package.json").version')"
