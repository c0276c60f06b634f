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
