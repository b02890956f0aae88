{{/* Helm's bookkeeping labels, on every object. */}}
{{- define "podres-proxy.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The labels of deploy/base's objects: kustomize's and Helm's. */}}
{{- define "podres-proxy.labels" -}}
app.kubernetes.io/part-of: podres-proxy
{{ include "podres-proxy.helmLabels" . }}
{{- end -}}

{{/* The runtime's CRI socket URL and state directory, by .Values.runtime. */}}
{{- define "podres-proxy.criSocket" -}}
{{- if eq .Values.runtime "containerd" -}}
unix:///run/containerd/containerd.sock
{{- else if eq .Values.runtime "cri-o" -}}
unix:///var/run/crio/crio.sock
{{- else -}}
{{- fail (printf "runtime must be containerd or cri-o, not %q" .Values.runtime) -}}
{{- end -}}
{{- end -}}
{{- define "podres-proxy.criDir" -}}
{{- if eq .Values.runtime "cri-o" -}}/var/run/crio{{- else -}}/run/containerd{{- end -}}
{{- end -}}
