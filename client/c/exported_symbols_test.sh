#!/bin/bash
# libhymcache.so.1 exports hymcache_* and nothing else (its version script),
# carries the soname libhymcache.so.1, and exports every function hymcache.h
# declares.
set -euo pipefail
lib=$1
header=client/c/hymcache.h

fail() { echo "FAIL: $*" >&2; exit 1; }

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libhymcache.so.1 ] || fail "soname is '$soname'"

# Defined dynamic symbols; the version node (HYMCACHE_1, an absolute
# symbol) is not code.
defined=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' |
  sed 's/@.*//' | sort -u)
[ -n "$defined" ] || fail "no exported symbols"
bad=$(echo "$defined" | grep -v '^hymcache_' || true)
if [ -n "$bad" ]; then
  echo "exported symbols outside hymcache_*:" >&2
  echo "$bad" | head -50 >&2
  fail "$(echo "$bad" | wc -l) stray exports"
fi

# Every function the header declares is exported.
declared=$(grep -oE '^[a-z_]+[a-z_ *]*\bhymcache_[a-z_]+\(' "$header" |
  grep -oE 'hymcache_[a-z_]+\(' | tr -d '(' | sort -u)
[ "$(echo "$declared" | wc -l)" -ge 20 ] || fail "header parse found too few"
missing=$(comm -23 <(echo "$declared") <(echo "$defined"))
[ -z "$missing" ] || fail "declared but not exported: $missing"
echo "OK: $(echo "$defined" | wc -l) hymcache_* symbols, soname $soname"
