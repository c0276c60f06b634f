"""Paths of files in a Bazel py_test's or py_binary's runfiles."""

import os
import sys


def runfile(rel):
    """Path of `rel` (e.g. "master/hymcache-master") in the runfiles."""
    for var in ("TEST_SRCDIR", "RUNFILES_DIR", "PYTHON_RUNFILES"):
        root = os.environ.get(var)
        if root:
            path = os.path.join(root, os.environ.get("TEST_WORKSPACE",
                                                      "hymcache"), rel)
            if os.path.exists(path):
                return path
    here = os.path.abspath(sys.argv[0]) + ".runfiles"
    return os.path.join(here, "hymcache", rel)
