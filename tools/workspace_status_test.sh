#!/bin/bash
# tools/workspace_status.sh and common/gen_build_info_stamp.sh in a tree
# without .git (a release tarball): the version from VERSION, the commit
# "unknown"; status files without the keys give empty strings (build_info.cc
# prints "unknown" for them).
set -euo pipefail
src="$TEST_SRCDIR/hymcache"
tree="$TEST_TMPDIR/tarball"
mkdir -p "$tree/tools" "$tree/common"
cp "$src/tools/workspace_status.sh" "$tree/tools/"
cp "$src/common/gen_build_info_stamp.sh" "$tree/common/"
cp "$src/VERSION" "$tree/"
# GIT_DIR/GIT_CEILING_DIRECTORIES keep git from finding an enclosing checkout.
out=$(cd / && GIT_CEILING_DIRECTORIES="$TEST_TMPDIR" "$tree/tools/workspace_status.sh")
echo "$out"
grep -qx "STABLE_HYMCACHE_VERSION $(head -n 1 "$src/VERSION")" <<<"$out"
grep -qx "STABLE_HYMCACHE_GIT_COMMIT unknown" <<<"$out"

# Without VERSION either.
rm "$tree/VERSION"
out=$(cd / && GIT_CEILING_DIRECTORIES="$TEST_TMPDIR" "$tree/tools/workspace_status.sh")
grep -qx "STABLE_HYMCACHE_VERSION unknown" <<<"$out"

# The stamp from real-looking status files, and from empty ones.
printf 'STABLE_HYMCACHE_VERSION 1.2.3\nSTABLE_HYMCACHE_GIT_COMMIT abc123-dirty\n' > "$TEST_TMPDIR/stable"
printf 'BUILD_TIMESTAMP 1796152764\n' > "$TEST_TMPDIR/volatile"
"$tree/common/gen_build_info_stamp.sh" "$TEST_TMPDIR/stable" "$TEST_TMPDIR/volatile" "$TEST_TMPDIR/a.cc"
grep -q 'kHymcacheStampVersion\[\] = "1.2.3";' "$TEST_TMPDIR/a.cc"
grep -q 'kHymcacheStampGitCommit\[\] = "abc123-dirty";' "$TEST_TMPDIR/a.cc"
grep -q 'kHymcacheStampBuildTimestamp\[\] = "1796152764";' "$TEST_TMPDIR/a.cc"
: > "$TEST_TMPDIR/empty"
"$tree/common/gen_build_info_stamp.sh" "$TEST_TMPDIR/empty" "$TEST_TMPDIR/missing" "$TEST_TMPDIR/b.cc"
grep -q 'kHymcacheStampVersion\[\] = "";' "$TEST_TMPDIR/b.cc"
# A value with quotes or backslashes cannot break the literal.
printf 'STABLE_HYMCACHE_VERSION 1"; evil\\\n' > "$TEST_TMPDIR/bad"
"$tree/common/gen_build_info_stamp.sh" "$TEST_TMPDIR/bad" "$TEST_TMPDIR/empty" "$TEST_TMPDIR/c.cc"
grep -q 'kHymcacheStampVersion\[\] = "1evil";' "$TEST_TMPDIR/c.cc"
echo PASS
