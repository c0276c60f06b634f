#!/usr/bin/env bash
# Installs everything HyMCache needs to build, test and run on Debian 12.
# Idempotent: does nothing when every package is already installed.
#
#   tools/setup.sh          build and run (tools/quickstart.sh)
#   tools/setup.sh --test   also the servers the tests start (tools/test.sh):
#                           Prometheus (prometheus_test), Redis (the
#                           lookup_bench --redis smoke) and systemd's tools
#                           (systemd-analyze verify of the units; the
#                           package and image tests: dpkg-dev,
#                           mmdebstrap, systemd-nspawn, umoci, runc,
#                           buildah), and what the Helm chart test
#                           renders and checks with (Go, sprig,
#                           gojsonschema, python3-kubernetes' API models,
#                           python3-jsonschema), and etcd (etcd-server,
#                           etcd-client: the HA tests start real etcd
#                           clusters; masters only talk to an etcd
#                           cluster over gRPC, so running HyMCache needs
#                           neither package on its own hosts). A
#                           prometheus.service, redis-server.service or
#                           etcd.service this installs is stopped and
#                           disabled again: the tests run their own;
#                           iproute2 (ip, tc: tests/netns' hosts in
#                           network namespaces) and iptables (their
#                           links' latency where the kernel has no
#                           netem: tests/netns/link_delayer.h); and
#                           clang-format-14
#                           (tools/format_check.sh).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap pkg-config g++ python3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libgoogle-glog-dev libgflags-dev
  catch2 libbenchmark-dev nlohmann-json3-dev libssl-dev
  clang-14 libclang-rt-14-dev lld-14
  libnuma-dev libibverbs-dev librdmacm-dev liburing-dev
  prometheus-cpp-dev libsystemd-dev
  python3-dev pybind11-dev python3-numpy python3-pytest python3-matplotlib
)
TEST_PACKAGES=(prometheus redis-server systemd systemd-container mmdebstrap dpkg-dev
  umoci runc buildah
  golang-go golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev
  golang-github-xeipuuv-gojsonschema-dev
  python3-kubernetes python3-jsonschema python3-yaml
  etcd-server etcd-client
  iproute2 iptables
  clang-format-14)
if [ "${1:-}" = "--test" ]; then
  PACKAGES+=("${TEST_PACKAGES[@]}")
fi

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
for p in "${missing[@]}"; do
  if { [ "$p" = prometheus ] || [ "$p" = redis-server ]; } &&
     [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now "$p.service" >/dev/null 2>&1 || true
  fi
  if [ "$p" = etcd-server ] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now etcd.service >/dev/null 2>&1 || true
  fi
done
echo "setup: done"
