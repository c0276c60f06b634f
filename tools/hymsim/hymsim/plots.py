"""PNG plots (matplotlib's Agg backend: no display needed)."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import presets  # noqa: E402
from . import sim  # noqa: E402


def write_all(results, out_dir, paper_table1=True):
    """TTFT per turn of the six systems (with the paper's Table 1 dotted
    when `paper_table1`: only the Table 1 workload is comparable) and hit
    ratio per turn, hybrid vs DRAM-only. Returns the PNGs' paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    six = [s for s in sim.SYSTEMS if s in results]
    if six:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
        for s in six:
            rows = results[s]
            ax.plot([r["turn"] for r in rows], [r["ttft_ms_mean"] / 1000 for r in rows],
                    marker="o", label=sim.LABELS[s])
            if paper_table1 and s in presets.PAPER_TABLE1:
                p = presets.PAPER_TABLE1[s]
                ax.plot(range(1, len(p) + 1), p, linestyle=":", color=ax.lines[-1].get_color())
        ax.set_xlabel("turn")
        ax.set_ylabel("mean TTFT (s)")
        ax.set_title("TTFT per turn: model (solid), paper Table 1 (dotted)"
                     if paper_table1 else "TTFT per turn (model)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_dir, "ttft_per_turn.png"))
    pair = [s for s in ("hymcache", "hymcache_dram_only", "mooncake_dram",
                        "lmcache_local", "gpu_prefix") if s in results]
    if pair:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
        for s in pair:
            rows = results[s]
            ax.plot([r["turn"] for r in rows], [r["hit_ratio"] for r in rows],
                    marker="o", label=sim.LABELS[s])
        ax.set_xlabel("turn")
        ax.set_ylabel("prefix hit ratio (blocks)")
        ax.set_ylim(0, 1)
        ax.set_title("Hit ratio per turn: hybrid vs DRAM tiers")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_dir, "hit_ratio_per_turn.png"))
    return paths


def write_engine(results, measured, out_dir):
    """--engine_json: TTFT per turn of each mode, model (solid) and
    measured (dashed, when given). Returns the PNG's path."""
    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
    for mode, rows in results.items():
        ax.plot([r["turn"] for r in rows], [r["ttft_ms_mean"] for r in rows],
                marker="o", label="%s, model" % mode)
        m = (measured or {}).get(mode)
        if m:
            ax.plot([r["turn"] for r in m], [r["ttft_ms_mean"] for r in m],
                    marker="x", linestyle="--", color=ax.lines[-1].get_color(),
                    label="%s, measured" % mode)
    ax.set_xlabel("turn")
    ax.set_ylabel("mean TTFT (ms)")
    ax.set_title("kv_engine run: model vs measured")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, out_dir, "engine_ttft_per_turn.png")


def _save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
