"""device_bench's plots: read (load) bandwidth and hit ratio per turn of the
staging-window hybrid device vs the LRU cache device, against the raw
O_DIRECT limit of the capacity tier, from `device_bench --json`.

  bazel run -c opt //tools/bench:device_bench -- --json=/tmp/device_bench.json
  /usr/bin/python3 tools/bench/plot_device_bench.py --out=DIR /tmp/device_bench.json

Writes DIR/device_bench_load_gbps.png (each mode's read GB/s per turn; raw
and raw_writer as horizontal lines, as device_bench measures them once) and
DIR/device_bench_hit_ratio.png (staging: PrefetchWaits already staged; LRU:
line hits). Modes with a writer are dashed in the colour of their base mode.

Needs Debian's python3-matplotlib. Exit status: 0 plots written, 1
matplotlib missing or DIR unwritable, 2 bad usage or a file that is not
device_bench JSON (the message names the file and the field).
"""

import argparse
import json
import math
import os
import sys

PROG = "plot_device_bench.py"
# Mode name -> (legend label, colour); other modes get the default cycle.
STYLE = {
    "staging": ("staging window (HybridDevice)", "tab:blue"),
    "lru": ("LRU cache (LruCacheDevice)", "tab:red"),
    "lru_small": ("LRU cache, small lines", "tab:purple"),
}


class BadInput(Exception):
    pass


def _finite(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadInput("%s: want a finite number, got %r" % (where, value))
    return float(value)


def load_bench(path):
    """{"config", "raw_gbps", "raw_writer_gbps", "modes": {name: [(turn,
    read_gbps, hit_ratio)]}}; BadInput when the file is something else."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise BadInput("%s: cannot read: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise BadInput("%s: not JSON: %s" % (path, e))
    if not isinstance(doc, dict) or not isinstance(doc.get("modes"), dict):
        raise BadInput("%s: no \"modes\" object (not a device_bench --json file?)" % path)
    out = {"config": doc.get("config") if isinstance(doc.get("config"), dict) else {},
           "modes": {}}
    for key in ("raw_gbps", "raw_writer_gbps"):
        out[key] = _finite(doc[key], "%s: %s" % (path, key)) if key in doc else 0.0
    for name, mode in doc["modes"].items():
        where = "%s: modes.%s" % (path, name)
        if not isinstance(mode, dict) or not isinstance(mode.get("turns"), list):
            raise BadInput("%s: no \"turns\" list" % where)
        rows = []
        for i, t in enumerate(mode["turns"]):
            w = "%s.turns[%d]" % (where, i)
            if not isinstance(t, dict):
                raise BadInput("%s: not an object" % w)
            for field in ("turn", "read_gbps", "hit_ratio"):
                if field not in t:
                    raise BadInput("%s: no \"%s\"" % (w, field))
            rows.append(tuple(_finite(t[f], "%s.%s" % (w, f))
                              for f in ("turn", "read_gbps", "hit_ratio")))
        if rows:
            out["modes"][name] = sorted(rows)
    if not out["modes"] and out["raw_gbps"] <= 0:
        raise BadInput("%s: neither per-turn modes nor raw_gbps to plot" % path)
    return out


def _style(name):
    base = name.replace("_writer", "")
    label, colour = STYLE.get(base, (base, None))
    if base != name:
        label += " + writer"
    return label, colour, "--" if base != name else "-"


def write_plots(bench, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    os.makedirs(out_dir, exist_ok=True)
    c = bench["config"]
    suffix = ""
    if "block_bytes" in c and "conversations" in c:
        suffix = " (%s conversations, %d KiB blocks, %s)" % (
            c["conversations"], int(c["block_bytes"]) // 1024, c.get("engine", "?"))
    paths = []
    for name, col, ylabel, title in (
            ("device_bench_load_gbps.png", 1, "read bandwidth (GB/s)",
             "Load bandwidth per turn: staging vs LRU vs raw"),
            ("device_bench_hit_ratio.png", 2, "hit ratio", "Hit ratio per turn: staging vs LRU")):
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
        for mode, rows in bench["modes"].items():
            label, colour, ls = _style(mode)
            ax.plot([r[0] for r in rows], [r[col] for r in rows], marker="o", linestyle=ls,
                    color=colour, label=label)
        if col == 1:
            if bench["raw_gbps"] > 0:
                ax.axhline(bench["raw_gbps"], color="black", label="raw O_DIRECT (limit)")
            if bench["raw_writer_gbps"] > 0:
                ax.axhline(bench["raw_writer_gbps"], color="black", linestyle="--",
                           label="raw + writer")
            top = max([bench["raw_gbps"], bench["raw_writer_gbps"]] +
                      [r[1] for rows in bench["modes"].values() for r in rows])
            ax.set_ylim(0, top * 1.1 if top > 0 else 1)
        else:
            ax.set_ylim(0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("turn")
        ax.set_ylabel(ylabel)
        ax.set_title(title + suffix, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Plot device_bench --json per turn.")
    parser.add_argument("--out", required=True, help="directory for the PNGs")
    parser.add_argument("bench", metavar="DEVICE_BENCH.json")
    args = parser.parse_args(argv)  # exits 2 on bad usage
    try:
        bench = load_bench(args.bench)
    except BadInput as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("%s: needs matplotlib for %s (Debian: apt-get install python3-matplotlib)"
              % (PROG, sys.executable), file=sys.stderr)
        return 1
    try:
        paths = write_plots(bench, args.out)
    except OSError as e:
        print("%s: cannot write plots to %s: %s" % (PROG, args.out, e), file=sys.stderr)
        return 1
    for p in paths:
        print("wrote %s" % p, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
