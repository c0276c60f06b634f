#!/usr/bin/env bash
# Installs everything HyMCache needs to build, test and run on Debian 12.
# Idempotent: does nothing when every package is already installed.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap pkg-config g++ python3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libgoogle-glog-dev libgflags-dev
  catch2 libbenchmark-dev nlohmann-json3-dev libssl-dev
  clang-14 libclang-rt-14-dev lld-14
  libnuma-dev libibverbs-dev librdmacm-dev liburing-dev
  prometheus-cpp-dev prometheus
  libsystemd-dev systemd
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
