#!/usr/bin/env bash
# Builds a wheel of the `hymcache` Python package (the extension over the
# C++ SDK, the vLLM connector and the other engine adapters), so that an
# engine's venv takes it with one pip install:
#
#   tools/build_wheel.sh [--python=PY] [--out=DIR]
#       -> DIR/hymcache-VERSION-cpXY-cpXY-linux_x86_64.whl (default DIR: dist)
#   /path/to/vllm-venv/bin/pip install dist/hymcache-*.whl
#
# The package is what tools/install_python.sh installs (it builds and checks
# it). The extension links Debian 12's shared libraries (gRPC, Protobuf,
# Abseil, ...), so the wheel is for hosts that have them (tools/setup.sh,
# or the libhymcache1 .deb's dependencies) and for the Python it was built
# with (Debian 12: 3.11); it is not a manylinux wheel. The vLLM connector
# also needs numpy and vLLM, which an engine's venv has. Prints the wheel's
# path last.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=python3
OUT=dist
for arg in "$@"; do
  case "$arg" in
    --python=*) PYTHON="${arg#--python=}" ;;
    --out=*) OUT="${arg#--out=}" ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "build_wheel: unknown argument $arg" >&2; exit 2 ;;
  esac
done
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
bash tools/install_python.sh --python="$PYTHON" --target="$STAGE" >&2
mkdir -p "$OUT"
"$PYTHON" - "$STAGE" "$(cat VERSION)" "$OUT" <<'EOF'
"""Writes the wheel (PEP 427): the staged package plus its .dist-info."""
import base64
import hashlib
import os
import sys
import sysconfig
import zipfile

stage, version, out = sys.argv[1:4]
py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
tag = f"{py}-{py}-{plat}"
info = f"hymcache-{version}.dist-info"
files = {}
for root, _, names in os.walk(os.path.join(stage, "hymcache")):
    for n in sorted(names):
        if n.endswith(".pyc"):
            continue
        path = os.path.join(root, n)
        files[os.path.relpath(path, stage)] = open(path, "rb").read()
files[f"{info}/METADATA"] = (
    "Metadata-Version: 2.1\nName: hymcache\n"
    f"Version: {version}\n"
    "Summary: HyMCache client: the C++ SDK for Python, and the vLLM, SGLang "
    "and LMCache adapters\n"
    f"Requires-Python: =={sys.version_info[0]}.{sys.version_info[1]}.*\n"
    ).encode()
files[f"{info}/WHEEL"] = (
    "Wheel-Version: 1.0\nGenerator: hymcache tools/build_wheel.sh\n"
    f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
record = []
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    record.append(f"{name},sha256={digest.decode()},{len(data)}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
wheel = os.path.join(out, f"hymcache-{version}-{tag}.whl")
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in files.items():
        zi = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
        zi.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(zi, data)
print(wheel)
EOF
