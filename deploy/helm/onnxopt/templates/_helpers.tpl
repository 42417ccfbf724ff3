{{/*
Helpers of the onnxopt chart. tests/helm_chart_test.py checks the chart with helm itself (helm lint --strict,
helm template); values.schema.json checks the values' types before any of this runs.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "onnxopt.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<name>, or the release name when it contains the name already, or fullnameOverride. */}}
{{- define "onnxopt.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "onnxopt.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "onnxopt.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The fullname cut so that "<prefix>-<suffix>" stays within 63 characters for suffixes up to 10
characters (api, cpu-worker, gpu-worker, data, job-store). */}}
{{- define "onnxopt.prefix" -}}
{{- include "onnxopt.fullname" . | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "onnxopt.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; the components add app.kubernetes.io/component. */}}
{{- define "onnxopt.labels" -}}
helm.sh/chart: {{ include "onnxopt.chart" . }}
{{ include "onnxopt.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels that select the release's pods; each Deployment, PodDisruptionBudget and the Service add
app.kubernetes.io/component (api, cpu-worker, gpu-worker), so none selects another pool's pods. */}}
{{- define "onnxopt.selectorLabels" -}}
app.kubernetes.io/name: {{ include "onnxopt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "onnxopt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "onnxopt.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "onnxopt.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The GPU pool's image: the CUDA variant (Dockerfile target "cuda"), tagged "<tag>-cuda" by default. */}}
{{- define "onnxopt.gpuImage" -}}
{{- $tag := .Values.gpuWorkers.image.tag | default (printf "%s-cuda" (.Values.image.tag | default .Chart.AppVersion)) -}}
{{- printf "%s:%s" (.Values.gpuWorkers.image.repository | default .Values.image.repository) $tag -}}
{{- end -}}

{{- define "onnxopt.dataClaimName" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-data" (include "onnxopt.prefix" .)) -}}
{{- end -}}

{{/*
The job store: a PostgreSQL URI in a Secret, the chart's own (from jobStore.uri) or jobStore.existingSecret.
Fails the render when neither or both are set: the embedded SQLite store cannot be shared by replicas.
*/}}
{{- define "onnxopt.validateJobStore" -}}
{{- if and .Values.jobStore.uri .Values.jobStore.existingSecret -}}
{{- fail "onnxopt: set jobStore.uri or jobStore.existingSecret, not both" -}}
{{- end -}}
{{- if not (or .Values.jobStore.uri .Values.jobStore.existingSecret) -}}
{{- fail "onnxopt: no job store configured: set jobStore.uri (postgresql://...) or jobStore.existingSecret. The chart runs several replicas and the embedded SQLite job store serves one machine only, so a PostgreSQL job store is required." -}}
{{- end -}}
{{- if and .Values.jobStore.uri (not (or (hasPrefix "postgresql://" .Values.jobStore.uri) (hasPrefix "postgres://" .Values.jobStore.uri))) -}}
{{- fail "onnxopt: jobStore.uri must be a libpq connection URI starting with postgresql:// (or postgres://)" -}}
{{- end -}}
{{- end -}}

{{- define "onnxopt.jobStoreSecretName" -}}
{{- if .Values.jobStore.existingSecret -}}
{{- .Values.jobStore.existingSecret -}}
{{- else -}}
{{- printf "%s-job-store" (include "onnxopt.prefix" .) -}}
{{- end -}}
{{- end -}}

{{- define "onnxopt.jobStoreSecretKey" -}}
{{- if .Values.jobStore.existingSecret -}}
{{- required "onnxopt: jobStore.existingSecretKey is required with jobStore.existingSecret" .Values.jobStore.existingSecretKey -}}
{{- else -}}
uri
{{- end -}}
{{- end -}}

{{/* Pod annotations: Prometheus scraping (every pod serves /metrics on 9464) and podAnnotations. */}}
{{- define "onnxopt.podAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: "9464"
prometheus.io/path: /metrics
{{- if .Values.podAnnotations }}
{{ toYaml .Values.podAnnotations }}
{{- end -}}
{{- end -}}

{{/* The pod's security context: the image's non-root user (uid/gid 10001). */}}
{{- define "onnxopt.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "onnxopt.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Flags every replica gets, after --role (a list's items). Numbers go through int64: values-file numbers
are float64 and would print as 8.589934592e+09. */}}
{{- define "onnxopt.commonArgs" -}}
- --listen=0.0.0.0:50051
- --metrics-listen=0.0.0.0:9464
- --data-dir=/var/lib/onnxopt
- --job-store=$(ONNXOPT_JOB_STORE)
- --lease-seconds={{ .Values.server.leaseSeconds | int64 }}
- --max-attempts={{ .Values.server.maxAttempts | int64 }}
- --job-store-connections={{ .Values.server.jobStoreConnections | int64 }}
- --job-store-connection-max-age-seconds={{ .Values.server.jobStoreConnectionMaxAgeSeconds | int64 }}
- --drain-grace-seconds={{ .Values.server.drainGraceSeconds | int64 }}
- --job-timeout-seconds={{ .Values.server.jobTimeoutSeconds | int64 }}
- --queue-capacity={{ .Values.server.queueCapacity | int64 }}
- --max-upload-bytes={{ .Values.server.maxUploadBytes | int64 }}
{{- if .Values.tls.enabled }}
- --tls-cert=/etc/onnxopt/tls/tls.crt
- --tls-key=/etc/onnxopt/tls/tls.key
{{- if .Values.tls.clientCaSecret }}
- --tls-client-ca=/etc/onnxopt/client-ca/{{ .Values.tls.clientCaKey }}
{{- end }}
{{- end }}
{{- if .Values.server.extraArgs }}
{{ toYaml .Values.server.extraArgs }}
{{- end -}}
{{- end -}}

{{/* The environment of every replica: the job store URI (and PGPASSWORD) from Secrets, extraEnv. */}}
{{- define "onnxopt.env" -}}
{{- include "onnxopt.validateJobStore" . -}}
- name: ONNXOPT_JOB_STORE
  valueFrom:
    secretKeyRef:
      name: {{ include "onnxopt.jobStoreSecretName" . }}
      key: {{ include "onnxopt.jobStoreSecretKey" . }}
{{- if .Values.jobStore.passwordSecret }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.jobStore.passwordSecret }}
      key: {{ .Values.jobStore.passwordSecretKey }}
{{- end }}
{{- if .Values.extraEnv }}
{{ toYaml .Values.extraEnv }}
{{- end -}}
{{- end -}}

{{- define "onnxopt.ports" -}}
- {name: grpc, containerPort: 50051, protocol: TCP}
- {name: metrics, containerPort: 9464, protocol: TCP}
{{- end -}}

{{/* The name the probes check the server certificate for: the API Service's in-cluster name by default. */}}
{{- define "onnxopt.tlsServerName" -}}
{{- .Values.tls.serverName | default (printf "%s.%s.svc" (include "onnxopt.fullname" .) .Release.Namespace) -}}
{{- end -}}

{{/*
A probe's action on the gRPC health service: with (dict "ctx" . "service" NAME), NAME "" for the server's
overall health (liveness, workers), onnxopt.v1.Optimizer for the API's readiness (NOT_SERVING while draining).
Plaintext: the kubelet's own gRPC probe. TLS: the kubelet's gRPC probes speak plaintext only, and a tcpSocket
probe would keep a draining pod ready, so an exec probe runs the CLI's health check over TLS in the pod;
it connects to localhost, so the certificate's name is given (--tls-server-name), and with mutual TLS the
probe presents tls.probeClientSecret's certificate.
*/}}
{{- define "onnxopt.healthProbe" -}}
{{- $v := .ctx.Values -}}
{{- if $v.tls.enabled -}}
exec:
  command:
    - /opt/onnxopt/bin/onnxopt
    - health
    - --server
    - localhost:50051
    {{- with .service }}
    - --service
    - {{ . }}
    {{- end }}
    - --tls-ca
    - {{ if $v.tls.caSecret }}/etc/onnxopt/tls-ca{{ else }}/etc/onnxopt/tls{{ end }}/{{ $v.tls.caKey }}
    {{- if $v.tls.clientCaSecret }}
    - --tls-cert
    - /etc/onnxopt/probe-client/tls.crt
    - --tls-key
    - /etc/onnxopt/probe-client/tls.key
    {{- end }}
    - --tls-server-name
    - {{ include "onnxopt.tlsServerName" .ctx }}
timeoutSeconds: 10   # above the CLI's own 5 s deadline, so its message shows in the pod's events
{{- else -}}
grpc:
  port: 50051
  {{- with .service }}
  service: {{ . }}
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "onnxopt.volumeMounts" -}}
- {name: data, mountPath: /var/lib/onnxopt}
- {name: tmp, mountPath: /tmp}
{{- if .Values.tls.enabled }}
- {name: tls, mountPath: /etc/onnxopt/tls, readOnly: true}
{{- if .Values.tls.caSecret }}
- {name: tls-ca, mountPath: /etc/onnxopt/tls-ca, readOnly: true}
{{- end }}
{{- if .Values.tls.clientCaSecret }}
- {name: client-ca, mountPath: /etc/onnxopt/client-ca, readOnly: true}
- {name: probe-client, mountPath: /etc/onnxopt/probe-client, readOnly: true}
{{- end }}
{{- end }}
{{- if .Values.extraVolumeMounts }}
{{ toYaml .Values.extraVolumeMounts }}
{{- end -}}
{{- end -}}

{{- define "onnxopt.volumes" -}}
- name: data
  persistentVolumeClaim:
    claimName: {{ include "onnxopt.dataClaimName" . }}
- name: tmp
  emptyDir: {}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "onnxopt: tls.secretName is required with tls.enabled" .Values.tls.secretName }}
    defaultMode: 0440
{{- if .Values.tls.caSecret }}
- name: tls-ca
  secret:
    secretName: {{ .Values.tls.caSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.tls.clientCaSecret }}
- name: client-ca
  secret:
    secretName: {{ .Values.tls.clientCaSecret }}
    defaultMode: 0440
# The probes' client certificate (mutual TLS): without one they could not tell a draining pod from a ready one.
- name: probe-client
  secret:
    secretName: {{ required "onnxopt: tls.probeClientSecret is required with tls.clientCaSecret: with mutual TLS the health probes present a client certificate (a kubernetes.io/tls Secret signed by the client CA)" .Values.tls.probeClientSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- if .Values.extraVolumes }}
{{ toYaml .Values.extraVolumes }}
{{- end -}}
{{- end -}}

{{/* Pod fields every pool shares. */}}
{{- define "onnxopt.podCommon" -}}
serviceAccountName: {{ include "onnxopt.serviceAccountName" . }}
automountServiceAccountToken: false   # the server does not talk to the Kubernetes API
enableServiceLinks: false
terminationGracePeriodSeconds: {{ .Values.server.drainGraceSeconds | int64 | add 30 }}   # > --drain-grace-seconds
securityContext:
  {{- include "onnxopt.podSecurityContext" . | nindent 2 }}
{{- if .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml .Values.imagePullSecrets | nindent 2 }}
{{- end }}
{{- end -}}
