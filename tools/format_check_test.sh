#!/usr/bin/env bash
# tools/format_check.sh in a scratch repository: it passes on a fresh clone
# with no upstream and on well-formatted changes, whatever the untouched
# lines look like, and fails on a misformatted changed line, committed or
# not; --fix rewrites only the changed lines.
set -uo pipefail
CHECK=$(readlink -f "$1")
CONFIG=$(readlink -f "$2")
WORK=${TEST_TMPDIR:-$(mktemp -d)}/format_check_test
rm -rf "$WORK"
mkdir -p "$WORK/origin/tools"
cd "$WORK/origin"
fails=0
expect() {  # expect RC DESCRIPTION -- command...
  local want=$1 what=$2
  shift 3
  local out
  out=$("$@" 2>&1)
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: $what: exit $rc, want $want"
    echo "$out"
    fails=$((fails + 1))
  else
    echo "ok: $what"
  fi
}

git init -q -b main .
git config user.email t@example.com
git config user.name test
cp "$CHECK" tools/format_check.sh
cp "$CONFIG" .clang-format
# Untouched lines far from the style (a long line, odd spacing).
cat >old.cc <<'CC'
int   Old( int a,int b ) { return a+b; }    // a comment that makes this line much longer than eighty columns
CC
git add -A && git commit -qm base

# A fresh clone of main: no origin/main beside it, HEAD is main.
git clone -q "$WORK/origin" "$WORK/fresh"
expect 0 "a fresh clone passes" -- bash "$WORK/fresh/tools/format_check.sh"

# A branch adding well-formatted code passes; untouched old.cc is not checked.
git checkout -q -b topic
printf 'int New(int a) { return a; }\n' >new.cc
git add -A && git commit -qm good
expect 0 "a well-formatted change passes" -- bash tools/format_check.sh

# A misformatted changed line fails, committed or not.
printf 'int  Bad( int a ){return a;}\n' >>new.cc
expect 1 "an uncommitted misformatted line fails" -- bash tools/format_check.sh
git commit -qam bad
expect 1 "a committed misformatted line fails" -- bash tools/format_check.sh
# ... also from a clone that has the branch and origin/main.
git clone -q -b topic "$WORK/origin" "$WORK/branch"
expect 1 "a clone of the branch sees it against origin/main" -- \
  bash "$WORK/branch/tools/format_check.sh"
expect 0 "--base=HEAD checks only uncommitted edits" -- \
  bash tools/format_check.sh --base=HEAD
expect 2 "an unknown base is an argument error" -- \
  bash tools/format_check.sh --base=no-such-rev

# --fix rewrites the changed lines only.
expect 0 "--fix" -- bash tools/format_check.sh --fix
expect 0 "after --fix it passes" -- bash tools/format_check.sh
if ! grep -q '^int Bad(int a) { return a; }$' new.cc; then
  echo "FAIL: --fix did not format the changed line"; fails=$((fails + 1))
fi
if ! grep -q '^int   Old( int a,int b )' old.cc; then
  echo "FAIL: --fix touched an unchanged line"; fails=$((fails + 1))
fi

# A tree without git (a release tarball) has nothing to compare.
mkdir -p "$WORK/tarball/tools" && cp "$CHECK" "$WORK/tarball/tools/"
expect 0 "outside git it passes" -- \
  env GIT_CEILING_DIRECTORIES="$WORK" bash "$WORK/tarball/tools/format_check.sh"

[ "$fails" -eq 0 ] && echo PASS || { echo "$fails failed"; exit 1; }
