"""hymsim's command line: run the model, compare with the paper's Table 1
and with measured TTFT, write JSON and plots."""

import argparse
import dataclasses
import json
import os
import sys

from . import engine_run
from . import presets
from . import sim
from . import trace


def _parser():
    p = argparse.ArgumentParser(
        prog="hymsim",
        description="Trace-driven TTFT-per-turn model of six KV-cache systems.")
    p.add_argument("--model", default="qwen2.5-32b", choices=sorted(presets.MODELS))
    p.add_argument("--block_tokens", type=int, default=128)
    p.add_argument("--trace", help="Mooncake JSONL trace (timestamp in ms); "
                   "turns inferred from prefix chains unless it carries them")
    p.add_argument("--trace_block_tokens", type=int, default=512,
                   help="tokens per hash_id in --trace (Mooncake: 512)")
    p.add_argument("--time_scale", type=float, default=1.0,
                   help="--trace: divide inter-arrival times by this")
    p.add_argument("--workload", default="paper", choices=["paper", "lmsys", "custom"],
                   help="built-in generator: the Table 1 workload, the single-node "
                   "LMSYS run (LMSYS-Chat-1M's per-turn size, 32 in flight), or "
                   "the flags below")
    for f in dataclasses.fields(trace.MultiTurnOptions):
        p.add_argument("--" + f.name, type=type(f.default), default=None,
                       help="generator (--workload=custom): default %s" % f.default)
    p.add_argument("--inflight", type=int, default=None,
                   help="cap on requests sent and not yet answered (a "
                   "benchmark client's concurrency); default: none")
    p.add_argument("--systems", default="all",
                   help="comma list of %s; 'all' = six + variants" %
                   ",".join(sim.SYSTEMS + sim.VARIANTS))
    p.add_argument("--bench_json", action="append", default=[],
                   help="device_bench or hymbench JSON: this machine's bandwidths")
    p.add_argument("--hw", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a Hardware field, e.g. worker_nic_bps=3e9")
    p.add_argument("--calibrate", action="store_true",
                   help="print the model next to the paper's Table 1")
    p.add_argument("--measured", help="measured TTFT per turn: a kv_engine JSON "
                   "(schema hymcache.kv_engine/1) or a JSON list of "
                   "{turn, ttft_ms_mean, ttft_ms_p50}")
    p.add_argument("--engine_json", help="model the kv_engine run described by "
                   "this kv_engine JSON (one engine, back to back, one DRAM "
                   "node) instead of the paper's systems")
    p.add_argument("--json", help="write the per-turn results here")
    p.add_argument("--plot", help="write PNGs into this directory")
    p.add_argument("--write_trace", help="write the generated workload as JSONL and exit")
    return p


def apply_bench_json(hw, path):
    """Takes this machine's bandwidths from a benchmark's JSON: device_bench
    (raw_gbps -> capacity-tier refill; modes.lru.read_gbps -> LRU miss
    rate; modes.staging.read_gbps -> delivered staged reads, returned so the
    caller turns it into hym_read_efficiency once the network rate is
    final) or hymbench (overall.load_gbps -> per-request network rate).
    Returns (what was set, staged reads in bytes/s or None)."""
    with open(path) as f:
        j = json.load(f)
    used = []
    staged = None
    if "raw_gbps" in j and "modes" in j:
        hw.hym_ssd_read_bps = j["raw_gbps"] * 1e9
        used.append("hym_ssd_read_bps=raw_gbps")
        modes = j["modes"]
        if "lru" in modes:
            hw.lru_miss_bps = modes["lru"]["read_gbps"] * 1e9
            used.append("lru_miss_bps=modes.lru.read_gbps")
        if "staging" in modes:
            staged = modes["staging"]["read_gbps"] * 1e9
            used.append("hym_read_efficiency=modes.staging.read_gbps/worker_nic_bps")
    elif "overall" in j and "load_gbps" in j["overall"]:
        bps = j["overall"]["load_gbps"] * 1e9
        hw.worker_nic_bps = hw.storage_nic_bps = bps
        used.append("worker_nic_bps=storage_nic_bps=overall.load_gbps")
    else:
        raise ValueError("%s: neither device_bench nor hymbench JSON" % path)
    return used, staged


def load_requests(args, block_tokens):
    if args.trace:
        reqs = trace.load_mooncake(args.trace)
        # Re-express ids at the model's block size: one trace id covers
        # trace_block_tokens tokens = r model blocks.
        r = max(1, args.trace_block_tokens // block_tokens)
        if any(q.turn < 0 for q in reqs):
            trace.infer_turns(reqs, args.trace_block_tokens)
        t0 = reqs[0].timestamp if reqs else 0.0
        for q in reqs:
            q.timestamp = t0 + (q.timestamp - t0) / args.time_scale
            q.hash_ids = [h * r + k for h in q.hash_ids for k in range(r)]
        return reqs, None
    o = {"paper": presets.paper_workload,
         "lmsys": presets.lmsys_workload}.get(args.workload, trace.MultiTurnOptions)()
    for f in dataclasses.fields(trace.MultiTurnOptions):
        v = getattr(args, f.name)
        if v is not None:
            setattr(o, f.name, v)
    return trace.generate_multiturn(o, block_tokens), o.concurrency


def run(requests, systems, model, hw, block_tokens, concurrency, inflight=None):
    out = {}
    for name in systems:
        system = sim.make_system(name, hw, model.kv_bytes_per_token() * block_tokens)
        out[name] = sim.per_turn(sim.simulate(requests, system, model, hw,
                                              block_tokens, concurrency, inflight))
    return out


def overall_mean_s(rows):
    """Mean TTFT in seconds over every request of per-turn `rows`."""
    n = sum(r["requests"] for r in rows)
    return sum(r["ttft_ms_mean"] * r["requests"] for r in rows) / n / 1000 if n else 0.0


def calibration_rows(results):
    """Per system and turn: paper seconds, model seconds, relative error."""
    rows = []
    for name, paper in presets.PAPER_TABLE1.items():
        model = {r["turn"]: r["ttft_ms_mean"] / 1000 for r in results.get(name, [])}
        for t, p in enumerate(paper, 1):
            if t in model:
                rows.append({"system": name, "turn": t, "paper_s": p,
                             "model_s": model[t], "rel_error": model[t] / p - 1})
    return rows


def ordering(results, turn, names):
    """`names` sorted by the model's mean TTFT at `turn`."""
    ttft = {n: next(r["ttft_ms_mean"] for r in results[n] if r["turn"] == turn)
            for n in names}
    return sorted(names, key=ttft.__getitem__)


def paper_ordering(turn):
    return sorted(presets.PAPER_TABLE1,
                  key=lambda n: presets.PAPER_TABLE1[n][turn - 1])


def crossover_turn(results, a="hymcache", b="mooncake_dram"):
    """First turn from which `a` stays faster than `b` (None: never)."""
    ta = {r["turn"]: r["ttft_ms_mean"] for r in results[a]}
    tb = {r["turn"]: r["ttft_ms_mean"] for r in results[b]}
    turns = sorted(set(ta) & set(tb))
    for i, t in enumerate(turns):
        if all(ta[u] < tb[u] for u in turns[i:]):
            return t
    return None


def read_measured(path):
    """{mode: [{turn, ttft_ms_mean, ttft_ms_p50, ...}]} from a kv_engine JSON
    (both modes, 1-based turns) or a JSON list of {turn, ttft_ms_mean,
    ttft_ms_p50} (HyMCache). None when the file is missing; ValueError when
    it is neither."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        try:
            measured = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError("%s: not JSON: %s" % (path, e)) from None
    if engine_run.is_engine_doc(measured):
        return engine_run.measured_rows(engine_run.load(path))
    if not isinstance(measured, list):
        raise ValueError("%s: neither a kv_engine JSON nor a list of "
                         "{turn, ttft_ms_mean}" % path)
    try:
        return {"hymcache": [{"turn": int(m["turn"]),
                              "ttft_ms_mean": float(m["ttft_ms_mean"]),
                              "ttft_ms_p50": float(m.get("ttft_ms_p50", m["ttft_ms_mean"]))}
                             for m in measured]}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError("%s: bad row: %r" % (path, e)) from None


def compare_measured(results, measured, system):
    """Predicted (system's model) vs measured rows per turn."""
    pred = {r["turn"]: r for r in results[system]}
    rows = []
    for m in measured:
        p = pred.get(m["turn"])
        if p is None:
            continue
        row = {"turn": m["turn"],
               "measured_ms_mean": m["ttft_ms_mean"],
               "measured_ms_p50": m["ttft_ms_p50"],
               "model_ms_mean": p["ttft_ms_mean"],
               "model_ms_p50": p["ttft_ms_p50"],
               "rel_error": p["ttft_ms_mean"] / m["ttft_ms_mean"] - 1,
               "rel_error_p50": p["ttft_ms_p50"] / m["ttft_ms_p50"] - 1}
        if "hit_blocks_mean" in m and "hit_blocks_mean" in p:
            row["measured_hit_blocks_mean"] = m["hit_blocks_mean"]
            row["model_hit_blocks_mean"] = p["hit_blocks_mean"]
        rows.append(row)
    return rows


def print_measured(cmp_rows, system):
    hits = cmp_rows and "model_hit_blocks_mean" in cmp_rows[0]
    print("\n%s predicted vs measured (ms): turn  model mean  measured mean  "
          "error | model p50  measured p50  error%s"
          % (system, " | hit blocks model measured" if hits else ""))
    for r in cmp_rows:
        line = "  %2d %10.1f %10.1f %+6.0f%% | %8.1f %8.1f %+6.0f%%" % (
            r["turn"], r["model_ms_mean"], r["measured_ms_mean"], 100 * r["rel_error"],
            r["model_ms_p50"], r["measured_ms_p50"], 100 * r["rel_error_p50"])
        if hits:
            line += " | %6.1f %6.1f" % (r["model_hit_blocks_mean"],
                                        r["measured_hit_blocks_mean"])
        print(line)


def main_engine(args, hw, overridden, notes):
    """--engine_json: the model of one kv_engine run vs its measurement."""
    doc = engine_run.load(args.engine_json)
    params = engine_run.engine_params(doc)
    if "worker_nic_bps" in overridden:
        params.load_bps = params.store_bps = hw.worker_nic_bps
        params.load_latency_s = 0.0
        params.sources.append("load_bps = store_bps = %.2f GB/s (worker_nic_bps, "
                              "overrides the run's)" % (hw.worker_nic_bps / 1e9))
    if "lookup_s" in overridden:
        params.lookup_s = hw.lookup_s
        params.sources.append("lookup_s = %.2f ms (overrides the run's)" % (1e3 * hw.lookup_s))
    modes = [m for m in ("recompute", "hymcache")
             if m in doc["config"].get("modes", ["recompute", "hymcache"])]
    results = {m: engine_run.per_turn(engine_run.simulate(doc, params, m)) for m in modes}
    print("kv_engine run %s: %d requests, %d KiB blocks of %d tokens, prefill %.0f "
          "tokens/s (kv_engine turn t = hymsim turn t+1)"
          % (args.engine_json, len(doc["requests"]), params.block_bytes >> 10,
             params.block_tokens, params.prefill_tokens_per_s))
    for n in notes + params.sources:
        print("  " + n)
    out = {"engine_json": args.engine_json, "params": dataclasses.asdict(params),
           "systems": results}
    measured = read_measured(args.measured) if args.measured else None
    if args.measured and measured is None:
        print("\nmeasured: %s is missing; no comparison" % args.measured)
    for mode in modes:
        if measured and mode in measured:
            rows = compare_measured(results, measured[mode], mode)
            out.setdefault("measured", {})[mode] = rows
            print_measured(rows, mode)
        elif not measured:
            print("\n%s: turn model mean / p50 (ms), hit blocks" % mode)
            for r in results[mode]:
                print("  %2d %10.1f %10.1f %6.1f" % (r["turn"], r["ttft_ms_mean"],
                                                   r["ttft_ms_p50"], r["hit_blocks_mean"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.plot:
        from . import plots
        print("wrote %s" % plots.write_engine(results, measured, args.plot))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "eviction":
        from . import evict_replay
        return evict_replay.main(argv[1:])
    args = _parser().parse_args(argv)
    model = presets.MODELS[args.model]
    hw = presets.paper_hardware()
    notes = []
    staged = None
    overridden = set()
    try:
        for path in args.bench_json:
            used, s = apply_bench_json(hw, path)
            staged = s if s is not None else staged
            notes += ["%s: %s" % (path, u) for u in used]
            overridden.update(f for f in presets.HARDWARE_FIELDS if any(f in u for u in used))
        for kv in args.hw:
            k, _, v = kv.partition("=")
            if k not in presets.HARDWARE_FIELDS or not v:
                raise ValueError("--hw: unknown field or empty value: %r" % kv)
            setattr(hw, k, type(getattr(hw, k))(float(v)) if k != "name" else v)
            notes.append("--hw %s" % kv)
            overridden.add(k)
        if args.engine_json:
            return main_engine(args, hw, overridden, notes)
        if staged is not None:
            hw.hym_read_efficiency = min(1.0, staged / hw.worker_nic_bps)
        if notes:
            hw.name = "custom"
        requests, concurrency = load_requests(args, args.block_tokens)
        measured = read_measured(args.measured) if args.measured else None
    except (OSError, ValueError, KeyError, trace.TraceError) as e:
        print("hymsim: %s" % e, file=sys.stderr)
        return 2
    if args.write_trace:
        with open(args.write_trace, "w") as f:
            trace.write_jsonl(requests, f)
        return 0
    systems = (sim.SYSTEMS + sim.VARIANTS if args.systems == "all"
               else args.systems.split(","))
    for s in systems:
        if s not in sim.LABELS:
            print("hymsim: unknown system %r" % s, file=sys.stderr)
            return 2
    if args.inflight is None and args.workload == "lmsys" and not args.trace:
        args.inflight = presets.LMSYS_INFLIGHT
    if args.inflight is not None and args.inflight < 1:
        print("hymsim: --inflight must be >= 1", file=sys.stderr)
        return 2
    results = run(requests, systems, model, hw, args.block_tokens, concurrency,
                  args.inflight)

    kvb = model.kv_bytes_per_token()
    print("model %s: %d KiB KV/token, %d MiB per %d-token block; hardware %s; "
          "%d requests" % (model.name, kvb >> 10, (kvb * args.block_tokens) >> 20,
                           args.block_tokens, hw.name, len(requests)))
    rate = 4096 / (model.prefill_flops(0, 4096) / (hw.gpu_peak_flops * hw.gpu_mfu))
    print("prefill: %.0f TFLOP/s x %.2f MFU = %.0f tokens/s for a 4k-token prompt "
          "(%d workers)" % (hw.gpu_peak_flops / 1e12, hw.gpu_mfu, rate, hw.prefill_workers))
    for n in notes:
        print("  " + n)
    turns = sorted({r["turn"] for rows in results.values() for r in rows})
    print("\nTTFT mean, s (hit ratio) per turn")
    print("%-24s" % "system" + "".join("%14d" % t for t in turns))
    for name, rows in results.items():
        by = {r["turn"]: r for r in rows}
        print("%-24s" % name + "".join(
            "%8.2f (%3.0f%%)" % (by[t]["ttft_ms_mean"] / 1000, 100 * by[t]["hit_ratio"])
            if t in by else "%14s" % "-" for t in turns))
    overall = {name: overall_mean_s(rows) for name, rows in results.items()}
    print("%-24s" % "all turns (mean TTFT)" + "".join(
        " %s %.2f s" % (n, v) for n, v in overall.items()))
    doc = {"model": model.name, "hardware": dataclasses.asdict(hw),
           "block_tokens": args.block_tokens, "requests": len(requests),
           "systems": results, "overall_ttft_s": overall}
    if overall.get("lmcache_local") and overall.get("hymcache"):
        gain = overall["lmcache_local"] / overall["hymcache"]
        doc["gain_over_lmcache"] = gain
        ref = ("" if args.trace or args.workload == "custom" else
               " (paper, single node: %.1fx)" % presets.PAPER_SINGLE_NODE_GAIN
               if args.workload == "lmsys" else
               " (paper: %.1fx single node, %.2fx PD-disaggregated)"
               % (presets.PAPER_SINGLE_NODE_GAIN, presets.PAPER_PD_GAIN))
        print("local LMCache / HyMCache, mean TTFT over all requests: %.2fx%s"
              % (gain, ref))
    if all(s in results for s in presets.PAPER_TABLE1):
        x = crossover_turn(results)
        print("\nHyMCache overtakes 1 TB Mooncake from turn %s (paper: %d)"
              % (x, presets.PAPER_CROSSOVER_TURN))
        doc["crossover_turn"] = x
    if "hymcache" in results and "hymcache_noprefetch" in results:
        on = {r["turn"]: r for r in results["hymcache"]}
        gains = []
        for r in results["hymcache_noprefetch"]:
            o = on.get(r["turn"])
            if o and o["load_ms_mean"] > 0:
                gains.append((r["turn"], r["load_ms_mean"] / o["load_ms_mean"] - 1,
                              1 - o["ttft_ms_mean"] / r["ttft_ms_mean"]))
        if gains:
            t, g, c = gains[-1]
            print("prefetch at turn %d: load time -> bandwidth +%.0f%% (paper "
                  "microbenchmark +%.0f%%), TTFT -%.0f%% (paper end to end -%.0f%%)"
                  % (t, 100 * g, 100 * presets.PAPER_PREFETCH_MICRO_GAIN, 100 * c,
                     100 * presets.PAPER_PREFETCH_E2E_CUT))
    if args.calibrate:
        rows = calibration_rows(results)
        doc["calibration"] = rows
        print("\nTable 1: paper s / model s / relative error")
        print("%-18s" % "system" + "".join("%22d" % t for t in range(1, 8)))
        for name in presets.PAPER_TABLE1:
            cells = [r for r in rows if r["system"] == name]
            print("%-18s" % name + "".join(
                "%6.2f /%6.2f /%+5.0f%%" % (r["paper_s"], r["model_s"], 100 * r["rel_error"])
                for r in cells))
        print("\nper-turn order, fastest first (model | paper):")
        for t in range(1, 8):
            if t in turns:
                print("  turn %d: %s | %s" % (t, " < ".join(ordering(results, t, list(presets.PAPER_TABLE1))),
                                               " < ".join(paper_ordering(t))))
    if args.measured is not None:
        if measured is None:
            print("\nmeasured: %s is missing; no comparison" % args.measured)
        elif "hymcache" in results and "hymcache" in measured:
            cmp_rows = compare_measured(results, measured["hymcache"], "hymcache")
            doc["measured"] = cmp_rows
            print_measured(cmp_rows, "hymcache")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.plot:
        from . import plots
        table1 = args.workload == "paper" and not args.trace
        for path in plots.write_all(results, args.plot, paper_table1=table1):
            print("wrote %s" % path)
    return 0
