"""Paths of files in a Bazel py_test's or py_binary's runfiles."""

import os


def runfile(rel):
    """Path of `rel` (e.g. "master/hymcache-master") in the runfiles."""
    for var in ("TEST_SRCDIR", "RUNFILES_DIR"):
        root = os.environ.get(var)
        if root:
            path = os.path.join(root, os.environ.get("TEST_WORKSPACE",
                                                      "hymcache"), rel)
            if os.path.exists(path):
                return path
    # This file is <runfiles>/hymcache/python/testing/runfiles.py.
    workspace = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    return os.path.join(workspace, rel)
