#!/usr/bin/env bash
# Installs the OpenAI Node SDK of the SDK session test (tests/openai_sdk: npm package `openai`,
# version pinned by its package-lock.json) into tests/openai_sdk/node_modules (gitignored). Needs
# node and npm (scripts/setup-debian.sh) and the npm registry. Idempotent. Without them the
# session test skips and says why.
set -euo pipefail
cd "$(dirname "$0")/../tests/openai_sdk"
if [ -f node_modules/openai/package.json ]; then
  echo "openai-sdk-setup: openai $(node -p 'require("./node_modules/openai/package.json").version') present"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "openai-sdk-setup: npm not found (apt-get install nodejs npm)" >&2
  exit 1
fi
npm ci --no-audit --no-fund --loglevel=error
echo "openai-sdk-setup: installed openai $(node -p 'require("./node_modules/openai/package.json").version')"
