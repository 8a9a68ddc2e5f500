#!/usr/bin/env bash
# Builds the Debian package (CPack, cmake/Packaging.cmake) from an existing build and checks it:
# its control data and files, `systemd-analyze verify` of its units, and the packaged binary's
# `--version` and one served request. With KVPUSH_PACKAGE_INSTALL=1 (CI; needs root) the package
# is installed with apt (resolving its dependencies) and /usr/bin/kvpush is checked; otherwise it
# is unpacked into a scratch folder (nothing on this machine changes).
#   BUILD_DIR=build scripts/package.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
MODEL=${MODEL:-../shared/models/stories260K.gguf}
rm -f "$BUILD_DIR"/kvpush_*.deb
(cd "$BUILD_DIR" && cpack -G DEB >/dev/null)
deb=$(ls "$BUILD_DIR"/kvpush_*.deb)
echo "package: $deb ($(du -h "$deb" | cut -f1))"
dpkg-deb -f "$deb" Package Version Architecture Depends
scratch=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$scratch"' EXIT
if [ "${KVPUSH_PACKAGE_INSTALL:-0}" = 1 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$(realpath "$deb")" >/dev/null
  root=""
else
  dpkg-deb -x "$deb" "$scratch/root"
  root="$scratch/root"
fi
bin="$root/usr/bin/kvpush"
for f in usr/bin/kvpush usr/lib/systemd/system/kvpush@.service \
         usr/lib/systemd/system/kvpush-router.service usr/share/doc/kvpush/examples/default.example; do
  [ -e "$root/$f" ] || { echo "package: /$f missing" >&2; exit 1; }
done
"$bin" --version
# The units as systemd reads them (a template needs an instance name to be verified); outside an
# installed package, ExecStart points at the unpacked binary.
mkdir -p "$scratch/units"
for u in kvpush@.service kvpush-router.service; do
  name=${u/@./@check.}
  sed "s#/usr/bin/kvpush#$bin#g" "$root/usr/lib/systemd/system/$u" >"$scratch/units/$name"
done
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify --man=no "$scratch"/units/*.service
  echo "package: systemd-analyze verify: clean"
fi
if [ -f "$MODEL" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" serve "$MODEL" --port "$port" >"$scratch/serve.log" 2>&1 &
  "$bin" wait-ready --timeout-s 60 "http://127.0.0.1:$port"
  curl -sf --max-time 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}' | python3 -c \
    'import json,sys; d=json.load(sys.stdin); print("package: served:", repr(d["choices"][0]["text"]))'
else
  echo "package: no $MODEL: served request skipped"
fi
echo "package: ok"
