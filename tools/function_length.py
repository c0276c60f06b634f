#!/usr/bin/env python3
"""Lists C++ functions longer than a bound, longest first.

    tools/function_length.py [--max=120] [--allow=FILE:NAME ...] PATH...

Reads the .cc and .h files under each PATH (tests, *_test.cc, left out) and
prints one line per function whose body, from its head to its closing brace,
spans more than --max lines: "LINES FILE:LINE NAME". Exit status 1 when any
is listed that --allow does not name (issue 28's floor: none over 120 lines
in master/ and storage_node/), else 0.

It counts braces, not grammar: comments, string and character literals and
preprocessor lines are blanked first, and a '{' opens a function when the
text before it (since the last ';', '{' or '}') ends like a function head
(a ')' with qualifiers, or a constructor's initializer list) that is not a
control statement or a lambda. Nested functions (lambdas, local classes)
count toward the function that holds them.
"""
import argparse
import os
import re
import sys

_CONTROL = re.compile(r"\b(if|for|while|switch|catch)\s*\(")
_HEAD_END = re.compile(
    r"\)\s*(const|override|final|noexcept|mutable|volatile|&&?|->[^{]*|"
    r"ABSL_[A-Z_]+\([^)]*\)|\s)*$")
_INIT_LIST = re.compile(r"\)\s*:\s*[\w:]+[({]")
_LAMBDA = re.compile(r"\[[^\]]*\]\s*(\([^)]*\))?\s*(mutable\s*)?(->[^{]*)?$")


def blank(src):
    """`src` with comments, literals and preprocessor lines blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif src.startswith('R"', i) and re.match(r'R"[^(\s]*\(', src[i:]):
            delim = re.match(r'R"([^(\s]*)\(', src[i:]).group(1)
            j = src.find(")" + delim + '"', i)
            j = n if j < 0 else j + len(delim) + 2
        elif c in "\"'" and not (c == "'" and i > 0 and src[i - 1].isalnum()):
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j += 1
        elif c == "#" and (i == 0 or src[i - 1] == "\n"):
            j = src.find("\n", i)
            while j > 0 and src[j - 1] == "\\":
                j = src.find("\n", j + 1)
            j = n if j < 0 else j
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", src[i:j]))
        i = j
    return "".join(out)


def functions(src):
    """Yields (name, first line, last line) of each outermost function."""
    s = blank(src)
    stack = []  # (is_function, head_start, name)
    last = 0
    for i, c in enumerate(s):
        if c == "{":
            head = s[last:i].strip()
            is_fn = False
            name = ""
            if (head and not any(f for f, _, _ in stack) and
                    (_HEAD_END.search(head) or _INIT_LIST.search(head)) and
                    not _LAMBDA.search(head)):
                before_paren = head.split("(")[0]
                if not _CONTROL.search(before_paren + "(") and before_paren.split():
                    is_fn = True
                    name = before_paren.split()[-1]
            head_start = last + (len(s[last:i]) - len(s[last:i].lstrip()))
            stack.append((is_fn, head_start, name))
            last = i + 1
        elif c == "}":
            if stack:
                is_fn, head_start, name = stack.pop()
                if is_fn:
                    yield name, s.count("\n", 0, head_start) + 1, s.count("\n", 0, i) + 1
            last = i + 1
        elif c == ";":
            last = i + 1


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max", type=int, default=120)
    p.add_argument("--allow", action="append", default=[],
                   help="FILE:NAME of a known long function not to fail on")
    p.add_argument("paths", nargs="+")
    a = p.parse_args(argv)
    rows = []
    for root in a.paths:
        files = [root] if os.path.isfile(root) else [
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
        for path in sorted(files):
            if not path.endswith((".cc", ".h")) or path.endswith("_test.cc"):
                continue
            with open(path, errors="replace") as f:
                for name, first, last in functions(f.read()):
                    if last - first + 1 > a.max:
                        rows.append((last - first + 1, path, first, name))
    failed = False
    for lines, path, first, name in sorted(rows, reverse=True):
        allowed = f"{os.path.normpath(path)}:{name}" in a.allow
        failed |= not allowed
        print(f"{lines:5d} {path}:{first} {name}{' (allowed)' if allowed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
