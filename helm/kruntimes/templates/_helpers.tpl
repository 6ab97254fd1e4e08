{{/* The chart's name, cut to a label's 63 characters. */}}
{{- define "kruntimes.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: every object is named <fullname>-<component>; kept short enough
for the longest suffix ("-gateway-headless"). */}}
{{- define "kruntimes.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kruntimes.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The standard labels of every object; "component" names the part. */}}
{{- define "kruntimes.labels" -}}
helm.sh/chart: {{ include "kruntimes.chart" .root }}
{{ include "kruntimes.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kruntimes
{{- end }}

{{- define "kruntimes.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kruntimes.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kruntimes.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where host pods live unless a runtime names its own namespace. */}}
{{- define "kruntimes.hostsNamespace" -}}
{{- default .Release.Namespace .Values.hosts.namespace }}
{{- end }}

{{/* The control plane that owns the host pods (krt worker --control-plane-id). */}}
{{- define "kruntimes.controlPlaneId" -}}
{{- default (printf "%s/%s" .Release.Namespace (include "kruntimes.fullname" .)) .Values.worker.controlPlaneId }}
{{- end }}

{{/* The control plane as the label value the provider puts on its host pods: 16 hex of its
SHA-256 (kruntimes.activities.hosts.kubernetes_pods.control_plane_label). */}}
{{- define "kruntimes.controlPlaneLabel" -}}
{{- include "kruntimes.controlPlaneId" . | sha256sum | trunc 16 }}
{{- end }}

{{/* Every namespace host pods live in: the default one and each runtime's own. */}}
{{- define "kruntimes.hostNamespaces" -}}
{{- $default := include "kruntimes.hostsNamespace" . }}
{{- $namespaces := list $default }}
{{- range .Values.runtimes }}
{{- $ns := default $default ((.kubernetes | default dict).namespace) }}
{{- $namespaces = append $namespaces $ns }}
{{- end }}
{{- $namespaces | uniq | sortAlpha | join "," }}
{{- end }}

{{/* The ConfigMap of the hosts' role bindings (hosts.roleBindings), one in each hosts namespace. */}}
{{- define "kruntimes.hostRoleBindings" -}}
{{- printf "%s-host-role-bindings" (include "kruntimes.fullname" .) }}
{{- end }}

{{/* The platform identities' names (spiffe://kruntimes.io/<role>/<name>). */}}
{{- define "kruntimes.workerIdentity" -}}
{{- printf "%s-worker" (include "kruntimes.fullname" .) }}
{{- end }}
{{- define "kruntimes.gatewayIdentity" -}}
{{- printf "%s-gateway" (include "kruntimes.fullname" .) }}
{{- end }}

{{/* Whether the pre-install/pre-upgrade hook Job (`krt pki init-cluster`) makes the platform's
Secrets: without cert-manager and without existing Secrets (all three or none). */}}
{{- define "kruntimes.pkiJob" -}}
{{- if not .Values.pki.certManager.enabled }}
{{- $given := list .Values.pki.existingSecrets.ca .Values.pki.existingSecrets.worker .Values.pki.existingSecrets.gateway | compact | len }}
{{- if eq $given 0 }}true{{ else if ne $given 3 }}{{ fail "pki.existingSecrets: set ca, worker and gateway together, or none (the init Job makes them)" }}{{ end }}
{{- end }}
{{- end }}

{{/* Secret names of the platform's own credentials: cert-manager's and the init Job's are
<fullname>-<part>; otherwise the existing Secrets named in values. */}}
{{- define "kruntimes.caSecret" -}}
{{- if or .Values.pki.certManager.enabled (include "kruntimes.pkiJob" .) }}{{ include "kruntimes.fullname" . }}-platform-ca{{ else }}{{ .Values.pki.existingSecrets.ca }}{{ end }}
{{- end }}
{{- define "kruntimes.workerPeerSecret" -}}
{{- if or .Values.pki.certManager.enabled (include "kruntimes.pkiJob" .) }}{{ include "kruntimes.workerIdentity" . }}-peer{{ else }}{{ .Values.pki.existingSecrets.worker }}{{ end }}
{{- end }}
{{- define "kruntimes.gatewayPeerSecret" -}}
{{- if or .Values.pki.certManager.enabled (include "kruntimes.pkiJob" .) }}{{ include "kruntimes.gatewayIdentity" . }}-peer{{ else }}{{ .Values.pki.existingSecrets.gateway }}{{ end }}
{{- end }}
{{- define "kruntimes.assignmentSecret" -}}
{{- default (printf "%s-assignment-key" (include "kruntimes.fullname" .)) .Values.pki.assignmentKey.existingSecret }}
{{- end }}
{{- define "kruntimes.codecSecret" -}}
{{- default (printf "%s-codec-keys" (include "kruntimes.fullname" .)) .Values.codec.existingSecret }}
{{- end }}
{{- define "kruntimes.gatewayTlsSecret" -}}
{{- if and .Values.gateway.tls.certManager.enabled .Values.gateway.tls.secretName }}{{ fail "gateway.tls: set secretName or certManager.enabled, not both" }}{{ end }}
{{- if .Values.gateway.tls.certManager.enabled }}{{ include "kruntimes.fullname" . }}-gateway-tls{{ else }}{{ required "gateway.tls.secretName or gateway.tls.certManager.enabled is required" .Values.gateway.tls.secretName }}{{ end }}
{{- end }}

{{/* The gateway's in-cluster DNS names (its Service). */}}
{{- define "kruntimes.gatewayHost" -}}
{{- printf "%s-gateway.%s.svc" (include "kruntimes.fullname" .) .Release.Namespace }}
{{- end }}

{{/* The gateway's in-cluster URL (its Service and port): the base of every Run's endpoint. */}}
{{- define "kruntimes.gatewayUrl" -}}
https://{{ include "kruntimes.gatewayHost" . }}{{ if ne (int .Values.gateway.service.port) 443 }}:{{ .Values.gateway.service.port }}{{ end }}
{{- end }}

{{/* The Temporal connection flags (kruntimes.temporal.connect.add_arguments) and their mounts. */}}
{{- define "kruntimes.temporalArgs" -}}
- --temporal-address
- {{ required "temporal.address is required (host:port of the Temporal frontend)" .Values.temporal.address | quote }}
- --namespace
- {{ .Values.temporal.namespace | quote }}
{{- if .Values.temporal.tls.enabled }}
- --temporal-tls
{{- if .Values.temporal.tls.secretName }}
{{- if .Values.temporal.tls.caKey }}
- --temporal-tls-ca
- /etc/kruntimes/temporal-tls/{{ .Values.temporal.tls.caKey }}
{{- end }}
{{- if .Values.temporal.tls.mutual }}
- --temporal-tls-cert
- /etc/kruntimes/temporal-tls/tls.crt
- --temporal-tls-key
- /etc/kruntimes/temporal-tls/tls.key
{{- end }}
{{- end }}
{{- if .Values.temporal.tls.serverName }}
- --temporal-tls-server-name
- {{ .Values.temporal.tls.serverName | quote }}
{{- end }}
{{- end }}
{{- if .Values.temporal.apiKey.secretName }}
- --temporal-api-key-file
- /etc/kruntimes/temporal-api-key/{{ .Values.temporal.apiKey.key }}
{{- end }}
- --codec-keys
- /etc/kruntimes/codec-keys
{{- end }}

{{- define "kruntimes.temporalMounts" -}}
{{- if and .Values.temporal.tls.enabled .Values.temporal.tls.secretName }}
- {name: temporal-tls, mountPath: /etc/kruntimes/temporal-tls, readOnly: true}
{{- end }}
{{- if .Values.temporal.apiKey.secretName }}
- {name: temporal-api-key, mountPath: /etc/kruntimes/temporal-api-key, readOnly: true}
{{- end }}
- {name: codec-keys, mountPath: /etc/kruntimes/codec-keys, readOnly: true}
{{- end }}

{{- define "kruntimes.temporalVolumes" -}}
{{- if and .Values.temporal.tls.enabled .Values.temporal.tls.secretName }}
- name: temporal-tls
  secret: {secretName: {{ .Values.temporal.tls.secretName | quote }}, defaultMode: 0440}
{{- end }}
{{- if .Values.temporal.apiKey.secretName }}
- name: temporal-api-key
  secret:
    secretName: {{ .Values.temporal.apiKey.secretName | quote }}
    defaultMode: 0440
    items: [{key: {{ .Values.temporal.apiKey.key | quote }}, path: {{ .Values.temporal.apiKey.key | quote }}}]
{{- end }}
- name: codec-keys
  secret: {secretName: {{ include "kruntimes.codecSecret" . | quote }}, defaultMode: 0440}
{{- end }}

{{/* The Secrets `krt pki init-cluster` makes, and the Role rules of exactly its calls: get and
patch those by name, and create Secrets (a create names no object to the authorizer, so
resourceNames cannot narrow it). */}}
{{- define "kruntimes.pkiRules" -}}
{{- $secrets := list (include "kruntimes.caSecret" .) (include "kruntimes.workerPeerSecret" .) (include "kruntimes.gatewayPeerSecret" .) }}
{{- if not .Values.pki.assignmentKey.existingSecret }}
{{- $secrets = append $secrets (include "kruntimes.assignmentSecret" .) }}
{{- end }}
rules:
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: {{ toJson $secrets }}
    verbs: ["get", "patch"]
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create"]
{{- end }}

{{/* The pod template of `krt pki init-cluster` (the install hook Job's and the renewal
CronJob's); "account" names its ServiceAccount. */}}
{{- define "kruntimes.pkiPodTemplate" -}}
{{- $root := .root }}
metadata:
  labels:
    {{- include "kruntimes.labels" (dict "root" $root "component" "pki-init") | nindent 4 }}
spec:
  serviceAccountName: {{ .account }}
  # Besides the worker, the one pod with a token: it writes the platform's Secrets.
  automountServiceAccountToken: true
  restartPolicy: OnFailure
  enableServiceLinks: false
  {{- with $root.Values.image.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: pki-init
      image: {{ include "kruntimes.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: ["krt", "pki", "init-cluster"]
      args:
        - --namespace
        - {{ $root.Release.Namespace }}
        - --release
        - {{ $root.Release.Name }}
        - --ca-secret
        - {{ include "kruntimes.caSecret" $root }}
        - --worker
        - {{ include "kruntimes.workerIdentity" $root }}
        - --gateway
        - {{ include "kruntimes.gatewayIdentity" $root }}
        {{- if not $root.Values.pki.assignmentKey.existingSecret }}
        - --assignment-secret
        - {{ include "kruntimes.assignmentSecret" $root }}
        {{- end }}
        - --certificate-lifetime
        - {{ int $root.Values.pki.initJob.certificateLifetimeSeconds | quote }}
        - --host-certificate-lifetime
        - {{ $root.Values.pki.hostCertificateLifetimeSeconds | quote }}
      resources:
        {{- toYaml $root.Values.pki.initJob.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
  volumes:
    - name: tmp
      emptyDir: {sizeLimit: 16Mi}
{{- end }}

{{/* Link-local ranges (169.254.0.0/16: cloud metadata services; fe80::/10) are out of host pods'
reach unless networkPolicy.hostLinkLocal: an ipBlock wider than the range of its family that
covers it gets the range in its except; a narrower one, or the range itself, is taken as asked. */}}
{{- define "kruntimes.withoutLinkLocal" -}}
{{- $block := deepCopy . }}
{{- $parts := splitList "/" $block.cidr }}
{{- $address := index $parts 0 }}
{{- $prefix := int (index $parts 1) }}
{{- /* 2^(16 - prefix): the first 16 bits of two addresses agree on their first `prefix` bits
when their quotients by it do */}}
{{- $unit := list 65536 32768 16384 8192 4096 2048 1024 512 256 128 64 32 16 8 4 2 1 }}
{{- $range := "" }}
{{- if contains ":" $address }}
{{- if lt $prefix 10 }}
{{- $hex := dict "0" 0 "1" 1 "2" 2 "3" 3 "4" 4 "5" 5 "6" 6 "7" 7 "8" 8 "9" 9 "a" 10 "b" 11 "c" 12 "d" 13 "e" 14 "f" 15 }}
{{- $first := 0 }}
{{- range regexFindAll "." (index (splitList ":" (lower $address)) 0) -1 }}{{ $first = add (mul $first 16) (index $hex .) }}{{ end }}
{{- if eq (div $first (index $unit $prefix)) (div 65152 (index $unit $prefix)) }}{{ $range = "fe80::/10" }}{{ end }}
{{- end }}
{{- else if lt $prefix 16 }}
{{- $octets := splitList "." $address }}
{{- $first := add (mul (atoi (index $octets 0)) 256) (atoi (index $octets 1)) }}
{{- if eq (div $first (index $unit $prefix)) (div 43518 (index $unit $prefix)) }}{{ $range = "169.254.0.0/16" }}{{ end }}
{{- end }}
{{- $except := $block.except | default list }}
{{- if and $range (not (has $range $except)) }}{{ $_ := set $block "except" (append $except $range) }}{{ end }}
{{- toYaml $block }}
{{- end }}

{{/* Every destination but the link-local ranges: what an egress rule of the host pods without
`to` allows, and where they may ask DNS. */}}
{{- define "kruntimes.anywhereButLinkLocal" -}}
- namespaceSelector: {}
- ipBlock: {cidr: 0.0.0.0/0, except: [169.254.0.0/16]}
- ipBlock: {cidr: "::/0", except: ["fe80::/10"]}
{{- end }}

{{/* networkPolicy.hostEgress with the link-local ranges taken out of each rule's destinations
(unless networkPolicy.hostLinkLocal), as a YAML list. */}}
{{- define "kruntimes.hostEgress" -}}
{{- $rules := list }}
{{- range .Values.networkPolicy.hostEgress }}
{{- $rule := deepCopy . }}
{{- if not $.Values.networkPolicy.hostLinkLocal }}
{{- if $rule.to }}
{{- $to := list }}
{{- range $rule.to }}
{{- if .ipBlock }}
{{- $to = append $to (dict "ipBlock" (include "kruntimes.withoutLinkLocal" .ipBlock | fromYaml)) }}
{{- else }}
{{- $to = append $to . }}
{{- end }}
{{- end }}
{{- $_ := set $rule "to" $to }}
{{- else }}
{{- $_ := set $rule "to" (include "kruntimes.anywhereButLinkLocal" $ | fromYamlArray) }}
{{- end }}
{{- end }}
{{- $rules = append $rules $rule }}
{{- end }}
{{- toYaml $rules }}
{{- end }}
