#!/usr/bin/env python3
"""The include graph between the top-level packages (folders) of the tree,
and the layout rule it must keep (README.md, "Development"):

  floor 0  proto, fuzz, bazel    generated wire types; test mains and inputs
  floor 1  common                what every floor above shares
  floor 2  master, storage_node, client
                                 the three components; none includes another
  floor 3  python, tests         the Python binding over client; the
                                 end-to-end harness over the daemons
  floor 4  tools, deploy         programs over everything below

A library file (any file but a test) may include only files of its own
package or of a package on a lower floor. A test (*_test.cc, *_fuzz.cc, a
test's fixture header *_test_*.h) is a leaf that nothing includes: it may
include any package, and its includes are listed apart. There must be no
cycle of includes between files, nor between packages.

Usage:
  tools/include_graph.py [--root=DIR]       the table; exit 1 on a violation
  tools/include_graph.py --check-readme     also: every source file under
      master/ storage_node/ common/ client/ tools/ is named in README.md

Standard library only.
"""
import argparse
import os
import re
import sys

FLOORS = {
    "proto": 0, "fuzz": 0, "bazel": 0,
    "common": 1,
    "master": 2, "storage_node": 2, "client": 2,
    "python": 3, "tests": 3,
    "tools": 4, "deploy": 4,
}
# Include paths that do not start with their folder: the C API's public
# header is installed as <hymcache/hymcache.h> (client/c/BUILD include_prefix).
ALIASES = {"hymcache/": "client/c/"}
SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".c")
SKIP_DIRS = {".git", "third_party"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
TEST = re.compile(r"(_test\.cc|_fuzz\.cc|_test_[a-z_]+\.h|_test\.h)$")


def sources(root):
    """Paths (relative to root) of the C/C++ sources, bazel-* links skipped."""
    out = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs
                         if x not in SKIP_DIRS and not x.startswith("bazel-")
                         and not x.startswith("."))
        for f in sorted(files):
            if f.endswith(SOURCE_EXT):
                out.append(os.path.normpath(os.path.join(rel, f)))
    return out


def package(path):
    return path.split(os.sep, 1)[0] if os.sep in path else ""


def is_test(path):
    return bool(TEST.search(path))


def resolve(inc, src, files, top_dirs):
    """The repository file (or generated file's package path) `inc` names
    from `src`; None for a system header."""
    for alias, real in ALIASES.items():
        if inc.startswith(alias):
            return real + inc[len(alias):]
    beside = os.path.normpath(os.path.join(os.path.dirname(src), inc))
    if beside in files:
        return beside
    if inc.split("/", 1)[0] in top_dirs:
        return inc  # a repository path (proto/*.pb.h are generated)
    return None


def graph(root):
    """(edges, test_edges, file_graph): package -> {package: count} for
    library files and for tests; file -> set of files it includes."""
    paths = sources(root)
    files = set(paths)
    top_dirs = {p.split("/", 1)[0] for p in os.listdir(root)
                if os.path.isdir(os.path.join(root, p))}
    edges, test_edges, fgraph = {}, {}, {}
    for p in paths:
        with open(os.path.join(root, p), encoding="utf-8",
                  errors="replace") as f:
            text = f.read()
        src_pkg = package(p)
        fgraph[p] = set()
        table = test_edges if is_test(p) else edges
        table.setdefault(src_pkg, {})
        for inc in INCLUDE.findall(text):
            target = resolve(inc, p, files, top_dirs)
            if target is None:
                continue
            if target in files:
                fgraph[p].add(target)
            dst_pkg = target.split("/", 1)[0]
            if dst_pkg != src_pkg:
                table[src_pkg][dst_pkg] = table[src_pkg].get(dst_pkg, 0) + 1
    return edges, test_edges, fgraph


def cycles(adj):
    """The strongly connected components with more than one node (or a
    self loop) of `adj` (node -> iterable of nodes), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in adj.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, 4 * len(adj)))
    for v in sorted(adj):
        if v not in index:
            visit(v)
    return out


def violations(edges, test_edges, fgraph):
    """Messages for every break of the layout rule."""
    bad = []
    for src in sorted(set(edges) | set(test_edges)):
        if src not in FLOORS:
            bad.append(f"package {src or '(root)'} is not in the layout "
                       "table (tools/include_graph.py FLOORS)")
    for src, dsts in sorted(edges.items()):
        for dst in sorted(dsts):
            if src in FLOORS and dst in FLOORS and FLOORS[dst] >= FLOORS[src]:
                bad.append(f"{src} (floor {FLOORS[src]}) includes {dst} "
                           f"(floor {FLOORS[dst]}) {dsts[dst]} times")
    for c in cycles({s: set(d) for s, d in edges.items()}):
        bad.append("package include cycle: " + " -> ".join(c))
    for c in cycles(fgraph):
        bad.append("file include cycle: " + " -> ".join(c))
    return bad


def table(edges, test_edges):
    """The layout table as Markdown."""
    pkgs = sorted(set(edges) | set(test_edges),
                  key=lambda p: (FLOORS.get(p, 99), p))
    rows = ["| floor | package | includes (library files) | tests also include |",
            "|---|---|---|---|"]
    for p in pkgs:
        lib = edges.get(p, {})
        tst = {k: v for k, v in test_edges.get(p, {}).items() if k not in lib}
        fmt = lambda d: ", ".join(
            f"{k} ({d[k]})" for k in sorted(
                d, key=lambda k: (FLOORS.get(k, 99), k))) or "-"
        rows.append(f"| {FLOORS.get(p, '?')} | {p or '(root)'} | {fmt(lib)} "
                    f"| {fmt(tst)} |")
    return "\n".join(rows)


# --check-readme ---------------------------------------------------------
README_DIRS = ("master", "storage_node", "common", "client", "tools")
README_EXT = (".h", ".cc", ".c", ".py", ".sh")


def expand_braces(token):
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(token[:m.start()] + alt + token[m.end():])
    return out


def readme_names(text):
    """Every file name or stem the README names in backticks or bold: braces
    expanded (`a.{h,cc}`), `_x.cc` after `pre_y.cc` read as `pre_x.cc`."""
    names = set()
    prev_stem = ""
    for token in re.findall(r"`([^`\s]+)`|\*\*([^*\s]+)\*\*", text):
        token = token[0] or token[1]
        for t in expand_braces(token):
            base = t.rstrip("/").split("/")[-1]
            if (re.match(r"_[a-z0-9]", base) and prev_stem
                    and "_" in prev_stem):
                base = prev_stem.rsplit("_", 1)[0] + base
            stem = base.split(".", 1)[0]
            if not stem:
                continue
            names.add(t.rstrip("/"))
            names.add(base)
            names.add(stem)
            prev_stem = stem
    return names


def readme_missing(root):
    """Source files under README_DIRS that README.md does not name. A file is
    named by its path, its file name or its stem (foo names foo.h and
    foo.cc); a test (foo_test.cc, foo_fuzz.cc) is named with what it tests;
    BUILD files and data are not sources."""
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        names = readme_names(f.read())
    missing = []
    for top in README_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            for f in sorted(files):
                if not f.endswith(README_EXT):
                    continue
                rel = os.path.relpath(os.path.join(d, f), root)
                stem = f.split(".", 1)[0]
                tested = re.sub(r"_(test|fuzz)$", "", stem)
                tested = re.sub(r"_test_[a-z_]+$", "", tested)
                if (rel in names or f in names or stem in names
                        or tested in names):
                    continue
                missing.append(rel)
    return missing


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--check-readme", action="store_true")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    edges, test_edges, fgraph = graph(root)
    print(table(edges, test_edges))
    bad = violations(edges, test_edges, fgraph)
    if args.check_readme:
        for m in readme_missing(root):
            bad.append(f"README.md does not name {m}")
    for b in bad:
        print("include_graph: " + b, file=sys.stderr)
    print(f"include_graph: {len(bad)} problem(s)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
