#!/usr/bin/env bash
# The OCI image, run as a container runtime runs it: builds the image
# (tools/image.sh from tools/package.sh --fast), unpacks it with umoci into
# runtime bundles and runs a master and a storage node as two runc
# containers (read-only root, the image's user, a tmpfs state volume, the
# host's network on free loopback ports), then in the master's container
# `hymctl status` (one live node) and the demo workload (every loaded byte
# verified); SIGTERM stops both within their grace period. Then builds
# deploy/docker/Dockerfile with buildah and runs a binary from it.
#
#   tests/image/image_test.sh [--deb=PATH]
#
# Needs root, mmdebstrap, umoci, runc and buildah (tools/setup.sh --test). Prints
# "IMAGE PASS" or "IMAGE FAIL: why" (exit 1); "IMAGE SKIPPED: why" (exit 3)
# when runc cannot start any container on this machine (a trivial
# container shows that first). About a minute.
set -uo pipefail
cd "$(dirname "$0")/../.."

DEB=""
for a in "$@"; do
  case "$a" in
    --deb=*) DEB=${a#--deb=} ;;
    *) echo "image_test: unknown argument $a" >&2; exit 2 ;;
  esac
done
fail() { echo "IMAGE FAIL: $*"; exit 1; }
for tool in mmdebstrap umoci runc python3; do
  command -v "$tool" >/dev/null || fail "$tool missing (tools/setup.sh --test)"
done
[ "$(id -u)" = 0 ] || fail "needs root (runc)"

work=$(mktemp -d /var/tmp/hymcache-image.XXXXXX)
names=()
cleanup() {
  for n in "${names[@]}"; do runc delete --force "$n" >/dev/null 2>&1; done
  rm -rf "$work" "/var/tmp/hymcache-image-base-$$"
}
trap cleanup EXIT
if [ -z "$DEB" ]; then
  DEB=$(bash tools/package.sh --fast --out="$work/deb" | tail -n 1) ||
    fail "tools/package.sh failed"
fi
image=$(bash tools/image.sh --deb="$DEB" --out="$work/oci" --tag=test | tail -n 1) ||
  fail "tools/image.sh failed"
umoci unpack --image "$image" "$work/bundle" > /dev/null || fail "umoci unpack"
rootfs="$work/bundle/rootfs"
uid=$(awk -F: '$1 == "hymcache" {print $3}' "$rootfs/etc/passwd")
[ -n "$uid" ] && [ "$uid" != 0 ] || fail "the image has no hymcache user"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# bundle NAME ARGS...: a runtime bundle running ARGS from the image's
# config (its user), with the shared read-only root, host network and a
# tmpfs for the state volume.
bundle() {
  local name=$1
  shift
  mkdir -p "$work/$name"
  python3 - "$work/bundle/config.json" "$work/$name/config.json" "$rootfs" \
      "$uid" "$@" <<'EOF'
import json, sys
src, dst, rootfs, uid, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
c = json.load(open(src))
c["root"] = {"path": rootfs, "readonly": True}
c["process"]["args"] = args
c["process"]["terminal"] = False
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"]
                            if n["type"] != "network"]
for path in ("/var/lib/hymcache", "/tmp"):
    c["mounts"].append({"destination": path, "type": "tmpfs", "source": "tmpfs",
                        "options": ["nosuid", "nodev", "mode=0750",
                                    "uid=" + uid, "gid=" + uid]})
json.dump(c, open(dst, "w"), indent=1)
EOF
}

# Can runc run a container here at all?
bundle probe /usr/bin/hymctl --version
if ! out=$(timeout 60 runc run --bundle "$work/probe" "hymcache-probe-$$" 2>&1); then
  echo "$out" | tail -n 5
  echo "IMAGE SKIPPED: runc cannot run a container on this machine"
  exit 3
fi
grep -q '^hymctl ' <<<"$out" || fail "hymctl --version in the image printed: $out"

mport=$(free_port)
dport=$(free_port)
cport=$(free_port)
master=127.0.0.1:$mport
bundle master /usr/bin/hymcache-master --listen="$master" \
  --db_path=/var/lib/hymcache/master
bundle storage /usr/bin/hymcache-storage --master="$master" \
  --listen_host=127.0.0.1 --data_port="$dport" --control_port="$cport" \
  --dram_bytes=64M --numa_node=-1 --name=image-node \
  --node_key_file=/var/lib/hymcache/node.key
start() {  # start NAME: detached, output to NAME.log
  names+=("hymcache-$1-$$")
  runc run --detach --bundle "$work/$1" "hymcache-$1-$$" \
    > "$work/$1.log" 2>&1 < /dev/null || fail "runc run $1: $(tail -n 5 "$work/$1.log")"
}
in_master() { runc exec "hymcache-master-$$" "$@"; }
start master
for _ in $(seq 1 100); do
  grep -q "listening on" "$work/master.log" && break
  sleep 0.1
done
grep -q "listening on" "$work/master.log" || fail "master: $(tail -n 5 "$work/master.log")"
start storage
alive=0
for _ in $(seq 1 100); do
  alive=$(in_master /usr/bin/hymctl --master="$master" --json status 2>/dev/null |
            grep -c '"alive": true')
  [ "$alive" -eq 1 ] && break
  sleep 0.2
done
[ "$alive" -eq 1 ] || fail "no live node: $(tail -n 5 "$work/storage.log")"
[ "$(in_master /usr/bin/id -u)" = "$uid" ] || fail "the container does not run as hymcache"
in_master /usr/bin/hymctl --master="$master" status
demo=$(in_master /usr/bin/hymcache-demo --master="$master" \
         --conversations=2 --turns=3 2>&1) || fail "demo: $demo"
grep "every loaded byte verified" <<<"$demo" || fail "demo: $demo"

for n in storage master; do
  runc kill "hymcache-$n-$$" TERM
  for _ in $(seq 1 300); do
    [ "$(runc state "hymcache-$n-$$" 2>/dev/null |
         python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')" = stopped ] && break
    sleep 0.1
  done
  state=$(runc state "hymcache-$n-$$" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
  [ "$state" = stopped ] || fail "$n did not stop within 30 s of SIGTERM"
done
grep -q "deregistered node" "$work/storage.log" ||
  fail "the storage node did not deregister on SIGTERM: $(tail -n 5 "$work/storage.log")"
# deploy/docker/Dockerfile, built as a registry user would (buildah bud;
# BASE is a local bookworm root instead of Docker Hub's), then run.
if command -v buildah >/dev/null; then
  mmdebstrap --variant=minbase --format=tar bookworm "$work/base.tar" \
    > "$work/base.log" 2>&1 || fail "mmdebstrap (base image): $(tail -n 5 "$work/base.log")"
  # buildah takes an image reference's path for a name: lowercase only.
  base=/var/tmp/hymcache-image-base-$$
  umoci init --layout "$base" && umoci new --image "$base:bookworm" &&
    umoci raw add-layer --image "$base:bookworm" "$work/base.tar" ||
    fail "umoci (base image)"
  mkdir -p "$work/ctx/dist"
  cp "$(readlink -f "$DEB")" "$work/ctx/dist/"
  b=(buildah --storage-driver=vfs --root="$work/containers" --runroot="$work/run")
  "${b[@]}" bud --quiet --build-arg BASE="oci:$base:bookworm" \
    -f deploy/docker/Dockerfile -t localhost/hymcache:test "$work/ctx" \
    > "$work/bud.log" 2>&1 || fail "buildah bud: $(tail -n 10 "$work/bud.log")"
  ctr=$("${b[@]}" from localhost/hymcache:test) || fail "buildah from"
  v=$("${b[@]}" run "$ctr" -- /usr/bin/hymcache-storage --version) ||
    fail "the Dockerfile's image does not run hymcache-storage"
  u=$("${b[@]}" run "$ctr" -- /usr/bin/id -un)
  [ "$u" = hymcache ] || fail "the Dockerfile's image runs as $u"
  "${b[@]}" rm "$ctr" > /dev/null
  echo "Dockerfile: built and ran ($v, user $u)"
else
  fail "buildah missing (tools/setup.sh --test)"
fi
echo "IMAGE PASS"
