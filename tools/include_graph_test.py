"""tools/include_graph.py on small trees written here."""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import include_graph  # noqa: E402


class IncludeGraphTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, path, text=""):
        full = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)

    def run_tool(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = include_graph.main(["--root", self.root, *args])
        return rc, out.getvalue(), err.getvalue()

    def layered_tree(self):
        self.write("proto/master.proto")  # its .pb.h is generated
        self.write("common/net.h", "#pragma once\n#include <string>\n"
                   '#include "absl/status/status.h"\n')
        self.write("common/net.cc", '#include "common/net.h"\n'
                   '#include "proto/master.pb.h"\n')
        self.write("master/service.h", '#include "common/net.h"\n')
        self.write("master/service.cc", '#include "master/service.h"\n'
                   '#include "wire.h"\n')  # beside it: master/wire.h
        self.write("master/wire.h", "")
        self.write("client/client.cc", '#include "common/net.h"\n')
        self.write("client/c/hymcache.h", "")
        self.write("tools/ctl.cc", '#include "client/client.h"\n'
                   '#include "hymcache/hymcache.h"\n'
                   '#include "master/service.h"\n')

    def test_a_layered_tree_passes_and_its_table_counts_includes(self):
        self.layered_tree()
        rc, out, err = self.run_tool()
        self.assertEqual(rc, 0, err)
        self.assertIn("| 1 | common | proto (1) | - |", out)
        self.assertIn("| 2 | master | common (1) | - |", out)
        # client/c/hymcache.h counts as client; system headers do not count.
        self.assertIn("| 4 | tools | client (2), master (1) | - |", out)
        self.assertIn("0 problem(s)", err)

    def test_an_include_up_the_floors_fails(self):
        self.layered_tree()
        self.write("common/bad.cc", '#include "master/service.h"\n')
        rc, _, err = self.run_tool()
        self.assertEqual(rc, 1)
        self.assertIn("common (floor 1) includes master (floor 2) 1 times",
                      err)

    def test_siblings_on_one_floor_may_not_include_each_other(self):
        self.layered_tree()
        self.write("client/uses_master.cc", '#include "master/service.h"\n')
        rc, _, err = self.run_tool()
        self.assertEqual(rc, 1)
        self.assertIn("client (floor 2) includes master (floor 2)", err)

    def test_a_test_may_include_any_package_and_is_listed_apart(self):
        self.layered_tree()
        self.write("client/client_test.cc", '#include "master/service.h"\n'
                   '#include "tools/ctl.h"\n')
        self.write("common/net_fuzz.cc", '#include "fuzz/input.h"\n')
        rc, out, err = self.run_tool()
        self.assertEqual(rc, 0, err)
        self.assertIn("| 2 | client | common (1) | master (1), tools (1) |",
                      out)

    def test_a_file_include_cycle_fails(self):
        self.layered_tree()
        self.write("master/a.h", '#include "master/b.h"\n')
        self.write("master/b.h", '#include "a.h"\n')
        rc, _, err = self.run_tool()
        self.assertEqual(rc, 1)
        self.assertIn("file include cycle: master/a.h -> master/b.h", err)

    def test_a_package_cycle_is_found(self):
        adj = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        self.assertEqual(include_graph.cycles(adj), [["a", "b", "c"]])
        self.assertEqual(include_graph.cycles({"a": {"a"}}), [["a"]])
        self.assertEqual(include_graph.cycles({"a": {"b"}, "b": set()}), [])

    def test_a_package_outside_the_layout_table_fails(self):
        self.layered_tree()
        self.write("newpkg/x.cc", '#include "common/net.h"\n')
        rc, _, err = self.run_tool()
        self.assertEqual(rc, 1)
        self.assertIn("package newpkg is not in the layout table", err)

    def test_check_readme_names_unnamed_sources_only(self):
        self.layered_tree()
        self.write("master/service_test.cc", "")
        self.write("tools/bench/dev_bench_io.cc", "")
        self.write("tools/bench/dev_bench_raw.cc", "")
        self.write("tools/run.sh", "")
        self.write("README.md", (
            "| `master/service.{h,cc}` | the service |\n"
            "| `wire.h` | **common/net.h** and `net.cc` |\n"
            "| `tools/bench/dev_bench_io.cc`, `_raw.cc` | parts |\n"
            "| `client/` | `client` and `hymcache.h` |\n"))
        rc, _, err = self.run_tool("--check-readme")
        self.assertEqual(rc, 1)
        missing = sorted(line.split("name ", 1)[1] for line in
                         err.splitlines() if "does not name" in line)
        # service_test.cc is named with service; ctl.cc and run.sh are not.
        self.assertEqual(missing, ["tools/ctl.cc", "tools/run.sh"])

    def test_brace_expansion(self):
        self.assertEqual(include_graph.expand_braces("a{,_b}.{h,cc}"),
                         ["a.h", "a.cc", "a_b.h", "a_b.cc"])


if __name__ == "__main__":
    unittest.main()
