{{/* Labels Helm's conventions add to every object (the kustomize examples have none of them). */}}
{{- define "rsm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rbd-snapshot-metadata
app.kubernetes.io/version: {{ include "rsm.tag" . | trunc 63 | quote }}
{{- end }}

{{- define "rsm.tag" -}}
{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The pods' label, the Deployment's (immutable) selector and the Services'. */}}
{{- define "rsm.selector" -}}
app: rbd-snapshot-metadata
{{- end }}

{{- define "rsm.serviceName" -}}csi-rbdplugin-snapshot-metadata{{- end }}

{{/* Cluster-scoped names carry the namespace: one install, one set. */}}
{{- define "rsm.sidecarRole" -}}rbd-snapshot-metadata:{{ .Release.Namespace }}:sidecar{{- end }}
{{- define "rsm.clientRole" -}}rbd-snapshot-metadata:{{ .Release.Namespace }}:client{{- end }}

{{/* The names the sidecar's certificate holds; the first is the CR's address host. */}}
{{- define "rsm.dnsNames" -}}
{{- $h := printf "%s.%s" (include "rsm.serviceName" .) .Release.Namespace -}}
{{- list $h (printf "%s.svc" $h) (printf "%s.svc.cluster.local" $h) | toJson -}}
{{- end }}

{{- define "rsm.caSecretName" -}}csi-rbdplugin-snapshot-metadata-ca-keypair{{- end }}
