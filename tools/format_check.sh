#!/usr/bin/env bash
# Checks that the C and C++ lines a change adds or edits are formatted as
# .clang-format says (clang-format-14 through git-clang-format), without
# asking the rest of the tree to be reformatted.
#
#   tools/format_check.sh                 # against the base found below
#   tools/format_check.sh --base=HEAD~3   # the last three commits and
#                                         # whatever is not committed
#   tools/format_check.sh --fix           # rewrite the changed lines
#
# The change is everything since the base, uncommitted edits included. The
# base: --base, else $HYMCACHE_FORMAT_BASE, else the merge-base of HEAD with
# origin/main, else with a local branch main. A fresh clone of main has no
# origin/main beside itself and its HEAD is main: the base is HEAD and only
# uncommitted edits are checked, so the check never fails on lines the
# change did not touch. Outside a git checkout (a release tarball) it has
# nothing to compare and passes.
#
# Closing line: "format: OK (...)" or "format: N files with misformatted
# changed lines (...)", the diff that would fix them printed before it.
# Exit status 1 only for misformatted changed lines; 2 for a bad argument or
# a missing clang-format-14.
set -uo pipefail
cd "$(dirname "$0")/.."

BASE=${HYMCACHE_FORMAT_BASE:-}
FIX=0
for arg in "$@"; do
  case "$arg" in
    --base=*) BASE=${arg#*=} ;;
    --fix) FIX=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "format_check.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

GCF=$(command -v git-clang-format-14 || command -v git-clang-format || true)
CF=$(command -v clang-format-14 || true)
if [ -z "$GCF" ] || [ -z "$CF" ]; then
  echo "format: clang-format-14 and git-clang-format are required" \
       "(Debian's clang-format-14)" >&2
  exit 2
fi
if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  echo "format: OK (not a git checkout: nothing to compare)"
  exit 0
fi

if [ -n "$BASE" ]; then
  if ! git rev-parse --verify -q "$BASE^{commit}" >/dev/null; then
    echo "format_check.sh: no such revision: $BASE" >&2
    exit 2
  fi
  how="since $BASE"
else
  for upstream in origin/main main; do
    if git rev-parse --verify -q "$upstream^{commit}" >/dev/null; then
      BASE=$(git merge-base HEAD "$upstream" 2>/dev/null) && break
    fi
  done
  if [ -n "$BASE" ]; then
    how="since the merge-base with $upstream, $(git rev-parse --short "$BASE")"
  else
    BASE=HEAD
    how="no upstream: uncommitted edits only"
  fi
fi

# Only our sources: third_party/ holds others' code as they wrote it.
EXTENSIONS=c,cc,cpp,h,hpp
PATHS=(':(exclude)third_party/**')

if [ "$FIX" = "1" ]; then
  "$GCF" --binary "$CF" --extensions "$EXTENSIONS" --force "$BASE" -- \
    "${PATHS[@]}"
  exit $?
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$GCF" --binary "$CF" --extensions "$EXTENSIONS" --diff "$BASE" -- \
  "${PATHS[@]}" >"$out" 2>&1
rc=$?
# git-clang-format-14 exits 0 with or without a diff; its output says which.
if grep -q '^diff --git ' "$out"; then
  cat "$out"
  n=$(grep -c '^diff --git ' "$out")
  echo "format: $n files with misformatted changed lines ($how);" \
       "tools/format_check.sh --fix rewrites them"
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  cat "$out" >&2
  echo "format: git-clang-format failed (exit $rc, $how)" >&2
  exit 2
fi
echo "format: OK ($how)"
