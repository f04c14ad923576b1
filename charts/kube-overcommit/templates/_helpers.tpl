{{/*
Object names are fixed: the binary's defaults (Service, Secrets, Leases, webhook configuration)
use them, and there is one kube-overcommit per cluster.
*/}}
{{- define "kube-overcommit.name" -}}kube-overcommit{{- end -}}

{{- define "kube-overcommit.selectorLabels" -}}
app.kubernetes.io/name: kube-overcommit
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "kube-overcommit.labels" -}}
app.kubernetes.io/name: kube-overcommit
app.kubernetes.io/part-of: kube-overcommit
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kube-overcommit.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
