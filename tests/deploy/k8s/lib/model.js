'use strict';
// What the checks need to know about the manifests: pods inside workloads, containers with
// their effective security context, references, quantities and kvarnd's configuration text.

const path = require('path');

const CLUSTER_SCOPED = new Set([
  'Namespace', 'ClusterRole', 'ClusterRoleBinding', 'PersistentVolume', 'StorageClass',
  'PriorityClass', 'RuntimeClass', 'CustomResourceDefinition', 'DeviceClass',
]);

function namespaceOf(obj) {
  if (CLUSTER_SCOPED.has(obj.kind)) return '';
  return (obj.metadata && obj.metadata.namespace) || 'default';
}

function nameOf(obj) {
  return (obj.metadata && obj.metadata.name) || '';
}

function describe(doc) {
  const ns = namespaceOf(doc.obj);
  return `${doc.file}#${doc.index} ${doc.obj.kind} ${ns ? ns + '/' : ''}${nameOf(doc.obj)}`;
}

// Pod templates of the workloads (and bare Pods), with the YAML path to their spec.
function pods(docs) {
  const out = [];
  for (const doc of docs) {
    const o = doc.obj;
    let template = null;
    let specPath = null;
    if (['Deployment', 'DaemonSet', 'StatefulSet', 'ReplicaSet', 'Job'].includes(o.kind)) {
      template = o.spec && o.spec.template;
      specPath = ['spec', 'template', 'spec'];
    } else if (o.kind === 'CronJob') {
      template = o.spec && o.spec.jobTemplate && o.spec.jobTemplate.spec && o.spec.jobTemplate.spec.template;
      specPath = ['spec', 'jobTemplate', 'spec', 'template', 'spec'];
    } else if (o.kind === 'Pod') {
      template = o;
      specPath = ['spec'];
    }
    if (!template || !template.spec) continue;
    const meta = template.metadata || {};
    out.push({
      doc,
      where: describe(doc),
      workload: o,
      ns: namespaceOf(o),
      labels: meta.labels || {},
      annotations: meta.annotations || {},
      spec: template.spec,
      specPath,
    });
  }
  return out;
}

// Every container of a pod: init containers first (in order), then the main ones.
function containers(pod) {
  const out = [];
  (pod.spec.initContainers || []).forEach((c, i) => out.push({
    c, pod, init: true, sidecar: c.restartPolicy === 'Always', index: i,
    yamlPath: [...pod.specPath, 'initContainers', i],
    where: `${pod.where} initContainer ${c.name}`,
  }));
  (pod.spec.containers || []).forEach((c, i) => out.push({
    c, pod, init: false, sidecar: false, index: i,
    yamlPath: [...pod.specPath, 'containers', i],
    where: `${pod.where} container ${c.name}`,
  }));
  return out;
}

// The container-level security context over the pod-level one, for the fields both have.
function effectiveSecurity(ct) {
  const podSc = ct.pod.spec.securityContext || {};
  const sc = ct.c.securityContext || {};
  const pick = (k) => (sc[k] !== undefined ? sc[k] : podSc[k]);
  return {
    runAsUser: pick('runAsUser'),
    runAsGroup: pick('runAsGroup'),
    runAsNonRoot: pick('runAsNonRoot'),
    seccompProfile: pick('seccompProfile'),
    readOnlyRootFilesystem: sc.readOnlyRootFilesystem,
    allowPrivilegeEscalation: sc.allowPrivilegeEscalation,
    privileged: sc.privileged,
    capabilities: sc.capabilities || {},
  };
}

function envValue(c, name) {
  const e = (c.env || []).find((x) => x.name === name);
  return e && e.value !== undefined ? e.value : undefined;
}

// Kubernetes resource quantities ("9Gi", "512M", "1.5Gi", "100m") as numbers.
function parseQuantity(q) {
  if (typeof q === 'number') return q;
  const m = /^([0-9]+(?:\.[0-9]+)?)(?:[eE]([0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$/.exec(String(q));
  if (!m) return NaN;
  const scale = {
    Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
    m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
  }[m[3]] || 1;
  return parseFloat(m[1]) * (m[2] ? 10 ** parseInt(m[2], 10) : 1) * scale;
}

// kvarnd's byte sizes (common/units.cc): 512MiB, 8GiB, 4096, 1.5GB.
function parseBytes(text) {
  const units = [['KiB', 2 ** 10], ['MiB', 2 ** 20], ['GiB', 2 ** 30], ['TiB', 2 ** 40],
    ['KB', 1e3], ['MB', 1e6], ['GB', 1e9], ['TB', 1e12], ['B', 1]];
  let number = text;
  let scale = 1;
  for (const [u, s] of units) {
    if (text.endsWith(u)) {
      number = text.slice(0, -u.length);
      scale = s;
      break;
    }
  }
  if (!/^[0-9]+(\.[0-9]+)?$/.test(number)) return NaN;
  return Math.floor(parseFloat(number) * scale);
}

function formatBytes(n) {
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(2)} GiB` : `${(n / 2 ** 20).toFixed(1)} MiB`;
}

// `key = value` lines the way kvarnd reads them (daemon/service/config.cc): a '#' at the
// start or after a blank starts a comment. Returns the keys in order, and duplicates.
function parseKvarndConfig(text) {
  const values = new Map();
  const duplicates = [];
  const malformed = [];
  text.split('\n').forEach((raw, i) => {
    let line = raw;
    for (let j = 0; j < line.length; ++j) {
      if (line[j] === '#' && (j === 0 || line[j - 1] === ' ' || line[j - 1] === '\t')) {
        line = line.slice(0, j);
        break;
      }
    }
    line = line.trim();
    if (!line) return;
    const eq = line.indexOf('=');
    if (eq < 0) {
      malformed.push(`line ${i + 1}: ${line}`);
      return;
    }
    const key = line.slice(0, eq).trim();
    if (values.has(key)) duplicates.push(key);
    values.set(key, line.slice(eq + 1).trim());
  });
  return { values, duplicates, malformed };
}

// The `--key=value` flags of a kvarnd command line (flags win over the file).
function parseFlags(args) {
  const flags = new Map();
  for (const a of args || []) {
    const m = /^--([A-Za-z0-9_-]+)=(.*)$/s.exec(a);
    if (m) flags.set(m[1].replace(/-/g, '_'), m[2]);
  }
  return flags;
}

// Where a path inside a container comes from: the mount that holds it and the rest of it.
function mountFor(c, p) {
  let best = null;
  for (const m of c.volumeMounts || []) {
    const mp = m.mountPath.replace(/\/+$/, '');
    if (p === mp || p.startsWith(mp + '/')) {
      if (!best || mp.length > best.mountPath.replace(/\/+$/, '').length) best = m;
    }
  }
  if (!best) return null;
  const rest = path.posix.relative(best.mountPath, p);
  return { mount: best, rest };
}

function volumeNamed(pod, name) {
  return (pod.spec.volumes || []).find((v) => v.name === name);
}

// Label selector semantics (matchLabels and matchExpressions).
function selectorMatches(selector, labels) {
  if (!selector) return false;
  const ml = selector.matchLabels || {};
  for (const [k, v] of Object.entries(ml)) if (labels[k] !== v) return false;
  for (const e of selector.matchExpressions || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    if (e.operator === 'In' && !(has && e.values.includes(labels[e.key]))) return false;
    if (e.operator === 'NotIn' && has && e.values.includes(labels[e.key])) return false;
    if (e.operator === 'Exists' && !has) return false;
    if (e.operator === 'DoesNotExist' && has) return false;
  }
  return Object.keys(ml).length > 0 || (selector.matchExpressions || []).length > 0;
}

// A container port by number or name.
function resolvePort(c, port) {
  for (const p of c.ports || []) {
    if (p.name === port || p.containerPort === port) return p.containerPort;
  }
  return typeof port === 'number' ? port : undefined;
}

// The pod's effective request of one extended resource, counting sidecars the way the
// scheduler does: max(any init container plus the sidecars started before it, every sidecar
// plus every main container).
function effectivePodRequest(pod, resource) {
  const amount = (c) => {
    const r = c.resources || {};
    const v = (r.limits && r.limits[resource]) ?? (r.requests && r.requests[resource]);
    return v === undefined ? 0 : parseQuantity(v);
  };
  let sidecars = 0;
  let initPeak = 0;
  for (const c of pod.spec.initContainers || []) {
    if (c.restartPolicy === 'Always') {
      sidecars += amount(c);
      initPeak = Math.max(initPeak, sidecars);
    } else {
      initPeak = Math.max(initPeak, sidecars + amount(c));
    }
  }
  const main = (pod.spec.containers || []).reduce((s, c) => s + amount(c), 0);
  return Math.max(initPeak, sidecars + main);
}

function containerRequest(c, resource) {
  const r = c.resources || {};
  const v = (r.limits && r.limits[resource]) ?? (r.requests && r.requests[resource]);
  return v === undefined ? 0 : parseQuantity(v);
}

module.exports = {
  namespaceOf, nameOf, describe, pods, containers, effectiveSecurity, envValue,
  parseQuantity, parseBytes, formatBytes, parseKvarndConfig, parseFlags, mountFor,
  volumeNamed, selectorMatches, resolvePort, effectivePodRequest, containerRequest,
};
