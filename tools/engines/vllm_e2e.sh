#!/usr/bin/env bash
# vLLM end to end on HyMCache (tools/engines/vllm_e2e.py does the work):
# installs or reuses the engines' venv (tools/engines/venv.sh: vLLM's CPU
# build, torch, and the hymcache package), builds the daemons, writes a small
# Llama model (random weights from a fixed seed, no hub access), starts a
# master with one hybrid and one DRAM storage node, and replays a multi-turn
# chat through vLLM with the HyMCache connector, without any connector, and
# with vLLM's own CPU offloading, side by side; the long form also runs the
# peers' connectors (vLLM's MooncakeStoreConnector on a Mooncake master,
# LMCache's LMCacheConnectorV1; tools/engines/vllm_peers.sh installs them)
# and a pair of runs on prompts nothing has seen, with and without the
# connector (its cost on a turn with no hits). Its last line:
#   vllm_e2e: conversations=N turns=T identical_outputs=yes|no ...
#
#   tools/engines/vllm_e2e.sh           the long form: 8 conversations x 6
#                                       turns, histories past 2,000 tokens,
#                                       plus a run with a storage node killed
#   tools/engines/vllm_e2e.sh --short   CI's form: a tiny model, 2 x 3 turns,
#                                       vLLM with and without the connector
#                                       (and the no-hit pair), no peers
#   --configs=a,b,...  only these (none hymcache nohit versus scarce
#                      offload mooncake lmcache kill nomaster)
#   --scarce-share=F   scarce: HyMCache (a hybrid node, DRAM over SSD) and
#                      Mooncake at a memory budget of F of the
#                      conversations' KV (default 0.4); --scarce-dir=DIR
#                      puts its hybrid node's capacity file on DIR's device,
#                      --scarce-node-flags="..." adds node flags (pacing)
#   --transport=auto|tcp|shm  the connector's data plane (default auto:
#                      shared memory to the nodes on this host)
#   --work=DIR keeps the model, logs and per-request results in DIR.
# Exits non-zero when outputs differ from recomputation or nothing was
# measured.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=$(bash tools/engines/venv.sh | tail -n 1)
bazel build -c opt //master:hymcache-master //storage_node:hymcache-storage \
  2>&1 | tail -n 1 >&2
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
# No hub, no telemetry; the engine core in this process (one worker).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
PEERS=()
case " $* " in
  *" --short "*) ;;
  *) if DIR=$(bash tools/engines/vllm_peers.sh | tail -n 1); then
       PEERS=(--peers="$DIR")
     else
       echo "vllm_e2e: the peers' connectors could not be installed" \
         "(tools/engines/vllm_peers.sh); their configurations say so" >&2
     fi ;;
esac
exec "$PY" tools/engines/vllm_e2e.py --bin="$BIN" "${PEERS[@]}" "$@"
