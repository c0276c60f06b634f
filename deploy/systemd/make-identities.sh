#!/bin/bash
# Makes the identities of a systemd-deployed cluster (docs/security.md):
# one token per role under /etc/hymcache (mode 0600, owned by hymcache) and
# the hashed identities file the daemons read. Copy identities and
# node.token to every storage host, admin.token to the operators, and
# engine.token to the inference servers. Run once, as root:
#
#   deploy/systemd/make-identities.sh [--nodes=NAME,...] [ENGINE_TENANT]
#
# --nodes makes one token per storage instance, bound to its node name
# (the unit's --name, HOST-INSTANCE, e.g. gpu1-dram0): node-NAME.token,
# which only that instance may present (copy it to the instance's host and
# point its flag file's --token_file at it). Without --nodes, one
# node.token shared by every instance, which may register under any name
# (the master warns about it at start).
#
# More identities: `hymctl token new ROLE TENANT NAME FILE >> identities`,
# then `systemctl reload hymcache-master 'hymcache-storage@*'`.
set -euo pipefail
dir=${HYMCACHE_ETC:-/etc/hymcache}
hymctl=${HYMCTL:-/usr/bin/hymctl}
nodes=""
if [[ "${1:-}" == --nodes=* ]]; then
  nodes=${1#--nodes=}
  shift
fi
tenant=${1:--}
install -d -m 0750 "$dir"
if [ -e "$dir/identities" ]; then
  echo "$dir/identities exists; add identities with hymctl token new" >&2
  exit 1
fi
umask 077
{
  echo "# role tenant name credential (docs/security.md)"
  "$hymctl" token new admin - admin "$dir/admin.token"
  if [ -n "$nodes" ]; then
    for n in ${nodes//,/ }; do
      "$hymctl" token new node - "$n" "$dir/node-$n.token" --nodes="$n"
    done
  else
    "$hymctl" token new node - storage-nodes "$dir/node.token"
  fi
  "$hymctl" token new engine "$tenant" engines "$dir/engine.token"
} > "$dir/identities"
if id hymcache >/dev/null 2>&1; then
  chown hymcache:hymcache "$dir" "$dir"/identities "$dir"/*.token
fi
echo "wrote $dir/identities and the tokens in $dir (admin, engine, node)"
