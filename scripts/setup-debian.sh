#!/usr/bin/env bash
# Installs the Debian 12 packages kvpush needs to build, test and benchmark. Idempotent: installs
# only what is missing. Run as root (or with sudo available).
set -euo pipefail

# libclang-rt-14-dev: clang's sanitizer and libFuzzer runtimes (scripts/sanitize.sh, scripts/fuzz.sh).
PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  clang clang-tidy clang-format libclang-rt-14-dev
  libucx-dev ucx-utils libfabric-dev libfabric-bin
  libopenblas-dev libcpp-httplib-dev nlohmann-json3-dev libsimdjson-dev libcli11-dev libspdlog-dev libfmt-dev
  libyaml-cpp-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libicu-dev libssl-dev
  iproute2 procps curl python3 python3-numpy dpkg-dev systemd adduser
  etcd-server prometheus
)
# node and npm (the tokenizer oracle): Debian's packages, unless a node that brings its own npm
# is installed already (e.g. NodeSource's nodejs, whose package conflicts with Debian's npm).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
