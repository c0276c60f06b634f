"""hymbench's plots: prefix hit ratio and load bandwidth per turn (or per
window of trace time) from one or more `hymbench replay --json` reports, one
line per report, e.g. a prefetch-on and a prefetch-off run of one trace.

  /usr/bin/python3 tools/hymbench/plot.py --out=DIR ON.json [OFF.json ...]

Writes DIR/hymbench_hit_ratio.png (each run's prefix hit ratio, and the
infinite-cache ceiling dashed) and DIR/hymbench_load_gbps.png (loaded bytes
/ summed Load wall time per group, report.h's definition). A line's label is
"prefetch on" / "prefetch off" from the report's config, plus the workload
and concurrency when the runs differ in those too.

`hymbench replay --plot=DIR` and `hymbench plot --json=A,B --plot=DIR` run
this same script (embedded in the binary) with /usr/bin/python3.

Needs Debian's python3-matplotlib (Agg backend, no display). Exit status: 0
plots written, 1 matplotlib missing or DIR unwritable, 2 bad usage or a
report that is not hymbench JSON (the message names the file and the field).
"""

import argparse
import json
import math
import os
import sys

PROG = "plot.py"


class BadInput(Exception):
    pass


def _number(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadInput("%s: want a finite number, got %r" % (where, value))
    return float(value)


def load_report(path):
    """The parts of a hymbench JSON report the plots use; BadInput names the
    file and the field when it is something else."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise BadInput("%s: cannot read: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise BadInput("%s: not JSON: %s" % (path, e))
    if not isinstance(doc, dict):
        raise BadInput("%s: want a JSON object (hymbench replay --json)" % path)
    groups = doc.get("groups")
    if not isinstance(groups, list) or not groups:
        raise BadInput("%s: \"groups\" missing or empty (not a hymbench replay --json report?)"
                       % path)
    config = doc.get("config", {})
    if not isinstance(config, dict):
        raise BadInput("%s: \"config\" is not an object" % path)
    group_by = doc.get("group_by", "turn")
    if group_by not in ("turn", "window"):
        raise BadInput("%s: \"group_by\" is %r (want \"turn\" or \"window\")" % (path, group_by))
    rows = []
    for i, g in enumerate(groups):
        where = "%s: groups[%d]" % (path, i)
        if not isinstance(g, dict):
            raise BadInput("%s: not an object" % where)
        row = {}
        for field in ("key", "prefix_hit_ratio", "ceiling_hit_ratio", "load_gbps"):
            if field not in g:
                raise BadInput("%s: no \"%s\"" % (where, field))
            row[field] = _number(g[field], "%s.%s" % (where, field))
        rows.append(row)
    rows.sort(key=lambda r: r["key"])
    return {"path": path, "config": config, "group_by": group_by, "rows": rows}


def labels(reports):
    """One legend label per report: prefetch on/off, then whatever else
    tells the runs apart (workload, concurrency, transport), else the file."""
    out = []
    for r in reports:
        c = r["config"]
        prefetch = c.get("prefetch")
        out.append("prefetch %s" % ("on" if prefetch == "true" else "off")
                   if prefetch in ("true", "false") else os.path.basename(r["path"]))
    for key in ("workload", "concurrency", "transport"):
        if len(set(out)) == len(out):
            break
        values = [str(r["config"].get(key, "?")) for r in reports]
        if len(set(values)) > 1:
            name = {"workload": "", "concurrency": "workers ", "transport": ""}[key]
            out = ["%s, %s%s" % (l, name, os.path.basename(v) if key == "workload" else v)
                   for l, v in zip(out, values)]
    if len(set(out)) < len(out):
        out = ["%s (%s)" % (l, os.path.basename(r["path"])) for l, r in zip(out, reports)]
    return out


def _title_suffix(reports):
    c = reports[0]["config"]
    parts = []
    if "workload" in c and all(r["config"].get("workload") == c["workload"] for r in reports):
        parts.append(os.path.basename(c["workload"]))
    if "block_bytes" in c:
        try:
            parts.append("%d KiB blocks" % (int(c["block_bytes"]) // 1024))
        except ValueError:
            pass
    return " (%s)" % ", ".join(parts) if parts else ""


def write_plots(reports, out_dir):
    """Writes the two PNGs; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    os.makedirs(out_dir, exist_ok=True)
    by_turn = all(r["group_by"] == "turn" for r in reports)
    xlabel = "turn" if by_turn else "trace time (s, window start)"
    names = labels(reports)
    suffix = _title_suffix(reports)
    paths = []
    for name, field, ylabel, title in (
            ("hymbench_hit_ratio.png", "prefix_hit_ratio", "prefix hit ratio (blocks)",
             "Hit ratio per %s" % ("turn" if by_turn else "window")),
            ("hymbench_load_gbps.png", "load_gbps", "load bandwidth (GB/s, per request)",
             "Load bandwidth per %s" % ("turn" if by_turn else "window"))):
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
        for r, label in zip(reports, names):
            xs = [row["key"] for row in r["rows"]]
            ax.plot(xs, [row[field] for row in r["rows"]], marker="o", label=label)
            if field == "prefix_hit_ratio":
                ax.plot(xs, [row["ceiling_hit_ratio"] for row in r["rows"]], linestyle="--",
                        color=ax.lines[-1].get_color(), label="%s: ceiling" % label)
        if field == "prefix_hit_ratio":
            ax.set_ylim(0, 1.02)
        else:
            ax.set_ylim(bottom=0)
        if by_turn:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title + suffix, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None, prog=PROG):
    parser = argparse.ArgumentParser(
        prog=prog, description="Plot hymbench replay --json reports per turn.")
    parser.add_argument("--out", required=True, help="directory for the PNGs")
    parser.add_argument("reports", nargs="+", metavar="REPORT.json")
    args = parser.parse_args(argv)  # exits 2 on bad usage
    try:
        reports = [load_report(p) for p in args.reports]
    except BadInput as e:
        print("%s: %s" % (prog, e), file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("%s: needs matplotlib for %s (Debian: apt-get install python3-matplotlib)"
              % (prog, sys.executable), file=sys.stderr)
        return 1
    try:
        paths = write_plots(reports, args.out)
    except OSError as e:
        print("%s: cannot write plots to %s: %s" % (prog, args.out, e), file=sys.stderr)
        return 1
    for p in paths:
        print("wrote %s" % p, file=sys.stderr)
    return 0


if __name__ == "__main__":
    # hymbench runs this script as `python3 -c SCRIPT ...`.
    sys.exit(main(prog="hymbench plot" if sys.argv[0] == "-c" else PROG))
