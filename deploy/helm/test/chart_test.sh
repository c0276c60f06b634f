#!/bin/bash
# The Helm chart renders and would run, without helm or a cluster:
#  1. builds deploy/helm/render (Go's text/template + sprig v3, Helm's value
#     semantics) offline from Debian's Go packages, with its Go build cache
#     in TEST_TMPDIR (a cold build of sprig and its deps takes a few seconds);
#  2. proves the renderer has Helm's semantics on a fixture chart: numbers
#     in values files are float64 (17179869184 prints as 1.7179869184e+10),
#     include/tpl/required/toYaml/fail work, later -f files and --set win,
#     null deletes;
#  3. renders deploy/helm/hymcache for each scenario (default, hybrid, RDMA,
#     metrics + ServiceMonitor, no auth) and checks each with chart_check.py:
#     values.schema.json, the Kubernetes API schemas (k8s_check.py), no
#     number in exponent form, every daemon flag defined by the binaries'
#     --helpfull with a value of its type, dnsPolicy with hostNetwork,
#     probes and memory limits, and the scenario's own expectations;
#  4. checks that the schema refuses a number for a byte size and a fraction
#     for a port, and that the chart refuses (fail) a byte-size number and a
#     grace period shorter than a hybrid node's shutdown bound when the
#     schema is not applied;
#  5. runs the rendered master and storage pods as local processes
#     (run_rendered.py) and probes them as the kubelet would.
set -euo pipefail
src="$TEST_SRCDIR/hymcache"
helm="$src/deploy/helm"
tmp="$TEST_TMPDIR"
for tool in go python3; do
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
    "$@" "$tmp/$name.yaml"
}
v="$helm/test/values"
check default -- \
  --expect='^kind: StatefulSet$' --expect='^kind: DaemonSet$' \
  --expect='^kind: Secret$' --expect='^kind: PodDisruptionBudget$' \
  --expect='--dram_bytes=16G$' --expect='--device=dram$' \
  --expect='dnsPolicy: ClusterFirstWithHostNet' \
  --expect='^ +grpc:\n +port: 50051$' --expect='^ +grpc:\n +port: 50062$' \
  --expect='--master=hym-master\.kv\.svc:50051$' \
  --expect='--auth_tokens_file=' --expect='--rdma=off$' \
  --expect='- "/usr/bin/hymcache-master"$' --expect='- "/usr/bin/hymcache-storage"$' \
  --expect_not='--insecure' --expect_not='IPC_LOCK' \
  --expect_not='ServiceMonitor' --expect_not='--metrics_listen' \
  --expect='--node_key_file=/var/lib/hymcache/hym-storage\.node\.key$' \
  --expect='- name: node-key\n +mountPath: /var/lib/hymcache$' \
  --expect='hostPath:\n +path: "/var/lib/hymcache"\n +type: DirectoryOrCreate'
check dram_key_in_memory --set storage.dramKeyHostPath= -- \
  --expect='--dram_bytes=16G$' --expect_not='hostPath' \
  --expect_not='node_key_file' --expect_not='node-key'
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
  --expect='feature\.node\.kubernetes\.io/rdma\.available: "true"'
check metrics -f "$v/metrics.yaml" -- \
  --expect='^kind: ServiceMonitor$' --expect='^apiVersion: monitoring\.coreos\.com/v1$' \
  --expect='--metrics_listen=0\.0\.0\.0:9451$' --expect='--metrics_listen=0\.0\.0\.0:9452$' \
  --expect='name: hym-storage-metrics$' --expect='publishNotReadyAddresses: true' \
  --expect='interval: 15s$' --expect='release: prometheus$' \
  --expect='minAvailable: 1$'
check insecure -f "$v/insecure.yaml" -- \
  --expect='--insecure$' --expect_not='^kind: Secret$' \
  --expect_not='auth_tokens_file' --expect_not='^kind: PodDisruptionBudget$'
# All of them at once, and overrides from --set.
check all -f "$v/hybrid.yaml" -f "$v/rdma.yaml" -f "$v/metrics.yaml" \
  --set master.port=6000 --set storage.controlPort=6001 -- \
  --expect='--listen=0\.0\.0\.0:6000$' --expect='--control_port=6001$' \
  --expect='--master=hym-master\.kv\.svc:6000$' \
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
    --probe="$src/deploy/helm/grpc_probe" --workdir="$tmp/run-$name" ||
    { echo "run $name failed; daemon logs:" >&2; tail -n 20 "$tmp/run-$name"/*.log >&2; exit 1; }
  echo "run $name: started, ready, stopped"
}
run dram_metrics -f "$v/metrics.yaml" --set storage.dramBytes=64M
# The DRAM node wrote the key the master issued into its hostPath volume.
key="$tmp/run-dram_metrics/hym-storage/node-key/hym-storage.node.key"
[ -s "$key" ] && [ "$(stat -c %a "$key")" = 600 ] ||
  { echo "run dram_metrics: no node key (mode 0600) at $key" >&2; exit 1; }
echo "run dram_metrics: node key kept in its hostPath volume"
run hybrid -f "$v/hybrid.yaml" --set storage.hybrid.capacityBytes=256M \
  --set storage.hybrid.stagingBytes=32M --set storage.hybrid.writeBufferBytes=16M \
  --set storage.hybrid.ioDirect=false
run insecure -f "$v/insecure.yaml" --set storage.dramBytes=64M
echo "chart_test: all scenarios pass"
