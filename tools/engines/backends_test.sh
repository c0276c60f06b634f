#!/usr/bin/env bash
# Tests the SGLang HiCache backend (hymcache.sglang) and the LMCache remote
# storage plugin (hymcache.lmcache) against the installed engines' own
# classes and real HyMCache daemons. The engines live in their own venvs
# (tools/engines/peers_venv.sh), outside Bazel, so this script builds the
# daemons (-c opt), lays them out as runfiles, and runs pytest under each
# venv's python:
#
#   tools/engines/backends_test.sh                 both engines
#   tools/engines/backends_test.sh sglang|lmcache  one
#   tools/engines/backends_test.sh --ci            the same, but an engine
#       that cannot be installed is reported in one line
#       ("backends_test: ENGINE: NOT INSTALLED: <why>") and does not fail
#       the run; a test that fails still does
#
# Its last line is "backends: N passed, N failed" (pytest's counts). A venv
# that is not ready within $HYMCACHE_ENGINE_INSTALL_TIMEOUT seconds (900) is
# reported as not installed.
#
# The venvs are created on first use (the wheelhouse of tools/engines/pip_lib.sh makes later ones quick).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

ENGINES=()
CI=0
for arg in "$@"; do
  case "$arg" in
    sglang|lmcache) ENGINES+=("$arg") ;;
    --ci) CI=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "backends_test: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[ ${#ENGINES[@]} -gt 0 ] || ENGINES=(sglang lmcache)

log() { echo "backends_test: $*" >&2; }
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/hymcache-backends.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# The daemons, where python/testing/runfiles.py finds them.
timeout 3000 bazel build -c opt //master:hymcache-master \
  //storage_node:hymcache-storage 2>&1 | tail -n 1 >&2
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
mkdir -p "$TMP/runfiles/hymcache/master" "$TMP/runfiles/hymcache/storage_node"
ln -s "$BIN/master/hymcache-master" "$TMP/runfiles/hymcache/master/"
ln -s "$BIN/storage_node/hymcache-storage" "$TMP/runfiles/hymcache/storage_node/"

status=0
passed=0
failed=0
# Creating a venv downloads gigabytes on a fresh machine (the wheelhouse
# makes later ones quick): bounded, so that CI stays within its budget.
INSTALL_TIMEOUT=${HYMCACHE_ENGINE_INSTALL_TIMEOUT:-900}
for engine in "${ENGINES[@]}"; do
  start=$(date +%s)
  if ! PY=$(timeout "$INSTALL_TIMEOUT" bash tools/engines/peers_venv.sh "$engine" \
              2>"$TMP/$engine-install.log" | tail -n 1) \
      || [ ! -x "$PY" ]; then
    why=$(grep -v '^\s*$' "$TMP/$engine-install.log" | tail -n 1)
    [ $(( $(date +%s) - start )) -ge "$INSTALL_TIMEOUT" ] &&
      why="not installed within ${INSTALL_TIMEOUT}s (HYMCACHE_ENGINE_INSTALL_TIMEOUT)"
    echo "backends_test: $engine: NOT INSTALLED: ${why:-see peers_venv.sh}"
    [ "$CI" = 1 ] || { status=1; failed=$((failed + 1)); }
    continue
  fi
  log "$engine: venv ready in $(( $(date +%s) - start ))s ($PY)"
  ( cd "$TMP" && RUNFILES_DIR="$TMP/runfiles" TEST_TMPDIR="$TMP" \
      PYTHONPATH="$ROOT/python/testing" HF_HUB_OFFLINE=1 \
      timeout 600 "$PY" -m pytest -q -p no:cacheprovider \
      "$ROOT/python/tests/${engine}_backend_test.py" ) 2>&1 | tee "$TMP/$engine-test.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  p=$(grep -oE '[0-9]+ passed' "$TMP/$engine-test.log" | tail -n 1 | cut -d' ' -f1)
  f=$(grep -oE '[0-9]+ (failed|error)' "$TMP/$engine-test.log" | awk '{s += $1} END {print s + 0}')
  passed=$((passed + ${p:-0}))
  failed=$((failed + f))
  # A run that reported nothing (a crash before pytest's summary) fails.
  if [ -z "$p" ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); status=1; fi
  log "$engine: done in $(( $(date +%s) - start ))s"
done
echo "backends: $passed passed, $failed failed"
exit $status
