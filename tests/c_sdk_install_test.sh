#!/bin/bash
# The C SDK outside Bazel: tools/install_sdk.sh installs it into a temporary
# prefix, gcc builds the pure C quick start (client/c/example.c) with
# `gcc -std=c11 $(pkg-config --cflags --libs hymcache)`, and the program
# round-trips blocks through a real master and storage node.
set -euo pipefail
prefix=$TEST_TMPDIR/prefix
tools/install_sdk.sh --prefix="$prefix" --lib="$PWD/client/c/libhymcache.so.1"
for f in lib/libhymcache.so.1 lib/libhymcache.so include/hymcache/hymcache.h \
  lib/pkgconfig/hymcache.pc; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $prefix/$f not installed" >&2; exit 1; }
done

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
version=$(pkg-config --modversion hymcache)
[ "$version" = "$(cat VERSION)" ] || { echo "FAIL: pc version $version" >&2; exit 1; }
flags=$(pkg-config --cflags --libs hymcache)
echo "pkg-config --cflags --libs hymcache: $flags"

# A library built with a sanitizer (--config=asan/tsan) needs a program
# built with the same one.
# Under TSan the program also carries the TSan settings every binary of
# ours that uses Debian's uninstrumented gRPC carries (TSan reads them from
# the executable only): an object built from common/grpc_tsan_hooks.cc.
san=()
needed=$(readelf -d "$prefix/lib/libhymcache.so.1")
if grep -q libasan <<<"$needed"; then san=(-fsanitize=address,undefined); fi
if grep -q libtsan <<<"$needed"; then
  g++ -c -DHYMCACHE_TSAN -o "$TEST_TMPDIR/tsan_hooks.o" \
    common/grpc_tsan_hooks.cc
  san=(-fsanitize=thread "$TEST_TMPDIR/tsan_hooks.o")
fi
echo "sanitizer flags: ${san[*]:-none}"

# shellcheck disable=SC2086  # pkg-config's flags are words
gcc -std=c11 -Wall -Wextra -Werror -pedantic "${san[@]}" \
  -o "$TEST_TMPDIR/example" client/c/example.c $flags \
  -Wl,-rpath,"$prefix/lib"
# (ldd's output captured first: grep -q stopping early would SIGPIPE it.)
libs=$(ldd "$TEST_TMPDIR/example")
grep -qF "$prefix/lib/libhymcache.so.1" <<<"$libs" ||
  { echo "FAIL: example does not load the installed library" >&2; exit 1; }

out=$(tests/with_cluster.sh "$TEST_TMPDIR/example")
echo "$out"
grep -q "stored 4, hit prefix 4, loaded 4 blocks (262144 bytes): identical" \
  <<<"$out" || { echo "FAIL: unexpected output" >&2; exit 1; }
