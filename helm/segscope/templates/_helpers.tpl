{{/* Names, labels, images and endpoints shared by every template. */}}

{{- define "segscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "segscope.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "segscope.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "segscope.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* labels: (list $ "component") */}}
{{- define "segscope.labels" -}}
{{- $ := index . 0 -}}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
app.kubernetes.io/part-of: segscope
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
{{ include "segscope.selectorLabels" . }}
{{- end -}}

{{- define "segscope.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "segscope.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* image: (list $ "agent") -> registry/segscope-agent:tag */}}
{{- define "segscope.image" -}}
{{- $ := index . 0 -}}
{{- printf "%s/segscope-%s:%s" $.Values.image.registry (index . 1) (default $.Chart.AppVersion $.Values.image.tag) -}}
{{- end -}}

{{- define "segscope.kafkaBootstrap" -}}
{{- if .Values.kafka.bundled -}}
{{- printf "%s-kafka:9092" (include "segscope.fullname" .) -}}
{{- else -}}
{{- required "kafka.bootstrap is required when kafka.bundled is false (HOST:PORT of your Kafka)" .Values.kafka.bootstrap -}}
{{- end -}}
{{- end -}}

{{- define "segscope.influxUrl" -}}
{{- if .Values.influxdb.bundled -}}
{{- printf "http://%s-influxdb:8086" (include "segscope.fullname" .) -}}
{{- else -}}
{{- required "influxdb.url is required when influxdb.bundled is false (e.g. https://influxdb.example:8086)" .Values.influxdb.url -}}
{{- end -}}
{{- end -}}

{{- define "segscope.arangoUrl" -}}
{{- if .Values.arangodb.bundled -}}
{{- printf "http://%s-arangodb:8529" (include "segscope.fullname" .) -}}
{{- else -}}
{{- required "arangodb.url is required when arangodb.bundled is false (e.g. https://arangodb.example:8529)" .Values.arangodb.url -}}
{{- end -}}
{{- end -}}

{{- define "segscope.credentialsSecret" -}}
{{- default (printf "%s-credentials" (include "segscope.fullname" .)) .Values.credentials.existingSecret -}}
{{- end -}}

{{- define "segscope.agentTlsSecret" -}}
{{- if eq .Values.tls.mode "existing" -}}
{{- required "tls.existing.agentSecret is required when tls.mode is existing" .Values.tls.existing.agentSecret -}}
{{- else -}}
{{- printf "%s-agent-tls" (include "segscope.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "segscope.controllerTlsSecret" -}}
{{- if eq .Values.tls.mode "existing" -}}
{{- required "tls.existing.controllerSecret is required when tls.mode is existing" .Values.tls.existing.controllerSecret -}}
{{- else -}}
{{- printf "%s-controller-tls" (include "segscope.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* env: one variable from the credentials Secret: (list $ "VAR" "key") */}}
{{- define "segscope.secretEnv" -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "segscope.credentialsSecret" (index . 0) }}
      key: {{ index . 2 }}
{{- end -}}

{{/* Pod and container security for the non-root programs (everything but the agent). */}}
{{- define "segscope.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
fsGroup: 65534
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "segscope.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The init container that makes the topics exist with the deployment's partitions. */}}
{{- define "segscope.topicsInit" -}}
- name: topics
  image: {{ include "segscope.image" (list . "processors") }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [segscope-topics]
  args:
    - --bootstrap=$(SEGSCOPE_KAFKA_BOOTSTRAP)
    - --partitions=segscope.stamp.records={{ .Values.topics.stampRecordsPartitions }}
    - --partitions=segscope.altmark.blocks={{ .Values.topics.altmarkBlocksPartitions }}
    # the loss workers' second stage reads the records re-keyed by flow: as many partitions
    - --partitions=segscope.altmark.blocks.by_flow={{ .Values.topics.altmarkBlocksPartitions }}
    - --partitions=segscope.ioam.records={{ .Values.topics.ioamRecordsPartitions }}
    - --replication={{ .Values.topics.replicationFactor }}
    - --timeout=300
  envFrom:
    - configMapRef:
        name: {{ include "segscope.fullname" . }}-endpoints
  {{- with include "segscope.kafkaEnv" (list . "admin") }}
  env: {{- . | nindent 4 }}
  volumeMounts: {{- include "segscope.kafkaMounts" (list $ "admin") | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "segscope.containerSecurityContext" . | nindent 4 }}
  resources:
    requests: {cpu: 50m, memory: 64Mi, ephemeral-storage: 16Mi}
    limits: {memory: 128Mi, ephemeral-storage: 64Mi}
{{- end -}}

{{/* controller pod template: (list $ "apply"|"diff") */}}
{{- define "segscope.controllerPod" -}}
{{- $ := index . 0 -}}
{{- $fn := include "segscope.fullname" $ -}}
metadata:
  labels:
    {{- include "segscope.labels" (list $ "controller") | nindent 4 }}
  annotations:
    checksum/intent: {{ $.Values.controller.intent | sha256sum }}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext:
    {{- include "segscope.podSecurityContext" $ | nindent 4 }}
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets: {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: controller
      image: {{ include "segscope.image" (list $ "controller") }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      command: [segscope-controller]
      args: [{{ index . 1 }}, /etc/segscope/intent/intent.yaml]
      env:
        - {name: SEGSCOPE_TLS_DIR, value: /etc/segscope/tls}
        - {name: SEGSCOPE_AGENT_SERVER_NAME, value: {{ $.Values.tls.agentServerName | quote }}}
      securityContext:
        {{- include "segscope.containerSecurityContext" $ | nindent 8 }}
      resources:
        {{- toYaml $.Values.controller.resources | nindent 8 }}
      volumeMounts:
        - {name: intent, mountPath: /etc/segscope/intent, readOnly: true}
        - {name: tls, mountPath: /etc/segscope/tls, readOnly: true}
  volumes:
    - name: intent
      configMap:
        name: {{ $fn }}-intent
    - name: tls
      secret:
        secretName: {{ include "segscope.controllerTlsSecret" $ }}
        defaultMode: 0440
{{- end -}}

{{/* container security of a bundled third-party server: include with its image's uid */}}
{{- define "segscope.bundledContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Kafka security (values kafka.security, docs/security.md) of one role: (list $ "agent"|"processor"|"telegraf"|"admin").
The SEGSCOPE_KAFKA_* environment (nothing for PLAINTEXT); the secrets are files under /etc/segscope/kafka. */}}
{{- define "segscope.kafkaSasl" -}}
{{- $ks := (index . 0).Values.kafka.security -}}
{{- if hasPrefix "SASL_" $ks.protocol }}true{{ end -}}
{{- end -}}
{{- define "segscope.kafkaSsl" -}}
{{- $ks := (index . 0).Values.kafka.security -}}
{{- if hasSuffix "SSL" $ks.protocol }}true{{ end -}}
{{- end -}}
{{- define "segscope.kafkaEnv" -}}
{{- $ := index . 0 -}}{{- $role := index . 1 -}}
{{- $ks := $.Values.kafka.security -}}
{{- $u := index $ks.users $role -}}
{{- if ne $ks.protocol "PLAINTEXT" }}
- {name: SEGSCOPE_KAFKA_SECURITY_PROTOCOL, value: {{ $ks.protocol | quote }}}
{{- if include "segscope.kafkaSasl" (list $) }}
- {name: SEGSCOPE_KAFKA_SASL_MECHANISM, value: {{ default $ks.saslMechanism $u.mechanism | quote }}}
- {name: SEGSCOPE_KAFKA_SASL_USERNAME, value: {{ $u.username | quote }}}
- {name: SEGSCOPE_KAFKA_SASL_PASSWORD_FILE, value: /etc/segscope/kafka/user/password}
{{- end }}
{{- if and (include "segscope.kafkaSsl" (list $)) $ks.caSecret }}
- {name: SEGSCOPE_KAFKA_SSL_CA_FILE, value: /etc/segscope/kafka/ca/{{ $ks.caKey }}}
{{- end }}
{{- if and (include "segscope.kafkaSsl" (list $)) $ks.clientCertificates }}
- {name: SEGSCOPE_KAFKA_SSL_CERT_FILE, value: /etc/segscope/kafka/user/tls.crt}
- {name: SEGSCOPE_KAFKA_SSL_KEY_FILE, value: /etc/segscope/kafka/user/tls.key}
{{- end }}
{{- end }}
{{- end -}}
{{- define "segscope.kafkaMounts" -}}
{{- $ := index . 0 -}}{{- $role := index . 1 -}}
{{- $ks := $.Values.kafka.security -}}
{{- if and (include "segscope.kafkaSasl" (list $)) }}
- {name: kafka-{{ $role }}, mountPath: /etc/segscope/kafka/user, readOnly: true}
{{- else if and (include "segscope.kafkaSsl" (list $)) $ks.clientCertificates }}
- {name: kafka-{{ $role }}, mountPath: /etc/segscope/kafka/user, readOnly: true}
{{- end }}
{{- if and (include "segscope.kafkaSsl" (list $)) $ks.caSecret }}
- {name: kafka-ca, mountPath: /etc/segscope/kafka/ca, readOnly: true}
{{- end }}
{{- end -}}
{{- define "segscope.kafkaVolumes" -}}
{{- $ := index . 0 -}}{{- $roles := index . 1 -}}
{{- $ks := $.Values.kafka.security -}}
{{- range $role := $roles }}
{{- $u := index $ks.users $role }}
{{- if or (include "segscope.kafkaSasl" (list $)) (and (include "segscope.kafkaSsl" (list $)) $ks.clientCertificates) }}
- name: kafka-{{ $role }}
  secret:
    secretName: {{ required (printf "kafka.security.users.%s.secret is required with kafka.security.protocol=%s (a Secret with the role's password)" $role $ks.protocol) $u.secret }}
    defaultMode: 0440   # root (the agent) or the pod's fsGroup (everything else)
{{- end }}
{{- end }}
{{- if and (include "segscope.kafkaSsl" (list $)) $ks.caSecret }}
- name: kafka-ca
  secret: {secretName: {{ $ks.caSecret }}}
{{- end }}
{{- end -}}
