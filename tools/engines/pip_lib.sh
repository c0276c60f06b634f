# Sourced by tools/engines/venv.sh and peers_venv.sh: pip installs through a
# wheelhouse of our own outside the repository ($HYMCACHE_WHEELHOUSE,
# default ~/.cache/hymcache/wheels).
#
# Why not pip's own cache: on these machines pip writes nothing to it (its
# cache folder never appears), so every new venv downloaded every wheel
# again (about 5 GB for torch and its CUDA libraries). `pip download` into a
# folder keeps the files: a later install resolves against PyPI as usual but
# takes each wheel already in the folder instead of downloading it ("File
# was already downloaded"), then installs from the folder alone.
#
#   pip_cached PYTHON ARGS...   ARGS as for `pip install` (requirements,
#                               -r FILE, --no-deps)
HYMCACHE_WHEELHOUSE=${HYMCACHE_WHEELHOUSE:-$HOME/.cache/hymcache/wheels}

pip_cached() {
  local py=$1
  shift
  mkdir -p "$HYMCACHE_WHEELHOUSE"
  "$py" -m pip --disable-pip-version-check -q download \
    --find-links "$HYMCACHE_WHEELHOUSE" -d "$HYMCACHE_WHEELHOUSE" "$@" >&2 &&
    "$py" -m pip --disable-pip-version-check -q install --no-index \
      --find-links "$HYMCACHE_WHEELHOUSE" "$@" >&2
}

# Installs an engine that pins what PyPI cannot serve (a torch==X+cpu local
# version) or lists CUDA-only kernels: torch==TORCH from PyPI (the CUDA
# build, which runs on the CPU as well), PKG==VERSION without its
# dependencies, then the rest of PKG's requirements from its own metadata,
# less those whose names match the regular expression SKIP, plus EXTRA
# requirements.
#
#   install_engine PYTHON PKG VERSION TORCH SKIP [EXTRA...]
install_engine() {
  local py=$1 pkg=$2 version=$3 torch=$4 skip=$5
  shift 5
  "$py" -m pip --disable-pip-version-check -q install --upgrade pip wheel >&2
  pip_cached "$py" "torch==$torch" || return 1
  pip_cached "$py" --no-deps "$pkg==$version" || return 1
  local reqs
  reqs=$(mktemp)
  "$py" - "$pkg" "$skip" "$reqs" <<'PYEOF' || { rm -f "$reqs"; return 1; }
import importlib.metadata as md, re, sys
pkg, skip, out_path = sys.argv[1:]
skip = re.compile(r"^(%s)\s*($|[<>=!~;\[ ])" % skip, re.I)
out = [r for r in md.requires(pkg) or []
       if not skip.match(r) and "extra ==" not in r]
open(out_path, "w").write("\n".join(out) + "\n")
PYEOF
  pip_cached "$py" -r "$reqs" "torch==$torch" "$@"
  local rc=$?
  rm -f "$reqs"
  return $rc
}
