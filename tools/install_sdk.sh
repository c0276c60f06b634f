#!/bin/bash
# Installs the C SDK under a prefix:
#   PREFIX/lib/libhymcache.so.1, PREFIX/lib/libhymcache.so -> libhymcache.so.1
#   PREFIX/include/hymcache/hymcache.h
#   PREFIX/lib/pkgconfig/hymcache.pc
# Then: cc -std=c11 app.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig \
#         pkg-config --cflags --libs hymcache)
#
# usage: tools/install_sdk.sh --prefix=DIR [--lib=FILE]
#   --lib  an already built libhymcache.so.1 (default: build it now with
#          bazel build -c opt //client/c:libhymcache.so.1)
set -euo pipefail

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
}

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=""
lib=""
for arg in "$@"; do
  case $arg in
    --prefix=*) prefix=${arg#--prefix=} ;;
    --lib=*) lib=${arg#--lib=} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install_sdk: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done
if [ -z "$prefix" ]; then
  echo "install_sdk: --prefix=DIR is required" >&2
  exit 2
fi

if [ -z "$lib" ]; then
  (cd "$root" && bazel build -c opt //client/c:libhymcache.so.1)
  lib="$root/bazel-bin/client/c/libhymcache.so.1"
fi
[ -f "$lib" ] || { echo "install_sdk: no library at $lib" >&2; exit 1; }

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
version=$(cat "$root/VERSION")

install -d "$prefix/lib/pkgconfig" "$prefix/include/hymcache"
install -m 0755 "$lib" "$prefix/lib/libhymcache.so.1"
ln -sfn libhymcache.so.1 "$prefix/lib/libhymcache.so"
install -m 0644 "$root/client/c/hymcache.h" "$prefix/include/hymcache/hymcache.h"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" \
  "$root/client/c/hymcache.pc.in" >"$prefix/lib/pkgconfig/hymcache.pc"
echo "installed libhymcache $version under $prefix"
