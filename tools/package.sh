#!/usr/bin/env bash
# Builds the Debian packages from the tree with dpkg-deb from staged trees
# (docs/deployment.md): `libhymcache1` (the C SDK, libhymcache.so.1),
# `libhymcache-dev` (its header, libhymcache.so and hymcache.pc for
# pkg-config, the C quick start) and `hymcache`:
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
# --out: where the .debs go (default: dist/). --fast: the default (fastbuild)
# Bazel configuration the test suite already built, instead of -c opt (for
# tests; not for release). --lintian: run lintian on the result (its
# findings are printed; the ones we accept are overridden in
# deploy/debian/lintian-overrides with a reason each).
# Prints the path of the hymcache .deb on its last line (the others are
# beside it).
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
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
targets=(//master:hymcache-master //storage_node:hymcache-storage
         //tools/hymctl:hymctl //tools/demo:hymcache-demo
         //client/c:libhymcache.so.1)
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
# Three masters through etcd (docs/operations.md "A three-host install").
install -d "$root/usr/share/doc/hymcache/examples"
install -m 0644 deploy/systemd/master-ha.conf deploy/systemd/etcd.default \
  "$root/usr/share/doc/hymcache/examples/"
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

# libhymcache1: the shared library, with a shlibs file for the packages
# that link it.
lib="$stage/libhymcache1"
libdir="usr/lib/$MULTIARCH"
install -d "$lib/DEBIAN" "$lib/$libdir" "$lib/usr/share/doc/libhymcache1"
install -m 0644 "$BIN/client/c/libhymcache.so.1" "$lib/$libdir/"
strip --strip-unneeded "$lib/$libdir/libhymcache.so.1"
install -m 0644 deploy/debian/copyright "$lib/usr/share/doc/libhymcache1/"
gzip -9n -c deploy/debian/changelog \
  > "$lib/usr/share/doc/libhymcache1/changelog.gz"
lib_depends=$(cd "$shlib" && dpkg-shlibdeps -O --warnings=0 \
                "$lib/$libdir/libhymcache.so.1" | sed -n 's/^shlibs:Depends=//p')
echo "libhymcache 1 libhymcache1 (>= $VERSION)" > "$lib/DEBIAN/shlibs"
echo "activate-noawait ldconfig" > "$lib/DEBIAN/triggers"
# dev: the link-time name, the header, pkg-config, the example.
dev="$stage/libhymcache-dev"
install -d "$dev/DEBIAN" "$dev/$libdir/pkgconfig" "$dev/usr/include/hymcache" \
  "$dev/usr/share/doc/libhymcache-dev/examples"
ln -s libhymcache.so.1 "$dev/$libdir/libhymcache.so"
install -m 0644 client/c/hymcache.h "$dev/usr/include/hymcache/"
sed -e "s|@PREFIX@|/usr|g" -e "s|@VERSION@|$VERSION|g" \
    -e "s|^libdir=.*|libdir=\${prefix}/lib/$MULTIARCH|" \
    client/c/hymcache.pc.in > "$dev/$libdir/pkgconfig/hymcache.pc"
install -m 0644 client/c/example.c "$dev/usr/share/doc/libhymcache-dev/examples/"
install -m 0644 docs/c_api.md deploy/debian/copyright \
  "$dev/usr/share/doc/libhymcache-dev/"
gzip -9n -c deploy/debian/changelog \
  > "$dev/usr/share/doc/libhymcache-dev/changelog.gz"
for pkg in libhymcache1 libhymcache-dev; do
  d="$stage/$pkg"
  install -d "$d/usr/share/lintian/overrides"
  grep -v '^hymcache: no-manual-page' deploy/debian/lintian-overrides |
    sed "s/^hymcache:/$pkg:/" > "$d/usr/share/lintian/overrides/$pkg"
  sed -e "s/@VERSION@/$VERSION/g" -e "s/@ARCH@/$ARCH/" \
      -e "s/@DEPENDS@/$lib_depends/" \
      -e "s/@INSTALLED_SIZE@/$(du -sk --exclude=DEBIAN "$d" | cut -f1)/" \
      "deploy/debian/$pkg.control.in" > "$d/DEBIAN/control"
done

mkdir -p "$OUT"
debs=()
for pkg in libhymcache1 libhymcache-dev hymcache; do
  debs+=("$OUT/${pkg}_${VERSION}_${ARCH}.deb")
  dpkg-deb --root-owner-group -Zxz --build "$stage/$pkg" "${debs[-1]}" >&2
done
if [ $LINTIAN -eq 1 ]; then
  lintian --tag-display-limit 0 "${debs[@]}" >&2 || true
fi
echo "${debs[-1]}"
