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

{{/*
The image by digest when image.digest is set (what the cluster runs is then fixed by content;
the tag is not used), else by tag.
*/}}
{{- define "kube-overcommit.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}
