#!/usr/bin/env bash
# Builds the HyMCache OCI image from the Debian package (docs/deployment.md):
# a Debian bookworm root made by mmdebstrap (minbase) in which apt installs
# the .deb (its Depends: from Debian's archive), documentation and apt lists
# left out, as one layer of an OCI image layout written with umoci. The
# image runs as the `hymcache` user; its entrypoint is the master
# (`--entrypoint /usr/bin/hymcache-storage` or hymctl for the others).
#
#   tools/image.sh [--deb=PATH] [--out=DIR] [--tag=TAG]
#
# --deb: the package (default: build one with tools/package.sh). --out: the
# OCI layout directory (default: dist/oci; the image is DIR:TAG).
# --tag: default the VERSION file's. Prints "DIR:TAG" on its last line.
# To load it into Docker or push it: skopeo copy oci:DIR:TAG
# docker-daemon:hymcache:TAG (or docker://REGISTRY/hymcache:TAG).
set -euo pipefail
cd "$(dirname "$0")/.."

DEB=""
OUT=dist/oci
TAG=$(cat VERSION)
for a in "$@"; do
  case "$a" in
    --deb=*) DEB=${a#--deb=} ;;
    --out=*) OUT=${a#--out=} ;;
    --tag=*) TAG=${a#--tag=} ;;
    *) echo "image.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || {
    echo "image.sh: $tool missing (apt-get install mmdebstrap umoci)" >&2
    exit 1
  }
done
if [ -z "$DEB" ]; then
  DEB=$(bash tools/package.sh | tail -n 1)
fi
DEB=$(readlink -f "$DEB")
deb_name=$(basename "$DEB")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "image.sh: bookworm root with $deb_name" >&2
mmdebstrap --variant=minbase --format=tar \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook="copy-in $DEB /tmp" \
  --customize-hook="chroot \"\$1\" apt-get install --yes --no-install-recommends /tmp/$deb_name" \
  --customize-hook="rm -f \"\$1/tmp/$deb_name\"" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$work/rootfs.tar" > "$work/mmdebstrap.log" 2>&1 || {
    grep -v '^I: \|^Get:' "$work/mmdebstrap.log" | tail -n 30 >&2
    echo "image.sh: mmdebstrap failed" >&2
    exit 1
  }

[ -d "$OUT" ] || umoci init --layout "$OUT"
umoci new --image "$OUT:$TAG"
umoci raw add-layer --image "$OUT:$TAG" "$work/rootfs.tar"
umoci config --image "$OUT:$TAG" \
  --config.user=hymcache \
  --config.workingdir=/var/lib/hymcache \
  --config.entrypoint=/usr/bin/hymcache-master \
  --config.cmd=--help \
  --config.exposedports=50051/tcp --config.exposedports=50061/tcp \
  --config.exposedports=50062/tcp --config.exposedports=9451/tcp \
  --config.exposedports=9452/tcp \
  --config.volume=/var/lib/hymcache \
  --config.label=org.opencontainers.image.title=hymcache \
  --config.label=org.opencontainers.image.version="$(cat VERSION)" \
  --config.label=org.opencontainers.image.revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
umoci gc --layout "$OUT"
echo "$OUT:$TAG"
