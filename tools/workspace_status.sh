#!/bin/sh
# Bazel's --workspace_status_command (.bazelrc): the version, git commit and
# tree state that //common:build_info stamps into the binaries.
# STABLE_ keys go to stable-status.txt (a change re-stamps, which recompiles
# only the stamp and relinks); Bazel adds BUILD_TIMESTAMP to volatile-status.txt,
# which never triggers a rebuild on its own.
# Must succeed without git or .git (a release tarball): "unknown" then.
cd "$(dirname "$0")/.." || exit 1
version=unknown
if [ -r VERSION ]; then version=$(head -n 1 VERSION | tr -d ' \t\r'); fi
commit=unknown
if command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    commit="$commit-dirty"
  fi
fi
echo "STABLE_HYMCACHE_VERSION ${version:-unknown}"
echo "STABLE_HYMCACHE_GIT_COMMIT $commit"
