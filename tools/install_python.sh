#!/usr/bin/env bash
# Builds the `hymcache` Python package (the pybind11 extension over the C++
# SDK, -c opt) with Bazel and installs it:
#
#   tools/install_python.sh                   into the site-packages of python3
#                                             (a venv's when one is active)
#   tools/install_python.sh --target=DIR      into DIR (then PYTHONPATH=DIR)
#   tools/install_python.sh --python=/path/to/python3 [--target=DIR]
#
# The extension is built against Debian's Python 3 headers (python3-dev), so
# the interpreter must be the same major.minor version (Debian 12: 3.11); a
# venv made from Debian's python3 qualifies (`python3 -m venv
# --system-site-packages` also sees Debian's python3-numpy). Installs
# DIR/hymcache/{*.py (the engine adapters too), __init__.pyi, py.typed,
# _hymcache.so} and checks that `import hymcache` works there.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=python3
TARGET=""
for arg in "$@"; do
  case "$arg" in
    --target=*) TARGET="${arg#--target=}" ;;
    --python=*) PYTHON="${arg#--python=}" ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "install_python: unknown argument $arg" >&2; exit 2 ;;
  esac
done

want=$(pkg-config --modversion python3)
have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$want" != "$have" ]; then
  echo "install_python: $PYTHON is Python $have; the extension builds" \
       "against Python $want's headers (python3-dev)" >&2
  exit 1
fi
if [ -z "$TARGET" ]; then
  TARGET=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fi

bazel build -c opt //python/hymcache 2>&1 | tail -n 1
mkdir -p "$TARGET/hymcache"
# Every module of the package: the engine adapters (sglang.py, lmcache.py,
# ...) import their engine lazily, so they install everywhere.
install -m 0644 python/hymcache/*.py \
  python/hymcache/__init__.pyi python/hymcache/py.typed "$TARGET/hymcache/"
install -m 0755 bazel-bin/python/hymcache/_hymcache.so "$TARGET/hymcache/"
( cd / && PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c \
    'import hymcache, sys; print("install_python: hymcache installed in", hymcache.__path__[0])' )
