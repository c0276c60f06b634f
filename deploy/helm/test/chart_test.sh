#!/bin/bash
# The Helm chart renders and would run, without helm or a cluster:
#  1. builds deploy/helm/render (Go's text/template + sprig v3, Helm's value
#     semantics) offline from Debian's Go packages, with its Go build cache
#     in TEST_TMPDIR (a cold build of sprig and its deps takes a few seconds);
#  2. proves the renderer has Helm's semantics on a fixture chart: numbers
#     in values files are float64 (17179869184 prints as 1.7179869184e+10),
#     include/tpl/required/toYaml/fail work, later -f files and --set win,
#     null deletes;
#  3. renders deploy/helm/hymcache for each scenario (default: three masters
#     elected through a chart-made etcd; a single master; an existing etcd
#     with NetworkPolicy; hybrid, RDMA, metrics + ServiceMonitor, no auth)
#     and checks each with chart_check.py:
#     values.schema.json, the Kubernetes API schemas (k8s_check.py), no
#     number in exponent form, every daemon flag defined by the binaries'
#     --helpfull with a value of its type, dnsPolicy with hostNetwork,
#     probes (startup too) and memory limits, non-root pods with the
#     RuntimeDefault seccomp profile, a PodDisruptionBudget per replicated
#     workload, and the scenario's own expectations; then that the checker
#     finds a rendering stripped of each of these (so a pass means they
#     are there);
#  4. checks that the schema refuses a number for a byte size and a fraction
#     for a port, and that the chart refuses (fail) a byte-size number and a
#     grace period shorter than a hybrid node's shutdown bound when the
#     schema is not applied;
#  5. runs the rendered master and storage pods as local processes
#     (run_rendered.py) and probes them as the kubelet would; the default
#     (three masters, chart-made etcd) as a three-host install whose
#     leader's host is then lost.
set -euo pipefail
src="$TEST_SRCDIR/hymcache"
helm="$src/deploy/helm"
tmp="$TEST_TMPDIR"
for tool in go python3 etcd; do
  command -v "$tool" >/dev/null || {
    echo "$tool missing: tools/setup.sh --test installs it" >&2
    exit 1
  }
done
[ -d /usr/share/gocode/src/github.com/Masterminds/sprig ] || {
  echo "golang-github-masterminds-sprig-dev missing (tools/setup.sh --test)" >&2
  exit 1
}

# 1. The renderer: GOPATH mode against Debian's /usr/share/gocode, offline.
mkdir -p "$tmp/render-src" "$tmp/gocache"
cp "$helm/render/render.go" "$tmp/render-src/"
(cd "$tmp/render-src" &&
  HOME="$tmp" GOPATH=/usr/share/gocode GO111MODULE=off GOFLAGS= \
  GOCACHE="$tmp/gocache" GOTOOLCHAIN=local GOPROXY=off \
  go build -o "$tmp/render" .)
render="$tmp/render"

# 2. Helm's semantics, on a fixture chart.
fx="$tmp/fixture"
mkdir -p "$fx/templates"
cat > "$fx/Chart.yaml" <<'EOF'
apiVersion: v2
name: fixture
version: 1.2.3
appVersion: "4.5"
kubeVersion: ">=1.24.0-0"
EOF
cat > "$fx/values.yaml" <<'EOF'
big: 17179869184
small: 50051
nested: {keep: a, drop: b, over: c}
greeting: "hello {{ .Release.Name }}"
EOF
cat > "$fx/templates/_h.tpl" <<'EOF'
{{- define "fx.name" -}}{{ .Chart.Name }}-{{ .Release.Name }}{{- end -}}
EOF
cat > "$fx/templates/cm.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "fx.name" . }}
data:
  big: "{{ .Values.big }}"
  bigint: "{{ .Values.big | int64 }}"
  small: "{{ .Values.small }}"
  tpl: {{ tpl .Values.greeting . | quote }}
  nested: {{ toYaml .Values.nested | quote }}
  missing: "{{ .Values.nothere }}"
  kube: "{{ .Capabilities.KubeVersion.Version }} {{ .Capabilities.APIVersions.Has "policy/v1" }}"
  chart: "{{ .Chart.Name }} {{ .Chart.Version }} {{ .Chart.AppVersion }} {{ .Release.Namespace }}"
  req: {{ required "need small" .Values.small | int | quote }}
---
# only a comment: dropped
EOF
cat > "$tmp/fx-over.yaml" <<'EOF'
nested: {drop: null, over: from-file}
small: 1
EOF
out=$("$render" --chart="$fx" --release=rel --namespace=ns \
  -f "$tmp/fx-over.yaml" --set small=8080)
want='---
# Source: fixture/templates/cm.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: fixture-rel
data:
  big: "1.7179869184e+10"
  bigint: "17179869184"
  small: "8080"
  tpl: "hello rel"
  nested: "keep: a\nover: from-file"
  missing: ""
  kube: "v1.27.0 true"
  chart: "fixture 1.2.3 4.5 ns"
  req: "8080"'
if [ "$out" != "$want" ]; then
  echo "renderer semantics differ from Helm's; got:" >&2
  echo "$out" >&2
  diff <(echo "$want") <(echo "$out") >&2 || true
  exit 1
fi
# required and kubeVersion fail the render, as in Helm.
if "$render" --chart="$fx" --set small=null >/dev/null 2>"$tmp/err"; then
  echo "required did not fail the render" >&2; exit 1
fi
grep -q "need small" "$tmp/err"
if "$render" --chart="$fx" --kube_version=1.23.0 >/dev/null 2>"$tmp/err"; then
  echo "kubeVersion >=1.24 accepted Kubernetes 1.23" >&2; exit 1
fi
grep -q "incompatible with Kubernetes" "$tmp/err"
echo "renderer: Helm's value semantics hold"

# 3. The chart, per scenario.
chart="$helm/hymcache"
"$src/master/hymcache-master" --helpfull >"$tmp/master.help" 2>&1 || true
"$src/storage_node/hymcache-storage" --helpfull >"$tmp/storage.help" 2>&1 || true
# The chart's etcd image is etcd 3.4, as Debian's etcd-server: its flags.
etcd --help >"$tmp/etcd.help" 2>&1 || true
check() {  # NAME [render args...] -- [chart_check args...]
  local name=$1; shift
  local rargs=()
  while [ "$1" != "--" ]; do rargs+=("$1"); shift; done
  shift
  "$render" --chart="$chart" --release=hym --namespace=kv \
    --values_out="$tmp/$name.values.json" "${rargs[@]}" >"$tmp/$name.yaml"
  python3 "$helm/test/chart_check.py" \
    --schema="$chart/values.schema.json" --values="$tmp/$name.values.json" \
    --help_file="hymcache-master=$tmp/master.help" \
    --help_file="hymcache-storage=$tmp/storage.help" \
    --help_file="etcd=$tmp/etcd.help" \
    "$@" "$tmp/$name.yaml"
}
v="$helm/test/values"
m3='hym-master-0\.hym-master\.kv\.svc:50051,hym-master-1\.hym-master\.kv\.svc:50051,hym-master-2\.hym-master\.kv\.svc:50051'
e3='hym-etcd-0\.hym-etcd\.kv\.svc:2379,hym-etcd-1\.hym-etcd\.kv\.svc:2379,hym-etcd-2\.hym-etcd\.kv\.svc:2379'
# Default: three masters elected through a three-member etcd the chart runs.
check default -- --require_pdb \
  --expect='^kind: StatefulSet$' --expect='^kind: DaemonSet$' \
  --expect='^kind: Secret$' --expect='^kind: PodDisruptionBudget$' \
  --expect='--dram_bytes=16G$' --expect='--device=dram$' \
  --expect='dnsPolicy: ClusterFirstWithHostNet' \
  --expect='^ +grpc:\n +port: 50062$' \
  --expect="--master=$m3\$" --expect="--etcd=$e3\$" \
  --expect='--advertise_address=\$\(POD_NAME\)\.hym-master\.kv\.svc:50051$' \
  --expect='--cluster=hym$' --expect='--lease_ttl_s=5$' --expect='--replication=confirm$' \
  --expect='--replication_token_file=/etc/hymcache/auth/admin\.token$' \
  --expect='- key: admin\.token\n +path: admin\.token' \
  --expect='kind: Service\nmetadata:\n +name: hym-master\n(.*\n){0,20} +clusterIP: None\n +publishNotReadyAddresses: true' \
  --expect='serviceName: hym-master\n +# .*\n +# .*\n +replicas: 3\n +podManagementPolicy: Parallel' \
  --expect='serviceName: hym-etcd\n +replicas: 3\n(.*\n)? +podManagementPolicy: Parallel' \
  --expect='--initial-cluster=hym-etcd-0=http://hym-etcd-0\.hym-etcd\.kv\.svc:2380,hym-etcd-1=http://hym-etcd-1\.hym-etcd\.kv\.svc:2380,hym-etcd-2=http://hym-etcd-2\.hym-etcd\.kv\.svc:2380$' \
  --expect='- "/usr/local/bin/etcd"$' --expect='image: "gcr\.io/etcd-development/etcd:v3\.4\.23"$' \
  --expect='kind: PodDisruptionBudget\nmetadata:\n +name: hym-master\n(.*\n){0,8}spec:\n +minAvailable: 2$' \
  --expect='kind: PodDisruptionBudget\nmetadata:\n +name: hym-etcd\n(.*\n){0,8}spec:\n +minAvailable: 2$' \
  --expect='podAntiAffinity:\n +requiredDuringSchedulingIgnoredDuringExecution:\n +- topologyKey: kubernetes\.io/hostname' \
  --expect='startupProbe:\n +tcpSocket:\n +port: grpc' \
  --expect='startupProbe:\n +tcpSocket:\n +port: control' \
  --expect='initContainers:\n +- name: volume-owner' --expect='- "10001:10001"$' \
  --expect_not='^kind: NetworkPolicy$' \
  --expect='--auth_tokens_file=' --expect='--rdma=off$' \
  --expect='- "/usr/bin/hymcache-master"$' --expect='- "/usr/bin/hymcache-storage"$' \
  --expect_not='--insecure' --expect_not='IPC_LOCK' \
  --expect_not='ServiceMonitor' --expect_not='--metrics_listen' \
  --expect='--node_key_file=/var/lib/hymcache/hym-storage\.node\.key$' \
  --expect='- name: node-key\n +mountPath: /var/lib/hymcache$' \
  --expect='hostPath:\n +path: "/var/lib/hymcache"\n +type: DirectoryOrCreate'
check dram_key_in_memory --set storage.dramKeyHostPath= -- \
  --expect='--dram_bytes=16G$' --expect_not='hostPath' \
  --expect_not='node_key_file' --expect_not='node-key' \
  --expect_not='volume-owner'
# The single master of earlier versions: no etcd, a ClusterIP Service,
# gRPC health probes, no PDB unless asked for.
check single -f "$v/single.yaml" -- \
  --expect='--master=hym-master\.kv\.svc:50051$' \
  --expect='^ +grpc:\n +port: 50051$' --expect='replicas: 1$' \
  --expect='startupProbe:\n +grpc:\n +port: 50051' \
  --expect_not='--etcd' --expect_not='hym-etcd' --expect_not='clusterIP: None' \
  --expect_not='--advertise_address' --expect_not='replication_token_file' \
  --expect_not='kind: PodDisruptionBudget\nmetadata:\n +name: hym-master$'
check single_pdb -f "$v/single.yaml" --set master.pdb.minAvailable=1 -- \
  --expect='kind: PodDisruptionBudget\nmetadata:\n +name: hym-master\n(.*\n){0,8}spec:\n +minAvailable: 1$'
# Three masters on an existing etcd, sync replication, NetworkPolicy.
check ha_netpol -f "$v/ha_netpol.yaml" -- --require_pdb \
  --expect="--master=$m3\$" \
  --expect='--etcd=etcd-a\.infra\.svc:2379,etcd-b\.infra\.svc:2379,etcd-c\.infra\.svc:2379$' \
  --expect='--cluster=prod$' --expect='--replication=sync$' \
  --expect_not='hym-etcd' --expect_not='/usr/local/bin/etcd' \
  --expect='^kind: NetworkPolicy$' \
  --expect='podSelector:\n +matchLabels:\n(.*\n){2} +app\.kubernetes\.io/component: master\n +policyTypes: \["Ingress"\]' \
  --expect='- port: grpc\n +protocol: TCP\n +from:\n +- namespaceSelector:\n +matchLabels:\n +hymcache-client: "true"' \
  --expect='- port: metrics\n +protocol: TCP\n +from:\n +- namespaceSelector:\n +matchLabels:\n +kubernetes\.io/metadata\.name: monitoring'
# The chart-made etcd behind a NetworkPolicy: masters and members only.
check etcd_netpol --set networkPolicy.enabled=true -- --require_pdb \
  --expect='kind: NetworkPolicy\nmetadata:\n +name: hym-etcd$' \
  --expect='- port: peer\n +protocol: TCP\n +from:\n +- podSelector:\n +matchLabels:\n(.*\n){2} +app\.kubernetes\.io/component: etcd$' \
  --expect='- port: grpc\n +protocol: TCP\n(?! +from:)'
check hybrid -f "$v/hybrid.yaml" -- \
  --expect='--device=hybrid$' --expect='--capacity_path=/var/lib/hymcache/capacity$' \
  --expect='--capacity_bytes=1T$' --expect='--staging_bytes=8G$' \
  --expect='--write_buffer_bytes=2G$' --expect='--io_engine=io_uring$' \
  --expect='--shutdown_flush_timeout_ms=15000$' \
  --expect='hostPath:\n +path: "/mnt/nvme0/hymcache"\n +type: DirectoryOrCreate' \
  --expect='mountPath: /var/lib/hymcache$' --expect='memory: 12Gi' \
  --expect_not='--dram_bytes' --expect_not='node_key_file' \
  --expect_not='node-key'
check rdma -f "$v/rdma.yaml" -- \
  --expect='--rdma=on$' --expect='--rdma_device=mlx5_0$' \
  --expect='add: \["IPC_LOCK"\]' --expect='rdma/hca_shared_devices_a: 1$' \
  --expect='volume-owner(.*\n)*? +add: \["CHOWN"\]' \
  --expect='feature\.node\.kubernetes\.io/rdma\.available: "true"'
check metrics -f "$v/metrics.yaml" -- \
  --expect='^kind: ServiceMonitor$' --expect='^apiVersion: monitoring\.coreos\.com/v1$' \
  --expect='--metrics_listen=0\.0\.0\.0:9451$' --expect='--metrics_listen=0\.0\.0\.0:9452$' \
  --expect='name: hym-storage-metrics$' --expect='publishNotReadyAddresses: true' \
  --expect='interval: 15s$' --expect='release: prometheus$' \
  --expect='minAvailable: 2$'
check insecure -f "$v/insecure.yaml" -- \
  --expect='--insecure$' --expect_not='^kind: Secret$' \
  --expect_not='auth_tokens_file' --expect_not='^kind: PodDisruptionBudget$' \
  --expect_not='replication_token_file' --expect='--replication=confirm$'
check ipc_lock --set storage.ipcLock=true -- --expect='add: \["IPC_LOCK"\]' \
  --expect='--rdma=off$'

# The checker finds each HA, security and probe object missing: a
# rendering with one of them cut out must fail chart_check.
finds() {  # NAME MESSAGE SED-SCRIPT [chart_check args...]
  local name=$1 msg=$2 script=$3; shift 3
  sed -E "$script" "$tmp/default.yaml" >"$tmp/cut-$name.yaml"
  if cmp -s "$tmp/default.yaml" "$tmp/cut-$name.yaml"; then
    echo "cut $name: the sed script changed nothing" >&2; exit 1
  fi
  if python3 "$helm/test/chart_check.py" \
      --schema="$chart/values.schema.json" --values="$tmp/default.values.json" \
      --help_file="hymcache-master=$tmp/master.help" \
      --help_file="hymcache-storage=$tmp/storage.help" \
      --help_file="etcd=$tmp/etcd.help" "$@" \
      "$tmp/cut-$name.yaml" >"$tmp/cut-$name.out" 2>&1; then
    echo "cut $name: chart_check passed a rendering without it" >&2; exit 1
  fi
  grep -qF -- "$msg" "$tmp/cut-$name.out" || {
    echo "cut $name: failed, but not with '$msg':" >&2; cat "$tmp/cut-$name.out" >&2; exit 1
  }
  echo "cut $name: found"
}
finds seccomp "without seccompProfile RuntimeDefault" '/seccompProfile:/,+1d'
finds non_root "without runAsNonRoot: true" '/runAsNonRoot: true/d'
finds root_user "runs as uid 0" 's/runAsUser: 10001/runAsUser: 0/'
finds root_init_caps "beyond CHOWN" 's/add: \["CHOWN"\]/add: ["CHOWN", "SYS_ADMIN"]/'
finds startup_probe "has no startupProbe" '/startupProbe:/,/failureThreshold/d'
finds pdb "no PodDisruptionBudget selects" 's/^kind: PodDisruptionBudget$/kind: ConfigMap/;s/^apiVersion: policy\/v1$/apiVersion: v1/' --require_pdb
finds etcd_flag "flag --initial-cluster-tokn is not defined" 's/--initial-cluster-token=/--initial-cluster-tokn=/'
# All of them at once, and overrides from --set.
check all -f "$v/hybrid.yaml" -f "$v/rdma.yaml" -f "$v/metrics.yaml" \
  --set master.port=6000 --set storage.controlPort=6001 -- \
  --expect='--listen=0\.0\.0\.0:6000$' --expect='--control_port=6001$' \
  --expect='--master=hym-master-0\.hym-master\.kv\.svc:6000,hym-master-1\.' \
  --expect='--advertise_address=\$\(POD_NAME\)\.hym-master\.kv\.svc:6000$' \
  --expect='^ +grpc:\n +port: 6001$' --expect='--device=hybrid$' \
  --expect='--rdma=on$' --expect='^kind: ServiceMonitor$'

# 4. What must be refused: by the schema (Helm's gojsonschema in the
# renderer, and python3-jsonschema on the same values), and by the templates
# when the schema is skipped (helm --skip-schema-validation).
schema_refuses() {  # NAME GO-MESSAGE PY-MESSAGE [render args...]
  local name=$1 gomsg=$2 pymsg=$3; shift 3
  if "$render" --chart="$chart" "$@" >/dev/null 2>"$tmp/$name.err"; then
    echo "$name: the renderer's schema validation accepted it" >&2; exit 1
  fi
  grep -qF -- "$gomsg" "$tmp/$name.err" || {
    echo "$name: refused, but not with '$gomsg':" >&2; cat "$tmp/$name.err" >&2; exit 1
  }
  "$render" --chart="$chart" --skip_schema_validation \
    --values_out="$tmp/$name.values.json" "$@" >/dev/null 2>&1 || true
  if python3 "$helm/test/chart_check.py" --values_only \
      --schema="$chart/values.schema.json" --values="$tmp/$name.values.json" \
      >"$tmp/$name.err" 2>&1; then
    echo "$name: python3-jsonschema accepted it" >&2; exit 1
  fi
  grep -qF -- "$pymsg" "$tmp/$name.err" || {
    echo "$name: refused, but not with '$pymsg':" >&2; cat "$tmp/$name.err" >&2; exit 1
  }
  echo "$name: refused by both schema validators"
}
template_refuses() {  # NAME MESSAGE [render args...]
  local name=$1 msg=$2; shift 2
  if "$render" --chart="$chart" "$@" >/dev/null 2>"$tmp/$name.err"; then
    echo "$name: rendered" >&2; exit 1
  fi
  grep -qF -- "$msg" "$tmp/$name.err" || {
    echo "$name: refused, but not with '$msg':" >&2; cat "$tmp/$name.err" >&2; exit 1
  }
  echo "$name: refused by the chart"
}
schema_refuses float_bytes \
  "storage.dramBytes: Invalid type. Expected: string, given: integer" \
  "storage/dramBytes: 17179869184 is not of type 'string'" \
  -f "$v/bad_float_bytes.yaml"
schema_refuses fraction \
  "master.port: Invalid type. Expected: integer, given: number" \
  "master/port: 50051.5 is not of type 'integer'" \
  -f "$v/bad_fraction.yaml"
schema_refuses bad_size "storage.hybrid.capacityBytes: Does not match pattern" \
  "storage/hybrid/capacityBytes: '1.5T' does not match" \
  --set storage.hybrid.capacityBytes=1.5T
schema_refuses relative_key_path "storage.dramKeyHostPath: Does not match pattern" \
  "storage/dramKeyHostPath: 'keys' does not match" \
  --set storage.dramKeyHostPath=keys
template_refuses float_bytes_template \
  'storage.dramBytes must be a quoted string such as "16G", not 1.7179869184e+10' \
  --skip_schema_validation -f "$v/bad_float_bytes.yaml"
template_refuses grace "must exceed the node's shutdown bound (28000 ms)" \
  -f "$v/bad_grace.yaml"
template_refuses no_etcd "master.replicas > 1 needs etcd" --set etcd.deploy=false
template_refuses pdb_all "master.pdb.minAvailable (3) must be below master.replicas (3)" \
  --set master.pdb.minAvailable=3
template_refuses etcd_even "an etcd cluster has 1, 3 or 5 members" \
  --skip_schema_validation --set etcd.replicas=2
schema_refuses root_uid "storage.podSecurityContext.runAsUser: Must be greater than or equal to 1" \
  "storage/podSecurityContext/runAsUser: 0 is less than the minimum of 1" \
  --set storage.podSecurityContext.runAsUser=0

# 5. Would it run? The rendered master and storage pods as local processes
# (run_rendered.py: their command and args with env and volumes applied,
# the chart's Secret as the identities, loopback instead of the pod
# network), with the probes made as the kubelet makes them, then SIGTERM
# within the grace period. Sizes small enough for a CI machine.
run() {  # NAME [render args...]
  local name=$1; shift
  mkdir -p "$tmp/run-$name"
  "$render" --chart="$chart" --release=hym --namespace=kv "$@" >"$tmp/run-$name.yaml"
  python3 "$helm/test/run_rendered.py" --manifests="$tmp/run-$name.yaml" \
    --bin="hymcache-master=$src/master/hymcache-master" \
    --bin="hymcache-storage=$src/storage_node/hymcache-storage" \
    --bin="etcd=$(command -v etcd)" \
    --probe="$src/deploy/helm/grpc_probe" --workdir="$tmp/run-$name" ||
    { echo "run $name failed; daemon logs:" >&2; tail -n 20 "$tmp/run-$name"/*.log >&2; exit 1; }
  echo "run $name: started, ready, stopped"
}
run dram_metrics -f "$v/metrics.yaml" -f "$v/single.yaml" --set storage.dramBytes=64M
# The DRAM node wrote the key the master issued into its hostPath volume.
key="$tmp/run-dram_metrics/hym-storage/node-key/hym-storage.node.key"
[ -s "$key" ] && [ "$(stat -c %a "$key")" = 600 ] ||
  { echo "run dram_metrics: no node key (mode 0600) at $key" >&2; exit 1; }
echo "run dram_metrics: node key kept in its hostPath volume"
run hybrid -f "$v/hybrid.yaml" -f "$v/single.yaml" --set storage.hybrid.capacityBytes=256M \
  --set storage.hybrid.stagingBytes=32M --set storage.hybrid.writeBufferBytes=16M \
  --set storage.hybrid.ioDirect=false
run insecure -f "$v/insecure.yaml" -f "$v/single.yaml" --set storage.dramBytes=64M
# The default install: three etcd members, three masters and a node as
# processes; the leader's "host" (its master and etcd member) is SIGKILLed
# and the cluster must serve again (run_rendered.py).
run ha -f "$v/metrics.yaml" --set storage.dramBytes=64M
echo "chart_test: all scenarios pass"
