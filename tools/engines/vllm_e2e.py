"""vLLM end to end on HyMCache: a multi-turn chat replayed side by side.

    python vllm_e2e.py --bin=BAZEL_BIN --work=DIR [--short]

Writes a small Llama-architecture model (config.json written here, random
weights from a fixed seed saved as safetensors, no tokenizer: prompts are
token ids), starts a HyMCache cluster (a master, one hybrid node, one DRAM
node), and replays the same multi-turn workload through vLLM's CPU build in
each configuration, one engine process per configuration:

  none      no connector, prefix caching on, a KV pool holding at most 25%
            of the conversations' KV
  hymcache  the same plus hymcache.vllm.HyMCacheConnector
  offload   the same plus vLLM's own CPU offloading (OffloadingConnector
            through kv_offloading_size), with HyMCache's DRAM budget
  kill      (long form) hymcache under a fresh salt, the storage node
            holding the run's chains SIGKILLed before turn 4: the affected
            turns recompute
  nomaster  (long form) the connector pointed at an address where no
            master listens: vLLM serves by recomputation, logged once

Each turn sends the whole history (earlier prompts and the model's answers)
plus new user tokens; greedy; TTFT is the time from add_request to the
first output token with one request in flight. Prints per-turn tables and
the summary line; exits non-zero if any configuration's outputs differ from
recomputation's or nothing was measured.

`--run-config` is the child mode (one engine, one configuration).
"""

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

SHORT = dict(layers=2, hidden=128, intermediate=512, heads=2, kv_heads=1,
             vocab=1024, conversations=2, turns=3, first=96, user=48,
             out_tokens=4, block=32)
LONG = dict(layers=4, hidden=512, intermediate=4096, heads=8, kv_heads=2,
            vocab=2048, conversations=8, turns=6, first=400, user=350,
            out_tokens=8, block=32)


# Configurations that may not run on this machine's vLLM build (vLLM 0.32's
# CPU offloading needs CUDA or XPU): said in one line, not a failure.
OPTIONAL = ("offload",)


# ---------------------------------------------------------------- model

def write_model(path, p, seed=1234):
    """A Llama config and random weights; the head is scaled up so greedy
    argmaxes are far apart (numerics of a chunked prefill do not flip them)."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    head_dim = p["hidden"] // p["heads"]
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": p["hidden"], "intermediate_size": p["intermediate"],
        "num_hidden_layers": p["layers"], "num_attention_heads": p["heads"],
        "num_key_value_heads": p["kv_heads"], "head_dim": head_dim,
        "vocab_size": p["vocab"], "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    g = torch.Generator().manual_seed(seed)
    h, i, kv = p["hidden"], p["intermediate"], p["kv_heads"] * head_dim

    def w(*shape, std=0.05):
        return (torch.randn(*shape, generator=g) * std).contiguous()

    t = {"model.embed_tokens.weight": w(p["vocab"], h, std=1.0),
         "model.norm.weight": torch.ones(h),
         "lm_head.weight": w(p["vocab"], h, std=1.0)}
    for l in range(p["layers"]):
        pre = f"model.layers.{l}."
        t[pre + "self_attn.q_proj.weight"] = w(h, h)
        t[pre + "self_attn.k_proj.weight"] = w(kv, h)
        t[pre + "self_attn.v_proj.weight"] = w(kv, h)
        t[pre + "self_attn.o_proj.weight"] = w(h, h)
        t[pre + "mlp.gate_proj.weight"] = w(i, h)
        t[pre + "mlp.up_proj.weight"] = w(i, h)
        t[pre + "mlp.down_proj.weight"] = w(h, i)
        t[pre + "input_layernorm.weight"] = torch.ones(h)
        t[pre + "post_attention_layernorm.weight"] = torch.ones(h)
    save_file(t, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})


def make_workload(p, seed=99):
    import random
    r = random.Random(seed)
    conv = []
    for _ in range(p["conversations"]):
        turns = [[r.randrange(3, p["vocab"]) for _ in range(p["first"])]]
        for _ in range(p["turns"] - 1):
            turns.append([r.randrange(3, p["vocab"]) for _ in range(p["user"])])
        conv.append(turns)
    return conv


def kv_bytes_per_token(p):
    return p["layers"] * 2 * p["kv_heads"] * (p["hidden"] // p["heads"]) * 4


def total_tokens(p):
    """The conversations' KV at the end: every history at its last turn."""
    last = p["first"] + (p["turns"] - 1) * (p["user"] + p["out_tokens"])
    return p["conversations"] * last


# ---------------------------------------------------------------- child

def dead_address():
    """A loopback address nothing listens on (bound, then closed)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


def run_config(a):
    """One engine, one configuration; writes per-request results as JSON."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    p = json.loads(a.params)
    workload = json.load(open(a.workload))
    from vllm import EngineArgs, LLMEngine, SamplingParams

    ekw = dict(
        model=a.model, skip_tokenizer_init=True, dtype="float32",
        block_size=p["block"], enable_prefix_caching=True,
        kv_cache_memory_bytes=a.pool_blocks * p["block"] * kv_bytes_per_token(p),
        max_model_len=a.max_model_len, max_num_seqs=4,
        max_num_batched_tokens=a.max_model_len, seed=0, enforce_eager=True,
        gpu_memory_utilization=a.mem_util,
    )
    if a.config in ("hymcache", "kill", "nomaster"):
        master = a.master if a.config != "nomaster" else dead_address()
        extra = {"master": master, "transport": "tcp",
                 "salt": a.salt, "load_deadline": 5.0}
        ekw["kv_transfer_config"] = {
            "kv_connector": "HyMCacheConnector",
            "kv_connector_module_path": "hymcache.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": extra}
    elif a.config == "offload":
        ekw["kv_offloading_size"] = a.offload_gib
        ekw["kv_offloading_backend"] = "native"
    engine = LLMEngine.from_engine_args(EngineArgs(**ekw))
    sp = SamplingParams(temperature=0.0, max_tokens=p["out_tokens"],
                        ignore_eos=True, detokenize=False)
    # One request outside the workload first, so that no configuration's
    # first turn pays for the engine's (or the connector's) first call.
    warm = [(7 * i) % (p["vocab"] - 3) + 3 for i in range(2 * p["block"] + 1)]
    engine.add_request("warmup", {"prompt_token_ids": warm},
                       SamplingParams(temperature=0.0, max_tokens=1,
                                      detokenize=False))
    while engine.has_unfinished_requests():
        engine.step()
    hist = [[] for _ in workload]
    results = []
    kill_pids = json.loads(a.kill_pids) if a.kill_pids else {}
    for turn in range(p["turns"]):
        if a.config == "kill" and kill_pids and turn == a.kill_turn:
            # The node holding the most bytes (the chains of this run sit on
            # it): SIGKILL, no goodbye to the master.
            import hymcache
            with hymcache.Client([a.master], transport="tcp") as c:
                nodes = c.stats()["nodes"]
            victim = max((n for n in nodes if n["name"] in kill_pids),
                         key=lambda n: n["used_bytes"])
            os.kill(kill_pids[victim["name"]], signal.SIGKILL)
            print(f"vllm_e2e: kill run: SIGKILLed storage node "
                  f"{victim['name']} ({victim['used_bytes']} bytes used) "
                  f"before turn {turn + 1}", flush=True)
            kill_pids = {}
        for c, conv in enumerate(workload):
            prompt = hist[c] + conv[turn]
            rid = f"c{c}t{turn}"
            t0 = time.perf_counter()
            engine.add_request(rid, {"prompt_token_ids": prompt}, sp)
            ttft = None
            final = None
            while final is None:
                for out in engine.step():
                    if out.request_id != rid:
                        continue
                    if ttft is None and out.outputs and out.outputs[0].token_ids:
                        ttft = time.perf_counter() - t0
                    if out.finished:
                        final = out
            toks = list(final.outputs[0].token_ids)
            results.append(dict(conv=c, turn=turn, prompt_len=len(prompt),
                                ttft=ttft, cached=final.num_cached_tokens or 0,
                                output=toks))
            hist[c] = prompt + toks
    with open(a.out, "w") as f:
        json.dump(results, f)


# ---------------------------------------------------------------- cluster

class Daemon:
    def __init__(self, argv, log_path, prefix, timeout=60.0):
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=self.log)
        deadline = time.monotonic() + timeout
        line = b""
        fd = self.proc.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or (not select.select([fd], [], [], max(left, 0))[0]
                             and time.monotonic() > deadline):
                raise RuntimeError(f"{argv[0]} not ready: {line!r}")
            c = os.read(fd, 1)
            if not c:
                raise RuntimeError(f"{argv[0]} exited (log {log_path})")
            line += c
        self.line = line.decode().strip()
        if not self.line.startswith(prefix):
            raise RuntimeError(f"{argv[0]} said {self.line!r}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_cluster(bin_dir, work, node_bytes):
    master = Daemon([f"{bin_dir}/master/hymcache-master",
                     f"--db_path={work}/master", "--listen=127.0.0.1:0",
                     "--logtostderr"],
                    f"{work}/master.log", "hymcache-master listening on ")
    addr = master.line.split()[-1]
    store = f"{bin_dir}/storage_node/hymcache-storage"
    common = [f"--master={addr}", "--data_port=0", "--control_port=0",
              "--logtostderr"]
    mb = max(node_bytes >> 20, 16)
    hybrid = Daemon([store, "--name=hybrid-0", *common, "--device=hybrid",
                     f"--capacity_path={work}/capacity.dat",
                     f"--capacity_bytes={2 * mb}M",
                     f"--staging_bytes={max(mb // 2, 16)}M",
                     f"--write_buffer_bytes={max(mb // 4, 8)}M"],
                    f"{work}/hybrid-0.log", "hymcache-storage")
    dram = Daemon([store, "--name=dram-0", *common,
                   f"--dram_bytes={node_bytes}"],
                  f"{work}/dram-0.log", "hymcache-storage")
    import hymcache
    with hymcache.Client([addr], transport="tcp") as c:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if sum(n["alive"] for n in c.stats()["nodes"]) == 2:
                    break
            except hymcache.Error:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError("storage nodes did not come up")
    return addr, [master, hybrid, dram]


# ---------------------------------------------------------------- report

def per_turn(results, turns):
    rows = []
    for t in range(turns):
        rs = [r for r in results if r["turn"] == t]
        ttfts = [r["ttft"] for r in rs if r["ttft"] is not None]
        rows.append(dict(
            turn=t + 1,
            prompt=statistics.mean(r["prompt_len"] for r in rs),
            mean=statistics.mean(ttfts) if ttfts else float("nan"),
            p50=statistics.median(ttfts) if ttfts else float("nan"),
            cached=statistics.mean(r["cached"] for r in rs)))
    return rows


def ceiling(results, block):
    """Per (conv, turn>=2): the previous turn's computed tokens (prompt and
    answer less its last token), in full blocks, capped at prompt - 1."""
    prev = {}
    out = {}
    for r in sorted(results, key=lambda r: (r["turn"], r["conv"])):
        if r["turn"] > 0:
            p = prev[r["conv"]]
            reuse = min(p["prompt_len"] + len(p["output"]) - 1,
                        r["prompt_len"] - 1)
            out[(r["conv"], r["turn"])] = reuse // block * block
        prev[r["conv"]] = r
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-config")
    ap.add_argument("--config", default="")
    ap.add_argument("--model")
    ap.add_argument("--workload")
    ap.add_argument("--params")
    ap.add_argument("--out")
    ap.add_argument("--master", default="")
    ap.add_argument("--salt", default="")
    ap.add_argument("--pool-blocks", type=int, default=0)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--offload-gib", type=float, default=0.25)
    ap.add_argument("--mem-util", type=float, default=0.15)
    ap.add_argument("--kill-pids", default="")
    ap.add_argument("--kill-turn", type=int, default=2)
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--work", default="")
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--configs", default="")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if a.run_config:
        a.config = a.run_config
        return run_config(a)

    p = dict(SHORT if a.short else LONG)
    form = "short" if a.short else "long"
    configs = (a.configs.split(",") if a.configs else
               (["none", "hymcache"] if a.short else
                ["none", "hymcache", "offload", "kill", "nomaster"]))
    work = a.work or tempfile.mkdtemp(prefix="vllm-e2e-")
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model")
    write_model(model, p)
    wl_path = os.path.join(work, "workload.json")
    json.dump(make_workload(p), open(wl_path, "w"))
    last_len = p["first"] + (p["turns"] - 1) * (p["user"] + p["out_tokens"])
    bs = p["block"]
    max_len = (last_len + p["out_tokens"] + bs) // bs * bs + bs
    all_tokens = total_tokens(p)
    # vLLM's pool: at most 25% of the conversations' KV, and at least one
    # request (the longest history).
    pool = max(all_tokens // 4 // p["block"], max_len // p["block"] + 1)
    assert pool * p["block"] <= all_tokens // 4 + p["block"] or a.short, pool
    kvb = kv_bytes_per_token(p)
    node_bytes = max(all_tokens * kvb * 2, 64 << 20)
    print(f"vllm_e2e: {form} form: model L={p['layers']} hidden={p['hidden']} "
          f"mlp={p['intermediate']} kv_heads={p['kv_heads']}; "
          f"{p['conversations']} conversations x {p['turns']} turns, last "
          f"history {last_len} tokens; conversations' KV {all_tokens} tokens "
          f"= {all_tokens * kvb / 2**20:.1f} MiB; vLLM pool {pool} blocks "
          f"({pool * p['block'] * 100 / all_tokens:.0f}%)", flush=True)

    # A SIGTERM (CI's timeout) still stops the daemons (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    addr, daemons = start_cluster(a.bin, work, node_bytes)
    results = {}
    failures = []
    unavailable = []
    try:
        for cfg in configs:
            out = os.path.join(work, f"{cfg}.json")
            argv = [sys.executable, os.path.abspath(__file__),
                    f"--run-config={cfg}", f"--model={model}",
                    f"--workload={wl_path}", f"--params={json.dumps(p)}",
                    f"--out={out}", f"--master={addr}",
                    f"--pool-blocks={pool}", f"--max-model-len={max_len}",
                    f"--offload-gib={node_bytes * 2 / 2**30:.4f}"]
            if cfg == "kill":
                pids = {"hybrid-0": daemons[1].proc.pid,
                        "dram-0": daemons[2].proc.pid}
                argv += ["--salt=kill-run", f"--kill-pids={json.dumps(pids)}",
                         f"--kill-turn={min(3, p['turns'] - 1)}"]
            t0 = time.monotonic()
            log = os.path.join(work, f"{cfg}.log")
            with open(log, "w") as lf:
                rc = subprocess.call(argv, stdout=lf, stderr=subprocess.STDOUT)
            took = time.monotonic() - t0
            if rc != 0 or not os.path.exists(out):
                text = open(log).read()
                if cfg in OPTIONAL:
                    why = [l for l in text.splitlines()
                           if "Error" in l or "Exception" in l]
                    print(f"vllm_e2e: configuration {cfg} does not run here "
                          f"(rc={rc}): {why[-1] if why else text[-300:]}",
                          flush=True)
                    unavailable.append(cfg)
                    continue
                print(f"vllm_e2e: configuration {cfg} failed (rc={rc}, "
                      f"{took:.0f} s); log tail:\n{text[-1500:]}", flush=True)
                failures.append(cfg)
                continue
            unreachable = 0
            for line in open(log):
                if line.startswith("vllm_e2e:"):
                    print(line.rstrip(), flush=True)
                unreachable += "HyMCache master unreachable" in line
            if cfg == "nomaster":
                print(f"vllm_e2e: master unreachable run: the connector "
                      f"logged it {unreachable} time(s) over "
                      f"{len(json.load(open(out)))} requests", flush=True)
                if unreachable != 1:
                    failures.append(cfg)
            results[cfg] = json.load(open(out))
            print(f"vllm_e2e: configuration {cfg} ran in {took:.0f} s",
                  flush=True)
    finally:
        for d in daemons:
            d.kill()

    # Tables.
    for cfg, res in results.items():
        print(f"\n[{cfg}] turn | mean prompt | TTFT mean ms | TTFT p50 ms | "
              f"cached tokens (mean)")
        for r in per_turn(res, p["turns"]):
            print(f"[{cfg}] {r['turn']:4d} | {r['prompt']:11.0f} | "
                  f"{r['mean'] * 1e3:12.1f} | {r['p50'] * 1e3:11.1f} | "
                  f"{r['cached']:.0f}")
    print()

    base = results.get("none")
    identical = bool(base) and not failures
    if base:
        ref = {(r["conv"], r["turn"]): r["output"] for r in base}
        for cfg, res in results.items():
            diff = [r for r in res if r["output"] != ref.get((r["conv"], r["turn"]))]
            if diff:
                identical = False
                print(f"vllm_e2e: {cfg}: {len(diff)} of {len(res)} outputs "
                      f"differ from recomputation's")
            else:
                print(f"vllm_e2e: {cfg}: all {len(res)} outputs identical to "
                      f"the no-connector run")
    hm = results.get("hymcache")
    measured = bool(base and hm)
    ratio_last = ratio_2p = hit = float("nan")
    if measured:
        bt = per_turn(base, p["turns"])
        ht = per_turn(hm, p["turns"])
        ratio_last = ht[-1]["mean"] / bt[-1]["mean"]
        m2 = lambda rows: statistics.mean(
            r["ttft"] for r in rows if r["turn"] >= 1)
        ratio_2p = m2(hm) / m2(base)
        ceil = ceiling(hm, p["block"])
        hit = (sum(r["cached"] for r in hm if r["turn"] >= 1) /
               max(1, sum(ceil.values())))
        cost = ht[0]["mean"] / bt[0]["mean"]
        print(f"vllm_e2e: turn 1 (no hits anywhere): hymcache/none TTFT = "
              f"{cost:.3f} (connector cost {100 * (cost - 1):+.1f}%)")
        if measured and ht[0]["cached"] > 0:
            print("vllm_e2e: note: turn 1 had hits (a warm cluster)")
    if "offload" in results and measured:
        om = statistics.mean(r["ttft"] for r in results["offload"] if r["turn"] >= 1)
        hm2 = statistics.mean(r["ttft"] for r in hm if r["turn"] >= 1)
        print(f"vllm_e2e: hymcache/offload mean TTFT turns>=2 = {hm2 / om:.2f}")
    if "kill" in results:
        kl = results["kill"]
        print(f"vllm_e2e: kill run: {len(kl)} requests, none failed; "
              f"cached tokens per turn "
              f"{[round(r['cached']) for r in per_turn(kl, p['turns'])]}")
    if measured:
        print(f"vllm_e2e: floors: last turn {ratio_last:.2f} <= 0.60 "
              f"{'ok' if ratio_last <= 0.6 else 'MISSED'}; turns>=2 "
              f"{ratio_2p:.2f} <= 0.70 {'ok' if ratio_2p <= 0.7 else 'MISSED'}; "
              f"hit ratio {hit:.2f} >= 0.95 {'ok' if hit >= 0.95 else 'MISSED'}; "
              f"no-hit turn cost {100 * (cost - 1):+.1f}% <= 5% "
              f"{'ok' if cost <= 1.05 else 'MISSED'}")
    print("vllm_e2e: vs_mooncake=none vs_lmcache=none: the peers' connectors "
          "(vLLM's MooncakeStoreConnector on mooncake-transfer-engine, "
          "LMCache's connector) are not installed in this venv and were not "
          "run")
    if failures:
        print(f"vllm_e2e: failed configurations: {','.join(failures)}")
    print(f"vllm_e2e: conversations={p['conversations']} turns={p['turns']} "
          f"identical_outputs={'yes' if identical else 'no'} "
          f"ttft_ratio_last_turn={ratio_last:.2f} "
          f"ttft_ratio_turns2plus={ratio_2p:.2f} hit_ratio={hit:.2f} "
          f"vs_mooncake=none vs_lmcache=none", flush=True)
    if not a.keep and not a.work:
        shutil.rmtree(work, ignore_errors=True)
    if not measured or not identical:
        return 1
    if (sum(r["cached"] for r in hm if r["turn"] >= 1) <=
            sum(r["cached"] for r in base if r["turn"] >= 1)):
        print("vllm_e2e: the connector added no hits to vLLM's own cache")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
