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

{{- define "stalwart.etcdServerSecret" -}}
{{ .Values.etcd.tls.serverSecret | default (printf "%s-etcd-server" (include "stalwart.fullname" .)) }}
{{- end -}}

{{- define "stalwart.etcdClientSecret" -}}
{{ .Values.etcd.tls.clientSecret | default (printf "%s-etcd-client" (include "stalwart.fullname" .)) }}
{{- end -}}

{{/* The settings that cannot be written in values.schema.json; each failure names the value. */}}
{{- define "stalwart.checkEtcdSecurity" -}}
{{- $tls := .Values.etcd.tls -}}
{{- if and .Values.etcd.auth.enabled (not $tls.enabled) -}}
{{- fail "etcd.auth.enabled needs etcd.tls.enabled: etcd's client-certificate auth is part of TLS" -}}
{{- end -}}
{{- if and $tls.enabled (eq .Values.etcd.mode "external") (not $tls.clientSecret) -}}
{{- fail "etcd.tls.clientSecret: name the Secret (ca.crt, and tls.crt and tls.key if your etcd checks client certificates) for the external etcd, or set etcd.tls.enabled=false" -}}
{{- end -}}
{{- if and $tls.enabled (eq .Values.etcd.mode "bundled") (ne (empty $tls.serverSecret) (empty $tls.clientSecret)) -}}
{{- fail "etcd.tls.serverSecret and etcd.tls.clientSecret: give both (signed by one CA) or neither (the chart generates them)" -}}
{{- end -}}
{{- end -}}

{{/* A Stalwart process's etcd client settings: env (STALWART_ETCD_*, read by the store client). */}}
{{- define "stalwart.etcdClientEnv" -}}
{{- if .Values.etcd.tls.enabled }}
- name: STALWART_ETCD_CA
  value: /etc/stalwart/etcd-tls/ca.crt
{{- if or .Values.etcd.auth.enabled (eq .Values.etcd.mode "external") }}
- name: STALWART_ETCD_CERT
  value: /etc/stalwart/etcd-tls/tls.crt
- name: STALWART_ETCD_KEY
  value: /etc/stalwart/etcd-tls/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{- define "stalwart.etcdClientMount" -}}
{{- if .Values.etcd.tls.enabled }}
- name: etcd-tls
  mountPath: /etc/stalwart/etcd-tls
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "stalwart.etcdClientVolume" -}}
{{- if .Values.etcd.tls.enabled }}
- name: etcd-tls
  secret:
    secretName: {{ include "stalwart.etcdClientSecret" . }}
    defaultMode: 0440
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{/* The namespaces whose pods are TrainingJob pods: the listed ones, or (cluster-wide) all. */}}
{{- define "stalwart.jobPodsPeer" -}}
- podSelector:
    matchLabels:
      app.kubernetes.io/managed-by: stalwart-operator
  namespaceSelector:
    {{- if .Values.operator.namespaces }}
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: {{ toJson .Values.operator.namespaces }}
    {{- else }} {}
    {{- end }}
{{- end -}}

{{- define "stalwart.componentPeer" -}}
- podSelector:
    matchLabels:
      {{- include "stalwart.selector" (dict "root" .root "component" .component) | nindent 6 }}
{{- end -}}

{{- define "stalwart.prometheusPeer" -}}
- namespaceSelector: {{- toYaml .Values.networkPolicy.prometheus.namespaceSelector | nindent 4 }}
  podSelector: {{- toYaml .Values.networkPolicy.prometheus.podSelector | nindent 4 }}
{{- end -}}

{{/* The operator's rights on objects that live in a job's namespace. */}}
{{- define "stalwart.namespacedRules" -}}
- apiGroups: [stalwart.dev]
  resources: [trainingjobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [stalwart.dev]
  resources: [trainingjobs/status]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, delete]
- apiGroups: [""]  # each job's token Secret: written and deleted, never read (no get, list or watch)
  resources: [secrets]
  verbs: [create, patch, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, create, delete]
{{- end -}}

{{/* Cluster-scoped: Nodes (cordoning a faulty machine), the CRD and namespaces (kopf's startup). */}}
{{- define "stalwart.clusterRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- end -}}

{{- /* The diagnosis service's bearer token: a Secret the chart makes, or diagnosis.tokenSecret. */ -}}
{{- define "stalwart.diagnosisTokenSecret" -}}
{{- .Values.diagnosis.tokenSecret | default (printf "%s-diagnosis-token" (include "stalwart.fullname" .)) -}}
{{- end -}}

{{- define "stalwart.diagnosisTokenEnv" -}}
- name: STALWART_DIAGNOSIS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "stalwart.diagnosisTokenSecret" . }}
      key: token
{{- end -}}
