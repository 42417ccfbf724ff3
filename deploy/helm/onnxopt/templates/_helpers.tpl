{{/*
Helpers of the onnxopt chart. tests/helm_chart_test.py renders this chart with its own small Go-template
renderer (helm is not available there): keep to the functions it implements (quote, default, toYaml,
nindent, indent, required, fail, printf, trunc, trimSuffix, hasPrefix, contains, eq, ne, and, or, not,
int, int64, add, include) and to if/else if/else/define; no variables, range or with.
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

{{/* Flags every replica gets, after --role (a list's items). */}}
{{- define "onnxopt.commonArgs" -}}
- --listen=0.0.0.0:50051
- --metrics_listen=0.0.0.0:9464
- --data_dir=/var/lib/onnxopt
- --job_store=$(ONNXOPT_JOB_STORE)
- --lease_seconds={{ .Values.server.leaseSeconds | int64 }}
- --max_attempts={{ .Values.server.maxAttempts | int64 }}
- --job_store_connections={{ .Values.server.jobStoreConnections | int64 }}
- --drain_grace_seconds={{ .Values.server.drainGraceSeconds | int64 }}
- --job_timeout_seconds={{ .Values.server.jobTimeoutSeconds | int64 }}
- --queue_capacity={{ .Values.server.queueCapacity | int64 }}
- --max_upload_bytes={{ .Values.server.maxUploadBytes | int64 }}
{{- if .Values.tls.enabled }}
- --tls_cert=/etc/onnxopt/tls/tls.crt
- --tls_key=/etc/onnxopt/tls/tls.key
{{- if .Values.tls.clientCaSecret }}
- --tls_client_ca=/etc/onnxopt/client-ca/{{ .Values.tls.clientCaKey }}
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

{{/* Liveness (and the workers' readiness): plain gRPC health, or a TCP connect when gRPC is over TLS. */}}
{{- define "onnxopt.healthCheck" -}}
{{- if .Values.tls.enabled -}}
tcpSocket: {port: 50051}
{{- else -}}
grpc: {port: 50051}
{{- end -}}
{{- end -}}

{{- define "onnxopt.volumeMounts" -}}
- {name: data, mountPath: /var/lib/onnxopt}
- {name: tmp, mountPath: /tmp}
{{- if .Values.tls.enabled }}
- {name: tls, mountPath: /etc/onnxopt/tls, readOnly: true}
{{- if .Values.tls.clientCaSecret }}
- {name: client-ca, mountPath: /etc/onnxopt/client-ca, readOnly: true}
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
{{- if .Values.tls.clientCaSecret }}
- name: client-ca
  secret:
    secretName: {{ .Values.tls.clientCaSecret }}
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
terminationGracePeriodSeconds: {{ .Values.server.drainGraceSeconds | int64 | add 30 }}   # > --drain_grace_seconds
securityContext:
  {{- include "onnxopt.podSecurityContext" . | nindent 2 }}
{{- if .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml .Values.imagePullSecrets | nindent 2 }}
{{- end }}
{{- end -}}
