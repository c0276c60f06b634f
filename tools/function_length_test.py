"""tools/function_length.py on small C++ sources written here."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import function_length  # noqa: E402


def body(lines):
    return "".join(f"  x += {i};\n" for i in range(lines))


class FunctionLengthTest(unittest.TestCase):
    def test_finds_functions_and_their_spans(self):
        src = (
            "namespace a {\n"                      # 1
            "int F(int x) {\n"                     # 2
            + body(3) +                            # 3-5
            "  auto l = [&](int y) { return y; };\n"  # 6: a lambda counts for F
            "  return x;\n"                        # 7
            "}\n"                                  # 8
            "Foo::Foo(int v) : v_(v) {\n"          # 9
            "  if (v) { v_ = 2; }\n"               # 10
            "}\n"                                  # 11
            "}  // namespace a\n")
        got = list(function_length.functions(src))
        self.assertEqual(got, [("F", 2, 8), ("Foo::Foo", 9, 11)])

    def test_braces_in_comments_strings_and_macros_do_not_count(self):
        src = (
            "#define OPEN {\n"
            "void G() {\n"
            "  // }\n"
            "  /* { */ const char* s = \"}{\";\n"
            "  char c = '}';\n"
            "  auto r = R\"(})\";\n"
            "}\n")
        self.assertEqual(list(function_length.functions(src)), [("G", 2, 7)])

    def test_exit_status_names_long_functions_unless_allowed(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "long.cc")
            with open(path, "w") as f:
                f.write("void Long() {\n" + body(130) + "}\n"
                        "void Short() {\n" + body(10) + "}\n")
            # A test file is left out.
            with open(os.path.join(d, "long_test.cc"), "w") as f:
                f.write("void T() {\n" + body(200) + "}\n")
            self.assertEqual(function_length.main(["--max=120", d]), 1)
            self.assertEqual(function_length.main(["--max=132", d]), 0)
            self.assertEqual(
                function_length.main(["--max=120", f"--allow={path}:Long", d]),
                0)


if __name__ == "__main__":
    unittest.main()
