'use strict';
// Broken copies of the shipped files, one fault each, and the check that must catch it
// (check_manifests.js --self-test). `file` is a manifest's path under deploy/kubernetes or a
// repository path the checks read (OTHER_FILES of check_manifests.js). `nth` picks the nth
// occurrence of `from` (1-based); without it `from` must occur exactly once, so a mutation
// cannot silently stop matching.

const S = 'kvarnd-sidecar.yaml';
const D = 'kvarnd-daemonset.yaml';
const MON = 'kvarnd-monitoring.yaml';
const W = 'examples/node-worker.yaml';
const T = 'examples/kvarnd-tenants.yaml';
const DOCKER = 'deploy/docker/Dockerfile';
const IGNORE = '.dockerignore';
const RULES = 'deploy/prometheus/kvarnd-rules.yml';

const MUTATIONS = [
  // schema
  { id: 'port-as-string', check: 'schema', file: S, from: 'containerPort: 9464', to: 'containerPort: "9464"', why: 'containerPort must be an integer' },
  { id: 'unknown-field', check: 'schema', file: S, from: 'shareProcessNamespace: true', to: 'shareProcessNamespaces: true', why: 'a misspelt field is unknown to the schema' },
  { id: 'bad-enum', check: 'schema', file: D, from: 'type: DirectoryOrCreate', to: 'type: DirectoryOrMake', why: 'hostPath type is an enum' },
  { id: 'no-schema-kind', check: 'schema', file: MON, from: 'kind: PodMonitor', to: 'kind: PodWatcher', why: 'a kind without a schema is not accepted' },
  // volumes
  { id: 'volume-renamed', check: 'volumes', file: S, from: '        - name: kvarnd-config\n          configMap:', to: '        - name: kvarnd-conf\n          configMap:', why: 'mounts name a volume that is gone' },
  // references
  { id: 'configmap-missing', check: 'references', file: D, from: 'configMap:\n            name: kvarnd-config', to: 'configMap:\n            name: kvarnd-settings', why: 'the ConfigMap is not defined' },
  { id: 'serviceaccount-missing', check: 'references', file: D, from: 'serviceAccountName: kvarnd', to: 'serviceAccountName: kvarnd-node', why: 'the ServiceAccount is not defined' },
  { id: 'secret-key-missing', check: 'references', file: W, from: '              - key: token\n', to: '              - key: tokn\n', why: 'the Secret has no such key' },
  { id: 'namespace-missing', check: 'references', file: D, from: 'kind: Namespace\nmetadata:\n  name: kvarn-system', to: 'kind: Namespace\nmetadata:\n  name: kvarn-sys', why: 'objects live in an undefined namespace' },
  // kvarnd-config and the real daemon
  { id: 'config-not-from-configmap', check: 'kvarnd-config', file: S, from: '- --config=/etc/kvarnd/kvarnd.conf', to: '- --config=/etc/kvarnd.conf', why: 'the config path is on no ConfigMap volume' },
  { id: 'config-duplicate-key', check: 'kvarnd-config', file: S, from: '    seal_threads = 4\n', to: '    seal_threads = 4\n    seal_threads = 2\n', why: 'kvarnd refuses a key set twice' },
  { id: 'capacity-too-small', check: 'check-config', file: S, from: 'capacity = 8GiB', to: 'capacity = 1MiB', why: 'kvarnd refuses a pool that holds no block' },
  { id: 'unknown-setting', check: 'check-config', file: D, from: '    seal_threads = 4\n', to: '    seal_thread = 4\n', why: 'kvarnd refuses an unknown key' },
  { id: 'flag-refused', check: 'check-config', file: S, from: '          args:\n            - --config=/etc/kvarnd/kvarnd.conf\n', to: '          args:\n            - --config=/etc/kvarnd/kvarnd.conf\n            - --head_dim=96\n', why: 'a flag on the command line kvarnd refuses' },
  // Runs only as root (kvarnd started as the pod's uid against the file as mounted).
  { id: 'tenants-mounted-unreadable', check: 'kvarnd-start', root: true, file: D, from: '        fsGroup: 10001\n', to: '', why: 'without fsGroup the Secret\'s file is root:root 0440: kvarnd refuses it' },
  { id: 'tenants-unparsable', check: 'kvarnd-start', file: T, from: 'token_sha256=d183c034', to: 'token_sha256=zz83c034', why: 'kvarnd refuses a tenants file with a bad hash' },
  // socket
  { id: 'target-other-socket', check: 'socket', file: S, from: 'value: unix:/run/kvarnd/kvarnd.sock', to: 'value: unix:/run/kvarnd/other.sock', why: 'KVARN_TARGET is not listen' },
  { id: 'worker-mount-elsewhere', check: 'socket', file: S, from: '            - name: kvarnd-run\n              mountPath: /run/kvarnd\n              readOnly: true', to: '            - name: kvarnd-run\n              mountPath: /run/kvarn\n              readOnly: true', why: 'the worker mounts the socket volume at another path' },
  { id: 'node-worker-other-hostpath', check: 'socket', file: W, from: 'path: /run/kvarnd\n            type: Directory', to: 'path: /var/run/kvarn\n            type: Directory', why: 'the worker mounts another node directory' },
  { id: 'probe-target-wrong', check: 'socket', file: D, from: '--target=unix:/run/kvarnd/kvarnd.sock', to: '--target=unix:/run/kvarnd/old.sock', why: 'the health probe asks another socket' },
  // uid
  { id: 'worker-other-uid', check: 'uid', file: W, from: 'runAsUser: 10001', to: 'runAsUser: 10002', why: 'sockets are 0600: the worker must be kvarnd\'s uid' },
  { id: 'dockerfile-other-user', check: 'uid', file: DOCKER, from: 'USER 10001:10001', to: 'USER 10002:10002', why: 'the image\'s USER differs from runAsUser' },
  { id: 'socket-mode-open', check: 'uid', file: S, from: 'socket_mode = 0600', to: 'socket_mode = 0666', why: 'the manifests rely on 0600' },
  // ports
  { id: 'annotation-port', check: 'ports', file: S, from: 'prometheus.io/port: "9464"', to: 'prometheus.io/port: "9465"', why: 'the annotation names another port' },
  { id: 'service-target-port', check: 'ports', file: MON, from: 'targetPort: metrics', to: 'targetPort: 9465', why: 'the Service targets another port' },
  { id: 'podmonitor-port', check: 'ports', file: MON, from: 'not scraped by this monitor.\n    - port: metrics', to: 'not scraped by this monitor.\n    - port: http', why: 'the PodMonitor names a port kvarnd does not have' },
  { id: 'metrics-port-moved', check: 'ports', file: D, from: 'metrics = 0.0.0.0:9464', to: 'metrics = 0.0.0.0:9465', why: 'the container port and probes no longer match the config' },
  { id: 'metrics-loopback', check: 'ports', file: S, from: 'metrics = 0.0.0.0:9464', to: 'metrics = 127.0.0.1:9464', why: 'the kubelet cannot reach a loopback port' },
  { id: 'service-selects-nothing', check: 'ports', file: MON, from: 'spec:\n  # Headless: Prometheus scrapes every pod; nothing is load-balanced.\n  clusterIP: None\n  selector:\n    app.kubernetes.io/name: kvarnd', to: 'spec:\n  # Headless: Prometheus scrapes every pod; nothing is load-balanced.\n  clusterIP: None\n  selector:\n    app.kubernetes.io/name: kvarn', why: 'the Service selects no pod' },
  // probes
  { id: 'readiness-healthz', check: 'probes', file: D, from: 'path: /readyz', to: 'path: /healthz', why: '/healthz stays 200 while draining' },
  { id: 'health-timeout-long', check: 'probes', file: S, from: '--timeout=2s', to: '--timeout=5s', why: 'kvarnctl health would outlive the probe' },
  { id: 'readiness-missing', check: 'probes', file: S, from: '          readinessProbe:\n            httpGet:\n              path: /readyz\n              port: metrics\n            periodSeconds: 5\n            timeoutSeconds: 2\n            failureThreshold: 1\n', to: '', why: 'without readiness a draining kvarnd keeps its endpoints' },
  { id: 'grpc-probe', check: 'probes', file: D, from: '          livenessProbe:\n            httpGet:\n              path: /healthz\n              port: metrics', to: '          livenessProbe:\n            grpc:\n              port: 9464', why: 'the kubelet\'s grpc probe cannot reach a Unix socket' },
  // probes against the real daemon
  { id: 'probe-path-404', check: 'probes-live', file: S, from: 'path: /readyz', to: 'path: /ready', why: 'kvarnd serves no /ready' },
  { id: 'health-command-wrong', check: 'probes-live', file: D, from: '                - health\n', to: '                - status\n', why: 'kvarnctl status is not a probe' },
  // security
  { id: 'escalation-allowed', check: 'security', file: S, from: 'allowPrivilegeEscalation: false', nth: 2, to: 'allowPrivilegeEscalation: true', why: 'kvarnd must not escalate' },
  { id: 'rootfs-writable', check: 'security', file: D, from: 'readOnlyRootFilesystem: true', nth: 2, to: 'readOnlyRootFilesystem: false', why: 'kvarnd\'s root filesystem is read-only' },
  { id: 'seccomp-unconfined', check: 'security', file: S, from: 'type: RuntimeDefault', to: 'type: Unconfined', why: 'seccomp RuntimeDefault' },
  { id: 'extra-capability', check: 'security', file: D, from: 'add: [CHOWN]', to: 'add: [CHOWN, SYS_ADMIN]', why: 'a capability the exception does not name' },
  { id: 'exception-undeclared', check: 'security', file: D, from: 'kvarn.io/security-exceptions: >-', to: 'kvarn.io/security-notes: >-', why: 'the root init container is no longer a declared exception' },
  { id: 'exception-uncommented', check: 'security', file: D, from: '# Security exception (named in', to: '# Security context (named in', why: 'an exception needs its comment' },
  { id: 'hostipc', check: 'security', file: W, from: '      automountServiceAccountToken: false\n', to: '      hostIPC: true\n      automountServiceAccountToken: false\n', why: 'no pod needs hostIPC' },
  { id: 'worker-hostpid', check: 'security', file: W, from: '      automountServiceAccountToken: false\n', to: '      hostPID: true\n      automountServiceAccountToken: false\n', why: 'no pod needs hostPID' },
  // topology
  { id: 'sidecar-not-native', check: 'topology', file: S, from: 'restartPolicy: Always', to: 'restartPolicy: OnFailure', why: 'kvarnd must be a native sidecar' },
  { id: 'no-shared-pid-namespace', check: 'topology', file: S, from: 'shareProcessNamespace: true', to: 'shareProcessNamespace: false', why: 'the CUDA backend needs the worker\'s pid' },
  { id: 'node-hostpid', check: 'topology', file: D, from: 'hostPID: false', to: 'hostPID: true', why: 'the node daemon runs in its own PID namespace' },
  { id: 'daemonset-surge', check: 'topology', file: D, from: 'maxSurge: 0', to: 'maxSurge: 1', why: 'two kvarnd on one node' },
  // grace
  { id: 'grace-too-short', check: 'grace', file: S, from: 'terminationGracePeriodSeconds: 60', to: 'terminationGracePeriodSeconds: 20', why: '20 s < drain 10 s + preStop 5 s + margin' },
  { id: 'grace-equals-drain', check: 'grace', file: D, from: 'terminationGracePeriodSeconds: 30', to: 'terminationGracePeriodSeconds: 10', why: 'grace = drain_ms 10 s: the kubelet kills kvarnd as the drain ends' },
  { id: 'drain-too-long', check: 'grace', file: D, from: 'drain_ms = 10000', to: 'drain_ms = 60000', why: 'drain exceeds the grace period' },
  // memory
  { id: 'limit-below-capacity', check: 'memory', file: D, from: 'memory: 17Gi', nth: 2, to: 'memory: 16Gi', why: 'the limit does not cover capacity + overhead' },
  { id: 'worker-request-small', check: 'memory', file: S, from: 'memory: 16Gi', nth: 1, to: 'memory: 1Gi', why: 'the worker does not request its tail slots' },
  // gpu
  { id: 'kvarnd-takes-gpu', check: 'gpu', file: S, from: '            limits:\n              memory: 9Gi\n', to: '            limits:\n              memory: 9Gi\n              nvidia.com/gpu: 1\n', why: 'kvarnd would get a GPU of its own' },
  { id: 'node-backend-auto', check: 'gpu', file: D, from: '    backend = host\n', to: '    backend = auto\n', why: 'a GPU pool cannot serve other pods' },
  { id: 'gpu-not-handed-over', check: 'gpu', file: S, from: '              memory: 64Mi\n              nvidia.com/gpu: 1\n', to: '              memory: 64Mi\n', why: 'nothing takes the GPU for the worker and kvarnd to share' },
  { id: 'gpu-visibility-missing', check: 'gpu', file: S, from: '            - name: NVIDIA_VISIBLE_DEVICES\n              value: all\n', to: '', why: 'kvarnd would see no GPU' },
  // images
  { id: 'image-other-tag', check: 'images', file: S, from: 'image: registry.example.com/kvarnd:0.1.0', nth: 2, to: 'image: registry.example.com/kvarnd:0.2.0', why: 'not the image the Dockerfile builds' },
  { id: 'dockerfile-other-tag', check: 'images', file: DOCKER, from: '-t registry.example.com/kvarnd:0.1.0', to: '-t registry.example.com/kvarnd:0.1.1', why: 'the manifests name another image' },
  // tenants
  { id: 'token-mismatch', check: 'tenants', file: W, from: 'token: example-team-a-token-replace-me', to: 'token: example-team-a-token-replaced', why: 'the token does not hash to team-a\'s token_sha256' },
  { id: 'tenants-secret-mode', check: 'tenants', file: D, from: 'defaultMode: 0440', to: 'defaultMode: 0444', why: 'the token hashes would be world-readable, and kvarnd refuses that' },
  { id: 'tenants-no-fsgroup', check: 'tenants', file: D, from: '        fsGroup: 10001\n', to: '', why: 'the Secret\'s file stays root:root 0440, unreadable by kvarnd' },
  { id: 'tenants-not-secret', check: 'tenants', file: D, from: '    tenants_file = /etc/kvarnd-tenants/tenants\n', to: '    tenants_file = /etc/kvarnd/tenants\n', why: 'the file is not the Secret\'s' },
  { id: 'worker-token-world', check: 'tenants', file: W, from: 'defaultMode: 0440', to: 'defaultMode: 0444', why: 'every uid could read the tenant token' },
  // job-label
  { id: 'servicemonitor-job-wrong', check: 'job-label', file: MON, from: 'replacement: kvarnd', nth: 1, to: 'replacement: kvarnd-node', why: 'the rules select job="kvarnd"' },
  { id: 'podmonitor-job-missing', check: 'job-label', file: MON, from: '      interval: 15s\n      relabelings:\n        # The operator names the job <namespace>/<PodMonitor name>; the rules want kvarnd.\n        - action: replace\n          targetLabel: job\n          replacement: kvarnd\n', to: '      interval: 15s\n', why: 'the PodMonitor\'s job would be kvarn-system/kvarnd-sidecar' },
  { id: 'namespace-label-dropped', check: 'job-label', file: MON, from: '          targetLabel: node\n', to: '          targetLabel: node\n        - action: labeldrop\n          regex: namespace\n', why: 'the dashboard\'s namespace variable reads it' },
  { id: 'rules-other-job', check: 'job-label', file: RULES, from: 'up{job="kvarnd"}', to: 'up{job="kvarn"}', why: 'the monitors and the rules disagree on the job' },
  // Dockerfile
  { id: 'docker-base-debian11', check: 'docker-stages', file: DOCKER, from: 'FROM debian:12 AS build', to: 'FROM debian:11 AS build', why: 'the build stage must be Debian 12' },
  { id: 'docker-runtime-full', check: 'docker-stages', file: DOCKER, from: 'FROM debian:12-slim AS runtime', to: 'FROM debian:12 AS runtime', why: 'the runtime stage is the slim image' },
  { id: 'docker-no-build-sh', check: 'docker-stages', file: DOCKER, from: 'RUN KVARN_BUILD_DIR=/build deploy/build.sh \\', to: 'RUN cmake -S . -B /build -G Ninja \\', why: 'the image must build with deploy/build.sh' },
  { id: 'docker-runtime-dev', check: 'docker-stages', file: DOCKER, from: '      libgrpc29 \\\n', to: '      libgrpc29 \\\n      libgrpc-dev \\\n', why: 'no -dev package at run time' },
  { id: 'docker-copy-missing', check: 'docker-copy', file: DOCKER, from: 'COPY common common', to: 'COPY commons common', why: 'the COPY source does not exist' },
  { id: 'docker-dir-not-copied', check: 'docker-copy', file: DOCKER, from: 'COPY client client\n', to: '', why: 'CMakeLists.txt adds client/, which is not copied' },
  { id: 'docker-tests-on', check: 'docker-copy', file: DOCKER, from: ' -DKVARN_BUILD_TESTS=OFF', to: '', why: 'CMake then adds tests/ (KVARN_BUILD_TESTS defaults to ON), which is not copied' },
  { id: 'docker-copy-ignored', check: 'docker-copy', file: IGNORE, from: '.git\n', to: '.git\nproto\n', why: '.dockerignore excludes a copied folder' },
  { id: 'docker-user-name', check: 'docker-runtime', file: DOCKER, from: 'USER 10001:10001', to: 'USER kvarn', why: 'runAsNonRoot cannot verify a user name' },
  { id: 'docker-entrypoint-elsewhere', check: 'docker-runtime', file: DOCKER, from: 'ENTRYPOINT ["/usr/local/bin/kvarnd"]', to: 'ENTRYPOINT ["/usr/bin/kvarnd"]', why: 'the image has no /usr/bin/kvarnd' },
  { id: 'docker-not-installed', check: 'docker-runtime', file: DOCKER, from: 'COPY --from=build /opt/kvarn/bin/kvarnctl', to: 'COPY --from=build /opt/kvarn/bin/kvarnadm', why: 'the build installs no kvarnadm' },
  { id: 'docker-library-missing', check: 'docker-runtime', file: DOCKER, from: '      libre2-9 \\\n', to: '', why: 'kvarnd links libre2 (through gRPC)' },
  { id: 'docker-package-extra', check: 'docker-runtime', file: DOCKER, from: '      zlib1g \\\n', to: '      zlib1g \\\n      curl \\\n', why: 'only the runtime libraries belong in the image' },
  { id: 'probe-binary-elsewhere', check: 'docker-runtime', file: S, from: '                - /usr/local/bin/kvarnctl\n', to: '                - /usr/bin/kvarnctl\n', why: 'the image has no /usr/bin/kvarnctl' },
];

function applyMutation(inputs, mut) {
  const manifest = inputs.texts.has(mut.file);
  const source = manifest ? inputs.texts.get(mut.file) : inputs.others.get(mut.file);
  if (source === undefined) return { error: `${mut.file} does not exist` };
  const parts = source.split(mut.from);
  const count = parts.length - 1;
  if (mut.nth ? count < mut.nth : count !== 1) {
    return { error: `'${mut.from.split('\n')[0]}' occurs ${count} times in ${mut.file} (stale mutation)` };
  }
  const nth = mut.nth || 1;
  const changed = parts.slice(0, nth).join(mut.from) + mut.to + parts.slice(nth).join(mut.from);
  const texts = new Map(inputs.texts);
  const others = new Map(inputs.others);
  (manifest ? texts : others).set(mut.file, changed);
  return { inputs: { ...inputs, texts, others, text: (rel) => others.get(rel) } };
}

module.exports = { MUTATIONS, applyMutation };
