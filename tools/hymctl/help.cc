// hymctl help: the commands and what they do (HelpText, hymctl.h).
#include <string>

#include "tools/hymctl/hymctl.h"

namespace hymcache::hymctl {

std::string HelpText() {
  return R"(usage: hymctl [flags] COMMAND [operands]   (hymctl --help: the flags too)

Cluster:
  status [-o wide]    nodes: state, device, used, size, objects, last seen
                      (fits 80 columns; -o wide: addresses, exact sizes)
  stats               each node's data-plane and device counters
  top [--interval=S] [--iterations=N]
                      per-node reads, writes, DRAM hit ratio, staging and
                      flush rates, refreshed every S seconds (default 2)
  version             hymctl's version
On call (admin):
  drain NODE [--copy=all|hot [--hot_within=S]] [--wait] [--timeout=S]
                      no new puts on NODE (reads continue; kept across
                      restarts); --copy: move its objects, or the ones read
                      within S seconds (default 600) and the blocks before
                      them, to other nodes first (within --timeout);
                      --wait: until it holds no objects
  undrain NODE        placements on NODE resume
  rebalance [--copy=all|hot [--hot_within=S]]
                      move chains, hottest first, off each node holding
                      more than 10% over the mean onto the emptiest ones
                      (a node that joined); hot: only those read within S
                      seconds
  forget NODE         remove a dead node's record and its objects
                      (also: node forget NODE)
  inspect KEY         where KEY is, its node's state, last read, lease,
                      chain links, tenant
  events [--count=N] [--stream=ID --after=SEQ]
                      follow the KV events (blocks stored and removed,
                      nodes up and down) from the oldest held, or after
                      SEQ of stream ID; --count: stop after N
  fsck [--repair] [--settle=S]
                      compare the master's listings with every node's
                      extents (exit 1 if inconsistent)
Objects:
  put KEY FILE        store FILE under KEY
  get KEY FILE        write KEY's bytes to FILE
  lookup KEY...       locations and the hit prefix
  rm KEY...           remove keys
Tenants and tokens:
  tenant list         every tenant's objects, bytes and quota
  tenant usage TENANT
  tenant set-quota TENANT MAX_OBJECTS MAX_BYTES
                      0 = unlimited; refused PutStarts beyond it
  tenant set-replicas TENANT N
                      2: every block the tenant's clients store also
                      gets a copy on another node; 1: none
  token new ROLE TENANT NAME TOKEN_FILE [--nodes=A,B]
                      write a fresh token to TOKEN_FILE (a new file, mode
                      0600) and print its identities line (ROLE: engine,
                      admin or node; TENANT: - for the default;
                      --nodes: the node names a node token may
                      register as)
  help                this text

NODE is a node's name or id. KEY is text, or hex with --hex. The master is
the leader of --cluster (default "default") that etcd names with
--etcd=E1:2379[,...], else --master (several: A,B,C, the one that leads),
else $HYMCACHE_MASTER, else 127.0.0.1:50051. --json prints JSON;
each key in it comes with "<field>_encoding": "text" or "hex".
Exit status: 0 done, 1 failed (or: drain --wait not empty, inspect not
found, fsck inconsistent), 2 bad usage.
)";
}

}  // namespace hymcache::hymctl
