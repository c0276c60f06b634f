#!/bin/bash
# Makes the identities of a systemd-deployed cluster (docs/security.md):
# one token per role under /etc/hymcache (mode 0600, owned by hymcache) and
# the hashed identities file the daemons read. Copy identities and
# node.token to every storage host, admin.token to the operators, and
# engine.token to the inference servers. Run once, as root:
#
#   deploy/systemd/make-identities.sh [ENGINE_TENANT]
#
# More identities: `hymctl token new ROLE TENANT NAME FILE >> identities`,
# then `systemctl reload hymcache-master 'hymcache-storage@*'`.
set -euo pipefail
dir=${HYMCACHE_ETC:-/etc/hymcache}
hymctl=${HYMCTL:-/usr/bin/hymctl}
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
  "$hymctl" token new node - storage-nodes "$dir/node.token"
  "$hymctl" token new engine "$tenant" engines "$dir/engine.token"
} > "$dir/identities"
if id hymcache >/dev/null 2>&1; then
  chown hymcache:hymcache "$dir" "$dir"/identities "$dir"/*.token
fi
echo "wrote $dir/identities and $dir/{admin,node,engine}.token"
