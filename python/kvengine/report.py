"""The KV engine's report: per-turn TTFT table, JSON document and plot."""

import json
import statistics

SCHEMA = "hymcache.kv_engine/1"
MODES = ("hymcache", "recompute")


def _ttft_stats(records):
    if not records:
        return None
    ttft = [r["ttft_ms"] for r in records]
    return {"p50_ms": statistics.median(ttft),
            "mean_ms": statistics.fmean(ttft),
            "max_ms": max(ttft)}


def _row(name, entries):
    """A table row over `entries` (the JSON "requests" entries)."""
    row = {"turn": name, "requests": len(entries),
           "blocks_mean": statistics.fmean(e["blocks"] for e in entries)}
    for mode in MODES:
        recs = [e[mode] for e in entries if e[mode] is not None]
        row[mode] = _ttft_stats(recs)
    h = [e["hymcache"] for e in entries if e["hymcache"] is not None]
    row["hit_blocks_mean"] = (statistics.fmean(r["loaded_blocks"] for r in h)
                              if h else None)
    row["hit_blocks_total"] = sum(r["loaded_blocks"] for r in h) if h else None
    if row["hymcache"] and row["recompute"]:
        row["speedup_mean"] = (row["recompute"]["mean_ms"] /
                               row["hymcache"]["mean_ms"])
        row["speedup_p50"] = (row["recompute"]["p50_ms"] /
                              row["hymcache"]["p50_ms"])
    else:
        row["speedup_mean"] = row["speedup_p50"] = None
    return row


def build(config, requests, results):
    """The JSON document (schema in the package doc). `results` maps a mode
    to its per-request records (same order as `requests`) or is missing
    the mode."""
    entries = []
    for i, req in enumerate(requests):
        e = {"index": i, "conversation": req.conversation, "turn": req.turn,
             "timestamp_ms": req.timestamp_ms,
             "input_tokens": req.input_length,
             "output_tokens": req.output_length}
        for mode in MODES:
            rec = results.get(mode)
            e[mode] = dict(rec[i]) if rec is not None else None
        first = e["hymcache"] or e["recompute"]
        e["blocks"] = first["blocks"]
        e["full_blocks"] = first["full_blocks"]
        entries.append(e)
    turns = sorted({e["turn"] for e in entries})
    rows = [_row(t, [e for e in entries if e["turn"] == t]) for t in turns]
    total = _row("all", entries) if entries else None
    return {"schema": SCHEMA, "config": config, "turns": rows, "all": total,
            "requests": entries}


def _ms(stats, key):
    return f"{stats[key]:9.1f}" if stats else f"{'-':>9}"


def format_table(doc):
    """The per-turn table as text."""
    head = (f"{'turn':>4} {'reqs':>5} {'blocks':>7} {'hit':>6} "
            f"{'hym p50':>9} {'hym mean':>9} {'rec p50':>9} {'rec mean':>9} "
            f"{'speedup':>7}")
    lines = ["TTFT per turn (ms; hym = with HyMCache, rec = recompute only; "
             "hit = blocks loaded per request)", head]
    rows = list(doc["turns"]) + ([doc["all"]] if doc["all"] else [])
    for r in rows:
        hit = (f"{r['hit_blocks_mean']:6.1f}" if r["hit_blocks_mean"]
               is not None else f"{'-':>6}")
        speed = (f"{r['speedup_mean']:6.2f}x" if r["speedup_mean"]
                 else f"{'-':>7}")
        lines.append(
            f"{r['turn']:>4} {r['requests']:5d} {r['blocks_mean']:7.1f} "
            f"{hit} {_ms(r['hymcache'], 'p50_ms')} "
            f"{_ms(r['hymcache'], 'mean_ms')} {_ms(r['recompute'], 'p50_ms')} "
            f"{_ms(r['recompute'], 'mean_ms')} {speed}")
    return "\n".join(lines)


def write_json(doc, path):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def plot(doc, path):
    """TTFT per turn (mean, with the p50 as markers) for both modes, and the
    loaded blocks per request on a second axis, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["turns"]
    turns = [r["turn"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"hymcache": ("tab:blue", "with HyMCache"),
              "recompute": ("tab:red", "recompute only")}
    for mode, (color, label) in styles.items():
        pts = [(t, r[mode]) for t, r in zip(turns, rows) if r[mode]]
        if not pts:
            continue
        xs = [t for t, _ in pts]
        ax.plot(xs, [s["mean_ms"] for _, s in pts], "-o", color=color,
                label=f"{label} (mean)")
        ax.plot(xs, [s["p50_ms"] for _, s in pts], "x", color=color,
                label=f"{label} (p50)")
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT (ms)")
    ax.set_xticks(turns)
    ax.set_ylim(bottom=0)
    hits = [(t, r["hit_blocks_mean"]) for t, r in zip(turns, rows)
            if r["hit_blocks_mean"] is not None]
    if hits:
        ax2 = ax.twinx()
        ax2.bar([t for t, _ in hits], [h for _, h in hits], width=0.4,
                alpha=0.2, color="tab:green", label="blocks loaded (mean)")
        ax2.set_ylabel("blocks loaded per request")
        ax2.set_ylim(bottom=0)
        handles = ax.get_legend_handles_labels()
        h2 = ax2.get_legend_handles_labels()
        ax.legend(handles[0] + h2[0], handles[1] + h2[1], loc="upper left",
                  fontsize="small")
    else:
        ax.legend(loc="upper left", fontsize="small")
    cfg = doc["config"]
    ax.set_title(f"TTFT per turn: {cfg['workload']['kind']}, prefill "
                 f"{cfg['prefill_tokens_per_s']:g} tokens/s, "
                 f"{cfg['block_bytes'] >> 10} KiB blocks", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
