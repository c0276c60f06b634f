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
