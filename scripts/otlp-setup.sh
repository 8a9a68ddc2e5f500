#!/usr/bin/env bash
# Installs the OTLP decoder of the trace test (tests/otlp: npm @opentelemetry/otlp-transformer,
# OpenTelemetry JS's code generated from opentelemetry-proto, version pinned by its
# package-lock.json) into tests/otlp/node_modules (gitignored). Needs node and npm
# (scripts/setup-debian.sh) and the npm registry. Idempotent. Without them the trace test skips
# and says why.
set -euo pipefail
cd "$(dirname "$0")/../tests/otlp"
pkg=node_modules/@opentelemetry/otlp-transformer/package.json
if [ -f "$pkg" ]; then
  echo "otlp-setup: @opentelemetry/otlp-transformer $(node -p "require('./$pkg').version") present"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "otlp-setup: npm not found (apt-get install nodejs npm)" >&2
  exit 1
fi
npm ci --no-audit --no-fund --loglevel=error
echo "otlp-setup: installed @opentelemetry/otlp-transformer $(node -p "require('./$pkg').version")"
