{{/*
The chart's name, and the prefix of every object's name: the release name when it holds
the chart's name (release "gatekeeper" gives deploy/kubernetes' names), else
RELEASE-gatekeeper.
*/}}
{{- define "gatekeeper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gatekeeper.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "gatekeeper.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gatekeeper.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object: the selector labels deploy/kubernetes uses (name, component) and
Helm's own (https://helm.sh/docs/chart_best_practices/labels/). Pod templates and
selectors carry only the selector labels, as the kustomize tree's do. Call with
(dict "ctx" $ "component" "webhook"); an empty component leaves it out.
*/}}
{{- define "gatekeeper.labels" -}}
{{ include "gatekeeper.selectorLabels" . }}
helm.sh/chart: {{ include "gatekeeper.chart" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{- define "gatekeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gatekeeper.name" .ctx }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "gatekeeper.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gatekeeper.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{- define "gatekeeper.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Cluster mode with gatekeeper's own node agent publishing the GPUs. */}}
{{- define "gatekeeper.agentEnabled" -}}
{{- if and .Values.cluster.enabled (eq .Values.cluster.claimsMode "gatekeeper") }}true{{ end }}
{{- end }}

{{- define "gatekeeper.agentNamespace" -}}
{{- default (printf "%s-agent" .Release.Namespace) .Values.agent.namespace.name }}
{{- end }}

{{- define "gatekeeper.webhookService" -}}
{{- printf "%s-webhook" (include "gatekeeper.fullname" .) }}
{{- end }}

{{- define "gatekeeper.tlsSecret" -}}
{{- default (printf "%s-webhook-tls" (include "gatekeeper.fullname" .)) .Values.webhook.tls.secretName }}
{{- end }}

{{- define "gatekeeper.clientCaSecret" -}}
{{- default (printf "%s-apiserver-client-ca" (include "gatekeeper.fullname" .)) .Values.webhook.clientAuth.caSecretName }}
{{- end }}

{{/* The DNS names of the webhook's Service, and the extra names asked for. */}}
{{- define "gatekeeper.webhookDnsNames" -}}
{{- $service := include "gatekeeper.webhookService" . }}
{{- $names := list (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace) }}
{{- toJson (concat $names .Values.webhook.tls.extraDnsNames) }}
{{- end }}

{{/*
The generated serving certificate (webhook.tls.mode generate), made once a render and
shared by the Secret and both webhook configurations: the Secret already in the cluster
when there is one (an upgrade keeps its CA), else a new CA and certificate. Returns JSON
{"crt", "key", "ca"}, each base64.
*/}}
{{- define "gatekeeper.generatedTls" -}}
{{- $cache := .Values.webhook.tls.generate }}
{{- if not (hasKey $cache "rendered") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "gatekeeper.tlsSecret" .) }}
{{- if and $secret (index ($secret.data | default dict) "ca.crt") }}
{{- $_ := set $cache "rendered" (dict "crt" (index $secret.data "tls.crt") "key" (index $secret.data "tls.key") "ca" (index $secret.data "ca.crt")) }}
{{- else }}
{{- $days := int .Values.webhook.tls.generate.days }}
{{- $ca := genCA (printf "%s webhook CA" (include "gatekeeper.fullname" .)) $days }}
{{- $names := include "gatekeeper.webhookDnsNames" . | fromJsonArray }}
{{- $cert := genSignedCert (first $names) nil $names $days $ca }}
{{- $_ := set $cache "rendered" (dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($ca.Cert | b64enc)) }}
{{- end }}
{{- end }}
{{- toJson $cache.rendered }}
{{- end }}

{{/* The configurations' caBundle line, or nothing where cert-manager injects it. */}}
{{- define "gatekeeper.caBundle" -}}
{{- if eq .Values.webhook.tls.mode "generate" }}
caBundle: {{ (include "gatekeeper.generatedTls" . | fromJson).ca }}
{{- else if eq .Values.webhook.tls.mode "secret" }}
caBundle: {{ .Values.webhook.tls.caBundle }}
{{- end }}
{{- end }}

{{/* The cert-manager annotation that fills caBundle in, in mode cert-manager. */}}
{{- define "gatekeeper.injectCa" -}}
{{- if eq .Values.webhook.tls.mode "cert-manager" }}
annotations:
  # cert-manager's CA injector fills in clientConfig.caBundle from this Certificate.
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "gatekeeper.webhookService" . }}
{{- end }}
{{- end }}

{{/* A webhook's clientConfig: the Service on PATH, or webhook.url. Call with (list $ PATH). */}}
{{- define "gatekeeper.clientConfig" -}}
{{- $ := index . 0 }}
{{- $path := index . 1 }}
clientConfig:
  {{- if $.Values.webhook.url }}
  url: {{ printf "%s%s" (trimSuffix "/" $.Values.webhook.url) $path | quote }}
  {{- else }}
  service:
    namespace: {{ $.Release.Namespace }}
    name: {{ include "gatekeeper.webhookService" $ }}
    path: {{ $path }}
    port: 443
  {{- end }}
  {{- include "gatekeeper.caBundle" $ | nindent 2 }}
{{- end }}

{{/*
The namespaces neither webhook judges: the configured ones, the release's and the agent's
(named whether or not the agent runs, as deploy/kubernetes does).
*/}}
{{- define "gatekeeper.excludedNamespaces" -}}
{{- toJson (concat .Values.webhook.excludedNamespaces (list .Release.Namespace (include "gatekeeper.agentNamespace" .))) }}
{{- end }}

{{/*
An object of deploy/kubernetes/components/cluster, linked into the chart as files/cluster
(`helm package` copies the files in), as JSON: what the chart and the kustomize tree both
install and only the kustomize tree writes (the ClusterRoles' rules, the mutating webhook's
match condition). Call with (list $ FILE KIND).
*/}}
{{- define "gatekeeper.kustomizeObject" -}}
{{- $root := index . 0 }}
{{- $kind := index . 2 }}
{{- $found := dict }}
{{- range splitList "\n---\n" ($root.Files.Get (printf "files/cluster/%s" (index . 1))) }}
{{- $doc := fromYaml . }}
{{- if eq (get $doc "kind") $kind }}
{{- $found = $doc }}
{{- end }}
{{- end }}
{{- if not $found }}
{{- fail (printf "files/cluster/%s holds no %s: the link to deploy/kubernetes/components/cluster is missing" (index . 1) $kind) }}
{{- end }}
{{- toJson $found }}
{{- end }}
