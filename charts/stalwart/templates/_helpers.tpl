{{- define "stalwart.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "stalwart.labels" -}}
app.kubernetes.io/name: stalwart
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "stalwart.selector" -}}
app.kubernetes.io/name: stalwart
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "stalwart.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "stalwart.serviceAccount" -}}
{{ .Values.serviceAccount.name | default (printf "%s-operator" (include "stalwart.fullname" .)) }}
{{- end -}}

{{- define "stalwart.etcdEndpoint" -}}
{{- if eq .Values.etcd.mode "external" -}}{{ .Values.etcd.external.endpoint }}{{- else -}}{{ include "stalwart.fullname" . }}-etcd.{{ .Release.Namespace }}.svc:2379{{- end -}}
{{- end -}}

{{- define "stalwart.diagnosisUrl" -}}
http://{{ include "stalwart.fullname" . }}-diagnosis.{{ .Release.Namespace }}.svc:{{ .Values.diagnosis.port }}
{{- end -}}
