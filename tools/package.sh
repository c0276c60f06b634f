#!/usr/bin/env bash
# Builds the Debian package `hymcache` from the tree with dpkg-deb from a
# staged tree (docs/deployment.md):
#   /usr/bin/{hymcache-master,hymcache-storage,hymctl,hymcache-demo}
#   /usr/lib/systemd/system/{hymcache-master,hymcache-storage@}.service
#   /usr/lib/sysusers.d/hymcache.conf, /usr/lib/tmpfiles.d/hymcache.conf
#   /etc/hymcache/{master,storage-dram0}.conf (conffiles)
#   /usr/share/hymcache/make-identities.sh, /usr/share/doc/hymcache/
# Depends: is computed by dpkg-shlibdeps from the binaries' shared
# libraries. The postinst creates the hymcache user and /etc/hymcache; it
# enables nothing (systemctl enable --now hymcache-master
# hymcache-storage@dram0).
#
#   tools/package.sh [--out=DIR] [--fast] [--lintian]
#
# --out: where the .deb goes (default: dist/). --fast: the default (fastbuild)
# Bazel configuration the test suite already built, instead of -c opt (for
# tests; not for release). --lintian: run lintian on the result (its
# findings are printed; the ones we accept are overridden in
# deploy/debian/lintian-overrides with a reason each).
# Prints the path of the .deb on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=dist
MODE=(-c opt)
LINTIAN=0
for a in "$@"; do
  case "$a" in
    --out=*) OUT=${a#--out=} ;;
    --fast) MODE=() ;;
    --lintian) LINTIAN=1 ;;
    *) echo "package.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
for tool in dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || {
    echo "package.sh: $tool missing (apt-get install dpkg-dev)" >&2
    exit 1
  }
done

VERSION=$(cat VERSION)
ARCH=$(dpkg --print-architecture)
targets=(//master:hymcache-master //storage_node:hymcache-storage
         //tools/hymctl:hymctl //tools/demo:hymcache-demo)
bazel build "${MODE[@]}" "${targets[@]}" >&2
BIN=$(bazel info "${MODE[@]}" bazel-bin 2>/dev/null)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/hymcache"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/systemd/system" \
  "$root/usr/lib/sysusers.d" "$root/usr/lib/tmpfiles.d" "$root/etc/hymcache" \
  "$root/usr/share/hymcache" "$root/usr/share/doc/hymcache"
for b in master/hymcache-master storage_node/hymcache-storage \
         tools/hymctl/hymctl tools/demo/hymcache-demo; do
  install -m 0755 "$BIN/$b" "$root/usr/bin/"
  strip --strip-unneeded "$root/usr/bin/$(basename "$b")"
done
install -m 0644 deploy/systemd/hymcache-master.service \
  deploy/systemd/hymcache-storage@.service "$root/usr/lib/systemd/system/"
install -m 0644 deploy/systemd/hymcache.sysusers \
  "$root/usr/lib/sysusers.d/hymcache.conf"
install -m 0644 deploy/systemd/hymcache.tmpfiles \
  "$root/usr/lib/tmpfiles.d/hymcache.conf"
install -m 0644 deploy/systemd/master.conf \
  deploy/systemd/storage-dram0.conf "$root/etc/hymcache/"
install -m 0755 deploy/systemd/make-identities.sh "$root/usr/share/hymcache/"
install -m 0644 README.md docs/*.md "$root/usr/share/doc/hymcache/"
install -m 0644 deploy/debian/copyright "$root/usr/share/doc/hymcache/"
gzip -9n -c deploy/debian/changelog \
  > "$root/usr/share/doc/hymcache/changelog.gz"
install -d "$root/usr/share/lintian/overrides"
install -m 0644 deploy/debian/lintian-overrides \
  "$root/usr/share/lintian/overrides/hymcache"

# Depends: the packages of the shared libraries the binaries link.
shlib="$stage/shlibdeps"
mkdir -p "$shlib/debian"
printf 'Source: hymcache\n\nPackage: hymcache\nArchitecture: any\n' \
  > "$shlib/debian/control"
depends=$(cd "$shlib" && dpkg-shlibdeps -O --warnings=0 \
            "$root"/usr/bin/* | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "package.sh: dpkg-shlibdeps found nothing" >&2; exit 1; }

installed_kb=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" \
    -e "s/@DEPENDS@/$depends/" -e "s/@INSTALLED_SIZE@/$installed_kb/" \
    deploy/debian/control.in > "$root/DEBIAN/control"
install -m 0644 deploy/debian/conffiles "$root/DEBIAN/conffiles"
install -m 0755 deploy/debian/postinst deploy/debian/postrm "$root/DEBIAN/"

mkdir -p "$OUT"
deb="$OUT/hymcache_${VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
if [ $LINTIAN -eq 1 ]; then
  lintian --tag-display-limit 0 "$deb" >&2 || true
fi
echo "$deb"
