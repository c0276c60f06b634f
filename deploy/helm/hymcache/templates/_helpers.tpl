{{/* Name prefix of every object: the release name. */}}
{{- define "hymcache.fullname" -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; "component" is master or storage. */}}
{{- define "hymcache.labels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/* Selector labels (immutable on a StatefulSet / DaemonSet). */}}
{{- define "hymcache.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "hymcache.image" -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
{{- end -}}

{{- define "hymcache.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "hymcache.fullname" .)) -}}
{{- end -}}

{{/*
A byte size for a --*_bytes flag: values.schema.json only admits strings
such as "16G" (a number would be a float64 in Helm and print as 1.6e+10);
this fails the render if one gets here anyway (an install without schema
validation, e.g. --skip-schema-validation).
*/}}
{{- define "hymcache.bytes" -}}
{{- if not (kindIs "string" .value) -}}
{{- fail (printf "%s must be a quoted string such as \"16G\", not %v" .name .value) -}}
{{- end -}}
{{- if not (regexMatch "^[0-9]+([KkMmGgTt]([Ii]?[Bb])?|[Bb])?$" .value) -}}
{{- fail (printf "%s: %q is not a byte size such as \"16G\"" .name .value) -}}
{{- end -}}
{{- .value -}}
{{- end -}}

{{/* A flag's boolean value: true/false, never "<nil>". */}}
{{- define "hymcache.bool" -}}
{{- if . }}true{{ else }}false{{ end -}}
{{- end -}}

{{/* True ("true") when the masters run with an election (master.replicas > 1). */}}
{{- define "hymcache.ha" -}}
{{- if gt (.Values.master.replicas | int) 1 }}true{{ end -}}
{{- end -}}

{{/*
The masters' addresses as storage nodes and clients are given them
(--master=A,B,C). With an election: each master pod's stable DNS name
under the headless Service, which is also the address it advertises as
leader (--advertise_address), so a NOT_LEADER hint names a listed master.
Without: the Service.
*/}}
{{- define "hymcache.masterAddresses" -}}
{{- $name := printf "%s-master" (include "hymcache.fullname" .) -}}
{{- $port := .Values.master.port | int -}}
{{- if include "hymcache.ha" . -}}
{{- $out := list -}}
{{- range $i := until (.Values.master.replicas | int) -}}
{{- $out = append $out (printf "%s-%d.%s.%s.svc:%d" $name $i $name $.Release.Namespace $port) -}}
{{- end -}}
{{- join "," $out -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" $name .Release.Namespace $port -}}
{{- end -}}
{{- end -}}

{{/* The etcd client endpoints the masters campaign on (--etcd). */}}
{{- define "hymcache.etcdEndpoints" -}}
{{- if .Values.etcd.deploy -}}
{{- $name := printf "%s-etcd" (include "hymcache.fullname" .) -}}
{{- $out := list -}}
{{- range $i := until (.Values.etcd.replicas | int) -}}
{{- $out = append $out (printf "%s-%d.%s.%s.svc:%d" $name $i $name $.Release.Namespace ($.Values.etcd.clientPort | int)) -}}
{{- end -}}
{{- join "," $out -}}
{{- else -}}
{{- if not .Values.etcd.endpoints -}}
{{- fail "master.replicas > 1 needs etcd: etcd.deploy: true, or etcd.endpoints listing an existing cluster's HOST:PORT client endpoints" -}}
{{- end -}}
{{- join "," .Values.etcd.endpoints -}}
{{- end -}}
{{- end -}}

{{/*
A pod's securityContext: the values' podSecurityContext over the chart's
floor (a non-root user, the runtime's default seccomp profile). The
values may add to it (runAsUser, fsGroup, ...) but runAsNonRoot and the
seccomp profile stay: a pod that needs root is not this chart's.
*/}}
{{- define "hymcache.podSecurityContext" -}}
{{- $sc := deepCopy (. | default dict) -}}
{{- $_ := set $sc "runAsNonRoot" true -}}
{{- $_ := set $sc "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml $sc -}}
{{- end -}}
