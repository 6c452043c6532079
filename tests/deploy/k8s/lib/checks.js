'use strict';
// The project's own rules for deploy/kubernetes, beyond the API schemas. Each check records
// every assertion it makes; a check that asserted nothing fails, so a rule can never pass by
// finding nothing to look at.

const crypto = require('crypto');
const path = require('path');
const M = require('./model');
const { checkJobLabel } = require('./monitoring');

const MIB = 2 ** 20;
// What kvarnd needs beside its pool and gRPC's quota: code, heap, thread stacks, page tables.
const PROCESS_OVERHEAD = 256 * MIB;
// terminationGracePeriodSeconds must exceed drain_ms and the preStop sleeps by this much.
const GRACE_MARGIN_MS = 10000;
const GPU = 'nvidia.com/gpu';

class Check {
  constructor(id, title) {
    this.id = id;
    this.title = title;
    this.assertions = 0;
    this.failures = [];
  }

  expect(ok, where, message) {
    this.assertions += 1;
    if (!ok) this.failures.push(`${where}: ${message}`);
    return Boolean(ok);
  }
}

function kvarndImage(model) {
  return model.dockerfile && model.dockerfile.image;
}

function isKvarndImage(model, image) {
  const want = kvarndImage(model);
  const repo = (s) => String(s || '').replace(/[:@][^/]*$/, '');
  return Boolean(image) && (image === want || repo(image) === repo(want) || /(^|\/)kvarnd([:@]|$)/.test(image));
}

function objectsOf(model, kind, ns) {
  return model.docs.filter((d) => d.obj.kind === kind && M.namespaceOf(d.obj) === ns).map((d) => d.obj);
}

function findObject(model, kind, ns, name) {
  return objectsOf(model, kind, ns).find((o) => M.nameOf(o) === name);
}

function secretValue(secret, key) {
  if (secret.stringData && secret.stringData[key] !== undefined) return String(secret.stringData[key]);
  if (secret.data && secret.data[key] !== undefined) return Buffer.from(String(secret.data[key]), 'base64').toString('utf8');
  return undefined;
}

function dataKeys(obj) {
  return new Set([...Object.keys(obj.data || {}), ...Object.keys(obj.stringData || {}), ...Object.keys(obj.binaryData || {})]);
}

// The file a path inside a container reads from a ConfigMap or Secret volume.
function projectedFile(model, ct, p) {
  const mf = M.mountFor(ct.c, p);
  if (!mf) return null;
  const vol = M.volumeNamed(ct.pod, mf.mount.name);
  if (!vol) return null;
  const src = vol.configMap ? { kind: 'ConfigMap', name: vol.configMap.name, items: vol.configMap.items, mode: vol.configMap.defaultMode }
    : vol.secret ? { kind: 'Secret', name: vol.secret.secretName, items: vol.secret.items, mode: vol.secret.defaultMode }
      : null;
  if (!src) return { volume: vol, mount: mf.mount, rest: mf.rest };
  let key = mf.rest;
  let mode = src.mode;
  if (src.items) {
    const item = src.items.find((i) => i.path === mf.rest);
    key = item ? item.key : undefined;
    if (item && item.mode !== undefined) mode = item.mode;
  }
  const obj = findObject(model, src.kind, ct.pod.ns, src.name);
  return { volume: vol, mount: mf.mount, rest: mf.rest, kind: src.kind, name: src.name, key, mode, obj };
}

// Every container named kvarnd, with the configuration it runs (file and flags).
function resolveKvarnd(model) {
  const out = [];
  for (const pod of model.pods) {
    for (const ct of M.containers(pod)) {
      if (ct.c.name !== 'kvarnd') continue;
      const argv = [...(ct.c.command || []), ...(ct.c.args || [])];
      const flags = M.parseFlags(argv);
      const k = { ct, pod, flags, problems: [], values: new Map() };
      const configPath = flags.get('config');
      if (!configPath) {
        k.problems.push('no --config=FILE on its command line');
      } else {
        const f = projectedFile(model, ct, configPath);
        if (!f || f.kind !== 'ConfigMap') k.problems.push(`--config=${configPath} is not a file of a ConfigMap volume`);
        else if (!f.obj) k.problems.push(`ConfigMap ${pod.ns}/${f.name} is not defined in the shipped files`);
        else if (!f.obj.data || typeof f.obj.data[f.key] !== 'string') k.problems.push(`ConfigMap ${f.name} has no key ${f.key}`);
        else {
          k.configMap = f.obj;
          k.configKey = f.key;
          k.text = f.obj.data[f.key];
          const parsed = M.parseKvarndConfig(k.text);
          for (const d of parsed.duplicates) k.problems.push(`${d} is set twice (kvarnd refuses that)`);
          for (const l of parsed.malformed) k.problems.push(`not key = value: ${l}`);
          k.values = parsed.values;
        }
      }
      k.setting = (key) => {
        const fk = key.replace(/-/g, '_');
        if (flags.has(fk)) return flags.get(fk);
        if (k.values.has(fk)) return k.values.get(fk);
        return model.help.defaults.get(fk);
      };
      k.listen = k.setting('listen');
      const metrics = k.setting('metrics') || '';
      const m = /^(.*):([0-9]+)$/.exec(metrics);
      k.metricsHost = m ? m[1] : undefined;
      k.metricsPort = m ? parseInt(m[2], 10) : undefined;
      out.push(k);
    }
  }
  return out;
}

// Containers outside kvarnd's own that use it (KVARN_TARGET), with the kvarnd they reach.
function clientsOf(model) {
  const out = [];
  for (const pod of model.pods) {
    for (const ct of M.containers(pod)) {
      const target = M.envValue(ct.c, 'KVARN_TARGET');
      if (ct.c.name === 'kvarnd' || target === undefined) continue;
      out.push({ ct, pod, target });
    }
  }
  return out;
}

// The node path of a file inside a container that a hostPath volume holds.
function hostPathOf(ct, p) {
  const mf = M.mountFor(ct.c, p);
  if (!mf) return null;
  const vol = M.volumeNamed(ct.pod, mf.mount.name);
  if (!vol || !vol.hostPath) return null;
  return path.posix.join(vol.hostPath.path, mf.rest);
}

// Which kvarnd a client reaches: the one in its pod, else a node daemon whose socket is the
// same node path.
function kvarndFor(model, client) {
  const local = model.kvarnd.find((k) => k.pod === client.pod);
  if (local) return local;
  const p = client.target.replace(/^unix:/, '');
  const hp = hostPathOf(client.ct, p);
  if (!hp) return null;
  return model.kvarnd.find((k) => k.listen && hostPathOf(k.ct, k.listen) === hp) || null;
}

// ---------------------------------------------------------------------------------------

function checkVolumes(model, check) {
  for (const pod of model.pods) {
    const names = (pod.spec.volumes || []).map((v) => v.name);
    check.expect(new Set(names).size === names.length, pod.where, `duplicate volume names ${names}`);
    const used = new Set();
    for (const ct of M.containers(pod)) {
      const paths = new Set();
      for (const m of ct.c.volumeMounts || []) {
        check.expect(names.includes(m.name), ct.where, `mounts volume ${m.name}, which the pod does not define`);
        check.expect(!paths.has(m.mountPath), ct.where, `mounts two volumes at ${m.mountPath}`);
        paths.add(m.mountPath);
        used.add(m.name);
      }
    }
    for (const n of names) check.expect(used.has(n), pod.where, `volume ${n} is mounted by no container`);
  }
}

function checkReferences(model, check) {
  const keys = new Set();
  for (const d of model.docs) {
    const key = `${d.obj.kind}/${M.namespaceOf(d.obj)}/${M.nameOf(d.obj)}`;
    check.expect(!keys.has(key), M.describe(d), 'defined twice in the shipped files');
    keys.add(key);
    const ns = M.namespaceOf(d.obj);
    if (ns && ns !== 'default') {
      check.expect(findObject(model, 'Namespace', '', ns), M.describe(d), `namespace ${ns} is not defined in the shipped files`);
    }
  }
  const ref = (where, kind, ns, name, key, optional) => {
    const obj = findObject(model, kind, ns, name);
    if (optional && !obj) return;
    if (!check.expect(obj, where, `${kind} ${ns}/${name} is not defined in the shipped files (deploy/kubernetes or its examples/)`)) return;
    if (key !== undefined) check.expect(dataKeys(obj).has(key), where, `${kind} ${ns}/${name} has no key ${key}`);
  };
  for (const pod of model.pods) {
    const sa = pod.spec.serviceAccountName;
    if (sa && sa !== 'default') ref(pod.where, 'ServiceAccount', pod.ns, sa);
    for (const s of pod.spec.imagePullSecrets || []) ref(pod.where, 'Secret', pod.ns, s.name);
    for (const v of pod.spec.volumes || []) {
      const w = `${pod.where} volume ${v.name}`;
      const each = (kind, name, items, optional) => {
        if (items) for (const i of items) ref(w, kind, pod.ns, name, i.key, optional);
        else ref(w, kind, pod.ns, name, undefined, optional);
      };
      if (v.configMap) each('ConfigMap', v.configMap.name, v.configMap.items, v.configMap.optional);
      if (v.secret) each('Secret', v.secret.secretName, v.secret.items, v.secret.optional);
      for (const s of (v.projected && v.projected.sources) || []) {
        if (s.configMap) each('ConfigMap', s.configMap.name, s.configMap.items, s.configMap.optional);
        if (s.secret) each('Secret', s.secret.name, s.secret.items, s.secret.optional);
      }
    }
    for (const ct of M.containers(pod)) {
      for (const e of ct.c.env || []) {
        const vf = e.valueFrom || {};
        if (vf.configMapKeyRef) ref(ct.where, 'ConfigMap', pod.ns, vf.configMapKeyRef.name, vf.configMapKeyRef.key, vf.configMapKeyRef.optional);
        if (vf.secretKeyRef) ref(ct.where, 'Secret', pod.ns, vf.secretKeyRef.name, vf.secretKeyRef.key, vf.secretKeyRef.optional);
      }
      for (const e of ct.c.envFrom || []) {
        if (e.configMapRef) ref(ct.where, 'ConfigMap', pod.ns, e.configMapRef.name, undefined, e.configMapRef.optional);
        if (e.secretRef) ref(ct.where, 'Secret', pod.ns, e.secretRef.name, undefined, e.secretRef.optional);
      }
    }
  }
}

function checkConfigResolves(model, check) {
  check.expect(model.kvarnd.length > 0, 'deploy/kubernetes', 'no container named kvarnd in any workload');
  for (const k of model.kvarnd) {
    check.expect(k.problems.length === 0, k.ct.where, k.problems.join('; '));
    check.expect(k.listen && k.listen.startsWith('/'), k.ct.where, `listen '${k.listen}' is not an absolute socket path`);
  }
  for (const pod of model.pods) {
    const n = M.containers(pod).filter((ct) => ct.c.name === 'kvarnd').length;
    check.expect(n <= 1, pod.where, `${n} kvarnd containers in one pod`);
    for (const ct of M.containers(pod)) {
      if (ct.c.name === 'kvarnd' || !isKvarndImage(model, ct.c.image)) continue;
      check.expect(ct.init && !ct.sidecar, ct.where,
        'runs the kvarnd image but is not named kvarnd: only run-to-completion init containers may (helpers)');
    }
  }
}

function checkSocket(model, check) {
  for (const k of model.kvarnd) {
    if (!k.listen) continue;
    const mf = M.mountFor(k.ct.c, k.listen);
    if (!check.expect(mf, k.ct.where, `listen ${k.listen} is on no volume: the worker cannot reach it`)) continue;
    check.expect(mf.rest === path.posix.basename(k.listen), k.ct.where,
      `the socket's directory ${path.posix.dirname(k.listen)} must be the mount itself (mounted at ${mf.mount.mountPath}), so a restarted kvarnd's new socket appears to workers`);
    const vol = M.volumeNamed(k.pod, mf.mount.name) || {};
    check.expect(vol.emptyDir || vol.hostPath, k.ct.where, `socket volume ${mf.mount.name} is neither an emptyDir nor a hostPath`);
    for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
      const ex = k.ct.c[probe] && k.ct.c[probe].exec;
      if (!ex) continue;
      for (const a of ex.command.filter((x) => x.startsWith('--target='))) {
        check.expect(a === `--target=unix:${k.listen}`, `${k.ct.where} ${probe}`, `${a} is not kvarnd's listen unix:${k.listen}`);
      }
    }
  }
  const clients = clientsOf(model);
  check.expect(clients.length > 0, 'deploy/kubernetes', 'no worker sets KVARN_TARGET');
  for (const cl of clients) {
    const k = kvarndFor(model, cl);
    if (!check.expect(k, cl.ct.where, `KVARN_TARGET ${cl.target} reaches no kvarnd of the shipped files (same pod, or the node socket path)`)) continue;
    const p = cl.target.replace(/^unix:/, '');
    check.expect(cl.target.startsWith('unix:') && path.posix.basename(p) === path.posix.basename(k.listen), cl.ct.where,
      `KVARN_TARGET ${cl.target} does not name kvarnd's socket ${path.posix.basename(k.listen)}`);
    const mine = M.mountFor(cl.ct.c, p);
    if (!check.expect(mine, cl.ct.where, `KVARN_TARGET ${cl.target} is on none of its volumes`)) continue;
    if (k.pod === cl.pod) {
      const theirs = M.mountFor(k.ct.c, k.listen);
      check.expect(theirs && theirs.mount.name === mine.mount.name && theirs.mount.mountPath === mine.mount.mountPath, cl.ct.where,
        `mounts the socket volume differently from kvarnd (${mine.mount.name} at ${mine.mount.mountPath})`);
      check.expect(cl.target === `unix:${k.listen}`, cl.ct.where, `KVARN_TARGET ${cl.target} is not unix:${k.listen}`);
    } else {
      const vol = M.volumeNamed(cl.pod, mine.mount.name);
      check.expect(vol && vol.hostPath && vol.hostPath.type === 'Directory', cl.ct.where,
        'the node socket directory is mounted with hostPath type Directory (a worker must not create it root-owned before kvarnd prepared it)');
    }
  }
}

function checkUid(model, check) {
  const want = model.dockerfile && model.dockerfile.user;
  check.expect(want && Number.isInteger(want.uid) && want.uid > 0, 'deploy/docker/Dockerfile', 'no numeric non-root USER uid:gid');
  if (!want) return;
  for (const k of model.kvarnd) {
    const s = M.effectiveSecurity(k.ct);
    check.expect(s.runAsUser === want.uid && s.runAsGroup === want.gid, k.ct.where,
      `runs as ${s.runAsUser}:${s.runAsGroup}, not the image's USER ${want.uid}:${want.gid}`);
    const mode = k.setting('socket_mode');
    check.expect(mode === '0600' || mode === '600', k.ct.where, `socket_mode ${mode}: the manifests rely on 0600 (same uid only)`);
  }
  for (const cl of clientsOf(model)) {
    const k = kvarndFor(model, cl);
    if (!k) continue;
    const a = M.effectiveSecurity(cl.ct);
    const b = M.effectiveSecurity(k.ct);
    check.expect(a.runAsUser === b.runAsUser && a.runAsUser !== undefined, cl.ct.where,
      `runs as uid ${a.runAsUser} but kvarnd as ${b.runAsUser}: its sockets are mode 0600`);
  }
  for (const pod of model.pods) {
    for (const ct of M.containers(pod)) {
      if (ct.c.name === 'kvarnd' || !isKvarndImage(model, ct.c.image) || exceptionsOf(pod).has(ct.c.name)) continue;
      const s = M.effectiveSecurity(ct);
      check.expect(s.runAsUser === want.uid, ct.where, `a helper of the kvarnd image runs as ${s.runAsUser}, not ${want.uid}`);
    }
  }
}

function checkPorts(model, check) {
  for (const k of model.kvarnd) {
    const w = k.ct.where;
    if (!check.expect(Number.isInteger(k.metricsPort) && k.metricsPort > 0, w, `metrics '${k.setting('metrics')}' has no port`)) continue;
    check.expect(!/^(127\.|localhost$|\[?::1\]?$)/.test(k.metricsHost), w,
      `metrics binds ${k.metricsHost}: the kubelet's HTTP probes and Prometheus reach the pod IP`);
    const named = (k.ct.c.ports || []).find((p) => p.name === 'metrics');
    check.expect(named && named.containerPort === k.metricsPort, w, `no container port named metrics = ${k.metricsPort}`);
    for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
      const hg = k.ct.c[probe] && k.ct.c[probe].httpGet;
      if (!hg) continue;
      check.expect(M.resolvePort(k.ct.c, hg.port) === k.metricsPort, `${w} ${probe}`, `port ${hg.port} is not the metrics port ${k.metricsPort}`);
    }
    const a = k.pod.annotations;
    check.expect(a['prometheus.io/scrape'] === 'true', k.pod.where, 'pod with kvarnd lacks prometheus.io/scrape: "true"');
    check.expect(a['prometheus.io/port'] === String(k.metricsPort), k.pod.where, `prometheus.io/port ${a['prometheus.io/port']} is not ${k.metricsPort}`);
    check.expect(a['prometheus.io/path'] === '/metrics', k.pod.where, `prometheus.io/path ${a['prometheus.io/path']} is not /metrics`);
  }
  for (const pod of model.pods) {
    if (model.kvarnd.some((k) => k.pod === pod)) continue;
    const a = pod.annotations;
    check.expect(a['prometheus.io/scrape'] !== 'true', pod.where, 'asks to be scraped but runs no kvarnd');
  }
  // The kvarnd container a port of a pod resolves to must be the metrics port.
  const metricsAt = (pod, port) => {
    const k = model.kvarnd.find((x) => x.pod === pod);
    return k && M.resolvePort(k.ct.c, port) === k.metricsPort && (typeof port === 'number' || (k.ct.c.ports || []).some((p) => p.name === port));
  };
  const services = model.docs.filter((d) => d.obj.kind === 'Service');
  for (const d of services) {
    const s = d.obj;
    const selected = model.pods.filter((p) => p.ns === M.namespaceOf(s) && M.selectorMatches({ matchLabels: (s.spec || {}).selector }, p.labels));
    if (!check.expect(selected.length > 0, M.describe(d), 'its selector matches no shipped pod')) continue;
    for (const sp of s.spec.ports || []) {
      for (const p of selected) {
        check.expect(metricsAt(p, sp.targetPort ?? sp.port), M.describe(d), `port ${sp.name} (targetPort ${sp.targetPort}) is not kvarnd's metrics port in ${p.where}`);
      }
    }
  }
  const inScope = (monitor, ns) => {
    const sel = monitor.spec.namespaceSelector || {};
    if (sel.any) return true;
    if (sel.matchNames) return sel.matchNames.includes(ns);
    return ns === M.namespaceOf(monitor);
  };
  for (const d of model.docs.filter((x) => x.obj.kind === 'ServiceMonitor')) {
    const sm = d.obj;
    const svcs = services.filter((s) => inScope(sm, M.namespaceOf(s.obj)) && M.selectorMatches(sm.spec.selector, (s.obj.metadata || {}).labels || {}));
    if (!check.expect(svcs.length > 0, M.describe(d), 'its selector matches no shipped Service')) continue;
    for (const ep of sm.spec.endpoints || []) {
      check.expect((ep.path || '/metrics') === '/metrics', M.describe(d), `path ${ep.path} is not /metrics`);
      for (const s of svcs) {
        const sp = (s.obj.spec.ports || []).find((p) => p.name === ep.port);
        check.expect(sp, M.describe(d), `endpoint port ${ep.port} is no named port of Service ${M.nameOf(s.obj)}`);
      }
    }
  }
  for (const d of model.docs.filter((x) => x.obj.kind === 'PodMonitor')) {
    const pm = d.obj;
    const selected = model.pods.filter((p) => inScope(pm, p.ns) && M.selectorMatches(pm.spec.selector, p.labels));
    if (!check.expect(selected.length > 0, M.describe(d), 'its selector matches no shipped pod')) continue;
    for (const ep of pm.spec.podMetricsEndpoints || []) {
      check.expect((ep.path || '/metrics') === '/metrics', M.describe(d), `path ${ep.path} is not /metrics`);
      for (const p of selected) {
        check.expect(metricsAt(p, ep.port), M.describe(d), `port ${ep.port} is not kvarnd's metrics port in ${p.where}`);
      }
    }
  }
}

function checkProbes(model, check) {
  for (const k of model.kvarnd) {
    const c = k.ct.c;
    const w = k.ct.where;
    const live = c.livenessProbe && c.livenessProbe.httpGet;
    check.expect(live && live.path === '/healthz', w, 'livenessProbe is not httpGet /healthz');
    const ready = c.readinessProbe && c.readinessProbe.httpGet;
    check.expect(ready && ready.path === '/readyz', w, 'readinessProbe is not httpGet /readyz (/healthz stays 200 while draining)');
    const st = c.startupProbe && c.startupProbe.exec;
    if (!check.expect(st, w, 'no exec startupProbe (kvarnctl health): nothing makes the worker wait until kvarnd serves')) continue;
    const cmd = st.command || [];
    check.expect(path.posix.basename(cmd[0] || '') === 'kvarnctl' && cmd[1] === 'health', w, `startupProbe runs ${cmd.slice(0, 2).join(' ')}, not kvarnctl health`);
    const t = cmd.find((a) => a.startsWith('--timeout='));
    const ms = t ? parseDuration(t.slice('--timeout='.length)) : 1000;
    const limit = (c.startupProbe.timeoutSeconds || 1) * 1000;
    check.expect(ms < limit, w, `kvarnctl health --timeout ${ms} ms is not below the probe's timeoutSeconds (${limit} ms)`);
    for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
      check.expect(!(c[probe] && c[probe].grpc), w, `${probe} uses the kubelet's grpc probe, which dials the pod IP and cannot reach kvarnd's Unix socket`);
    }
  }
}

function parseDuration(s) {
  const m = /^([0-9.]+)(ms|s|m)?$/.exec(s);
  if (!m) return NaN;
  return parseFloat(m[1]) * ({ ms: 1, s: 1000, m: 60000 }[m[2] || 's']);
}

function exceptionsOf(pod) {
  const text = pod.annotations['kvarn.io/security-exceptions'] || '';
  const out = new Map();
  for (const entry of text.split(';')) {
    const m = /^\s*([a-z0-9-]+):\s*([\s\S]*)$/.exec(entry);
    if (m) out.set(m[1], m[2]);
  }
  return out;
}

function commentBefore(ydoc, yamlPath, key) {
  const node = ydoc.getIn(yamlPath, true);
  if (!node || !node.items) return '';
  const pair = node.items.find((p) => p.key && p.key.value === key);
  return (pair && pair.key.commentBefore) || '';
}

function checkSecurity(model, check) {
  for (const pod of model.pods) {
    const ex = exceptionsOf(pod);
    const names = new Set(M.containers(pod).map((ct) => ct.c.name));
    for (const n of ex.keys()) check.expect(names.has(n), pod.where, `security exception for ${n}, which is no container of the pod`);
    check.expect(pod.spec.hostIPC !== true, pod.where, 'hostIPC: the pool travels as descriptors, no pod needs the host IPC namespace');
    check.expect(pod.spec.hostPID !== true, pod.where, 'hostPID: no pod needs the host PID namespace (the node kvarnd lends host memory to peers in other PID namespaces)');
    check.expect(pod.spec.hostNetwork !== true, pod.where, 'hostNetwork is not needed');
    for (const ct of M.containers(pod)) {
      const s = M.effectiveSecurity(ct);
      const w = ct.where;
      const drop = s.capabilities.drop || [];
      const add = s.capabilities.add || [];
      check.expect(s.allowPrivilegeEscalation === false, w, 'allowPrivilegeEscalation is not false');
      check.expect(s.readOnlyRootFilesystem === true, w, 'readOnlyRootFilesystem is not true');
      check.expect(drop.includes('ALL'), w, 'capabilities do not drop ALL');
      check.expect(s.privileged !== true, w, 'privileged');
      check.expect(s.seccompProfile && s.seccompProfile.type === 'RuntimeDefault', w, 'seccompProfile is not RuntimeDefault');
      if (ex.has(ct.c.name)) {
        const reason = ex.get(ct.c.name);
        check.expect(ct.init && !ct.sidecar, w, 'a security exception is allowed only for a run-to-completion init container');
        for (const cap of add) check.expect(new RegExp(`\\b(CAP_)?${cap}\\b`).test(reason), w, `adds ${cap}, which its exception does not name`);
        check.expect(/security exception/i.test(commentBefore(ct.pod.doc.ydoc, ct.yamlPath, 'securityContext')), w,
          'a security exception needs a comment beside its securityContext saying why');
      } else {
        check.expect(s.runAsNonRoot === true, w, 'runAsNonRoot is not true');
        check.expect(Number.isInteger(s.runAsUser) && s.runAsUser > 0, w, `runAsUser ${s.runAsUser} is not a non-root uid`);
        check.expect(Number.isInteger(s.runAsGroup) && s.runAsGroup > 0, w, `runAsGroup ${s.runAsGroup} is not a non-root gid`);
        check.expect(add.length === 0, w, `adds capabilities ${add} without a documented exception`);
      }
    }
  }
}

function checkTopology(model, check) {
  const clients = clientsOf(model);
  for (const k of model.kvarnd) {
    const spec = k.pod.spec;
    const w = k.ct.where;
    const local = clients.filter((cl) => cl.pod === k.pod);
    if (local.length > 0) {
      check.expect(k.ct.init && k.ct.sidecar, w, 'kvarnd beside a worker must be a native sidecar: an init container with restartPolicy Always');
      check.expect(k.ct.c.startupProbe, w, 'a native sidecar needs a startupProbe, or the worker starts before kvarnd serves');
      check.expect(spec.shareProcessNamespace === true, k.pod.where,
        'shareProcessNamespace must be true: the CUDA backend lends memory only to a process whose pid it sees (legacy CUDA IPC handles do not open across PID namespaces), and a visible pid binds a session to one worker process');
      check.expect(spec.hostPID !== true, k.pod.where, 'a sidecar pod needs no hostPID');
      for (const cl of local) check.expect(!cl.ct.init, cl.ct.where, 'a worker must be a main container, started after the kvarnd sidecar');
    } else {
      check.expect(k.pod.workload.kind === 'DaemonSet', k.pod.where, 'kvarnd without a worker beside it is the node daemon: a DaemonSet');
      check.expect(!k.ct.init, w, 'the node daemon is a main container');
      check.expect(spec.hostPID !== true && spec.hostIPC !== true, k.pod.where,
        'the node daemon runs without hostPID and hostIPC: its workers are in their own pods\' namespaces, the pool travels as descriptors');
      const ru = ((k.pod.workload.spec || {}).updateStrategy || {}).rollingUpdate || {};
      check.expect(!ru.maxSurge || ru.maxSurge === '0%', k.pod.where, `maxSurge ${ru.maxSurge}: two kvarnd on one node would contend for the socket's lock`);
    }
  }
  for (const cl of clients) {
    if (model.kvarnd.some((k) => k.pod === cl.pod)) continue;
    check.expect(cl.pod.spec.hostPID !== true, cl.pod.where, 'a worker pod needs no hostPID');
    check.expect(cl.pod.spec.hostIPC !== true, cl.pod.where, 'a worker pod needs no hostIPC');
  }
}

function checkGrace(model, check) {
  for (const k of model.kvarnd) {
    const drain = parseInt(k.setting('drain_ms'), 10);
    if (!check.expect(Number.isInteger(drain), k.ct.where, `drain_ms '${k.setting('drain_ms')}' unknown`)) continue;
    let preStop = 0;
    for (const ct of M.containers(k.pod)) {
      const ps = ct.c.lifecycle && ct.c.lifecycle.preStop;
      if (ps && ps.sleep) preStop = Math.max(preStop, ps.sleep.seconds * 1000);
    }
    const tgps = k.pod.spec.terminationGracePeriodSeconds ?? 30;
    check.expect(tgps * 1000 >= drain + preStop + GRACE_MARGIN_MS, k.pod.where,
      `terminationGracePeriodSeconds ${tgps} s does not cover drain_ms ${drain} + preStop ${preStop} ms + ${GRACE_MARGIN_MS} ms margin`);
  }
}

function checkMemory(model, check) {
  for (const k of model.kvarnd) {
    const w = k.ct.where;
    const figures = k.started || k.checked;
    const capacity = figures ? figures.capacity_bytes : M.parseBytes(k.setting('capacity') || '');
    const grpc = M.parseBytes(k.setting('grpc_memory') || '');
    if (!check.expect(capacity > 0 && grpc > 0, w, `capacity ${capacity} or grpc_memory ${grpc} unknown`)) continue;
    const res = k.ct.c.resources || {};
    const limit = M.parseQuantity((res.limits || {}).memory);
    const request = M.parseQuantity((res.requests || {}).memory);
    const need = capacity + grpc + PROCESS_OVERHEAD;
    check.expect(limit >= need, w, `limits.memory ${(res.limits || {}).memory} is below capacity ${M.formatBytes(capacity)} + grpc_memory ${M.formatBytes(grpc)} + ${M.formatBytes(PROCESS_OVERHEAD)}`);
    check.expect(request === limit, w, 'requests.memory differs from limits.memory: the pool is resident memory, reserve all of it');
    const backend = k.setting('backend');
    if (backend === 'cuda') continue;
    const tail = figures ? figures.tail_bytes : undefined;
    for (const cl of clientsOf(model).filter((x) => x.pod === k.pod)) {
      const req = M.parseQuantity(((cl.ct.c.resources || {}).requests || {}).memory);
      if (!check.expect(tail > 0, w, 'tail-slot budget unknown (kvarnd --check_config gave none)')) continue;
      check.expect(req >= tail, cl.ct.where, `requests.memory is below the tail slots it writes (${M.formatBytes(tail)}, charged to the worker)`);
    }
  }
}

function checkGpu(model, check) {
  const clients = clientsOf(model);
  for (const k of model.kvarnd) {
    const w = k.ct.where;
    check.expect(M.containerRequest(k.ct.c, GPU) === 0, w, `kvarnd asks for ${GPU}: it would get a GPU of its own, not the worker's`);
    const local = clients.filter((cl) => cl.pod === k.pod);
    if (local.length === 0) {
      check.expect(k.setting('backend') === 'host', w, `the node daemon's backend is ${k.setting('backend')}: a GPU pool cannot be shared across pods (legacy CUDA IPC, PID namespaces)`);
      check.expect(!((k.ct.c.resources || {}).claims || []).length, w, 'the node daemon claims a device');
      continue;
    }
    const wanted = local.reduce((s, cl) => s + M.containerRequest(cl.ct.c, GPU), 0);
    const claims = k.pod.spec.resourceClaims || [];
    if (claims.length > 0) {
      const names = (c) => new Set(((c.resources || {}).claims || []).map((x) => x.name));
      const mine = names(k.ct.c);
      for (const cl of local) {
        check.expect([...names(cl.ct.c)].some((n) => mine.has(n)), cl.ct.where, 'the worker and kvarnd share no resource claim');
      }
      continue;
    }
    if (wanted === 0) continue;
    const all = M.containers(k.pod);
    const helper = all.slice(0, all.findIndex((ct) => ct.c === k.ct.c))
      .find((ct) => ct.init && !ct.sidecar && M.containerRequest(ct.c, GPU) === wanted);
    check.expect(helper, w, `the worker asks for ${wanted} ${GPU}, and no init container before kvarnd takes exactly that many to hand over (the kubelet reuses init containers' devices)`);
    if (helper) {
      const sock = M.mountFor(k.ct.c, k.listen);
      check.expect(sock && (helper.c.volumeMounts || []).some((m) => m.name === sock.mount.name), helper.where,
        'the GPU hand-over container must write the device id into the socket volume kvarnd reads');
    }
    check.expect(M.envValue(k.ct.c, 'NVIDIA_VISIBLE_DEVICES') === 'all', w, 'kvarnd needs NVIDIA_VISIBLE_DEVICES=all to see the worker\'s device without a device-plugin allocation');
    check.expect(M.effectivePodRequest(k.pod, GPU) === wanted, k.pod.where, `the pod takes ${M.effectivePodRequest(k.pod, GPU)} ${GPU}, not the worker's ${wanted}`);
  }
}

function checkImages(model, check) {
  const want = kvarndImage(model);
  check.expect(want, 'deploy/docker/Dockerfile', 'names no image tag (docker build ... -t IMAGE)');
  for (const pod of model.pods) {
    for (const ct of M.containers(pod)) {
      if (ct.c.name !== 'kvarnd' && !isKvarndImage(model, ct.c.image)) continue;
      check.expect(ct.c.image === want, ct.where, `image ${ct.c.image} is not the one deploy/docker/Dockerfile builds (${want})`);
    }
  }
}

function parseTenants(text) {
  const out = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.replace(/(^|\s)#.*$/, '').trim();
    if (!line) continue;
    const [name, ...fields] = line.split(/\s+/);
    const h = fields.find((f) => f.startsWith('token_sha256='));
    out.set(name, h ? h.slice('token_sha256='.length) : '');
  }
  return out;
}

// The tenants file a kvarnd reads: a file of a Secret volume mounted in its own container.
function tenantsSource(model, k) {
  const file = k.setting('tenants_file');
  if (!file) return null;
  const f = projectedFile(model, k.ct, file);
  return f ? { file, ...f, ct: k.ct } : { file };
}

// The tenants file as kvarnd finds it in its container. The kubelet writes a Secret volume's
// files as root, mode defaultMode (or the item's mode); with the pod's fsGroup it gives them that
// group and adds group read (0440), as for every read-only volume it manages.
function secretFileAsSeen(pod, src) {
  const podSc = pod.spec.securityContext || {};
  const declared = src.mode === undefined ? 0o644 : src.mode;
  const fsGroup = podSc.fsGroup;
  return { uid: 0, gid: fsGroup === undefined ? 0 : fsGroup, mode: fsGroup === undefined ? declared : (declared | 0o440) };
}

function checkTenants(model, check) {
  let any = false;
  for (const k of model.kvarnd) {
    const src = tenantsSource(model, k);
    if (!src) continue;
    any = true;
    const w = k.ct.where;
    if (!check.expect(src.kind === 'Secret' && src.obj && src.key !== undefined, w,
      `tenants_file ${src.file} is no file of a shipped Secret mounted in kvarnd's container`)) continue;
    check.expect(src.mount.readOnly === true, w, `the tenants Secret volume ${src.volume.name} is mounted writable`);
    // kvarnd's rule for credential files (CheckSecretFile in daemon/service/server.cc): owner root
    // or kvarnd; nothing for others; the group may only read, and only when it is one of kvarnd's.
    const seen = secretFileAsSeen(k.pod, src);
    const sec = M.effectiveSecurity(k.ct);
    const podSc = k.pod.spec.securityContext || {};
    const groups = new Set([sec.runAsGroup, podSc.fsGroup, ...(podSc.supplementalGroups || [])].filter((g) => g !== undefined));
    const ownGroup = groups.has(seen.gid);
    const mode = `0${seen.mode.toString(8)}`;
    check.expect((seen.mode & 0o037) === 0 && ((seen.mode & 0o040) === 0 || ownGroup), `${w} volume ${src.volume.name}`,
      `the tenants file is root:${seen.gid} mode ${mode} in kvarnd's container: kvarnd refuses a credentials file that others, or a group not its own, can read`);
    const readable = sec.runAsUser === 0 || (ownGroup && (seen.mode & 0o040) !== 0) || (seen.mode & 0o004) !== 0;
    check.expect(readable, `${w} volume ${src.volume.name}`,
      `kvarnd (uid ${sec.runAsUser}, groups ${[...groups].join(',')}) cannot read the tenants file, root:${seen.gid} mode ${mode}: give the pod an fsGroup of kvarnd's`);
    const tenants = parseTenants(secretValue(src.obj, src.key) || '');
    check.expect(tenants.size > 0, w, 'the tenants Secret lists no tenant');
    for (const cl of clientsOf(model).filter((x) => kvarndFor(model, x) === k)) {
      const name = M.envValue(cl.ct.c, 'KVARN_TENANT');
      const tokenFile = M.envValue(cl.ct.c, 'KVARN_TENANT_TOKEN_FILE');
      if (!check.expect(name && tokenFile, cl.ct.where, 'kvarnd authenticates tenants: set KVARN_TENANT and KVARN_TENANT_TOKEN_FILE')) continue;
      const f = projectedFile(model, cl.ct, tokenFile);
      if (!check.expect(f && f.kind === 'Secret' && f.obj, cl.ct.where, `token file ${tokenFile} is not from a shipped Secret`)) continue;
      const tok = secretFileAsSeen(cl.pod, f);
      const wsec = M.effectiveSecurity(cl.ct);
      check.expect((tok.mode & 0o007) === 0, cl.ct.where, `token file mode 0${tok.mode.toString(8)} lets every uid of the node's pods read it`);
      check.expect(wsec.runAsUser === 0 || (tok.mode & 0o004) !== 0 || ((tok.mode & 0o040) !== 0 && tok.gid !== 0 && [wsec.runAsGroup, (cl.pod.spec.securityContext || {}).fsGroup].includes(tok.gid)),
        cl.ct.where, `the worker (uid ${wsec.runAsUser}) cannot read its token file, root:${tok.gid} mode 0${tok.mode.toString(8)}`);
      const token = (secretValue(f.obj, f.key) || '').split('\n')[0];
      const hash = crypto.createHash('sha256').update(token).digest('hex');
      check.expect(tenants.get(name) === hash, cl.ct.where, `the SHA-256 of its token is not tenant ${name}'s token_sha256 in the tenants Secret`);
    }
  }
  check.expect(any, 'deploy/kubernetes', 'no kvarnd reads a tenants file from a Secret');
}

const CHECKS = [
  ['volumes', 'every mounted volume exists in its pod, and every volume is mounted', checkVolumes],
  ['references', 'ConfigMap, Secret, ServiceAccount and Namespace references resolve in the shipped files', checkReferences],
  ['kvarnd-config', 'every kvarnd container runs a config file from a shipped ConfigMap', checkConfigResolves],
  ['socket', 'the socket directory is shared: listen, KVARN_TARGET, mounts and probe targets agree', checkSocket],
  ['uid', 'kvarnd runs as the image\'s numeric USER, and its workers as the same uid', checkUid],
  ['ports', 'probes, annotations, Service, ServiceMonitor and PodMonitor use the config\'s metrics port', checkPorts],
  ['probes', 'liveness /healthz, readiness /readyz, startup kvarnctl health (no kubelet grpc probe)', checkProbes],
  ['security', 'hardened securityContext everywhere; exceptions only for init containers, documented', checkSecurity],
  ['topology', 'native sidecar with restartPolicy Always and a shared PID namespace; node daemon without hostPID/hostIPC', checkTopology],
  ['grace', 'terminationGracePeriodSeconds exceeds drain_ms and preStop with margin', checkGrace],
  ['memory', 'memory limits cover capacity, gRPC quota and the process; workers request their tail slots', checkMemory],
  ['gpu', 'kvarnd takes no GPU of its own; it sees the worker\'s device', checkGpu],
  ['images', 'kvarnd containers use the image deploy/docker/Dockerfile builds', checkImages],
  ['tenants', 'tenants file from a Secret that kvarnd can read and accepts (fsGroup, mode); workers\' tokens match its hashes', checkTenants],
  ['job-label', 'the ServiceMonitor and PodMonitor targets get job="kvarnd" (the rules) and the dashboard\'s labels', checkJobLabel],
];

function runStaticChecks(model) {
  return CHECKS.map(([id, title, fn]) => {
    const c = new Check(id, title);
    try {
      fn(model, c);
    } catch (e) {
      c.failures.push(`the check threw: ${e.stack || e}`);
    }
    if (c.assertions === 0) c.failures.push('asserted nothing: it found nothing to check');
    return c;
  });
}

module.exports = {
  Check, CHECKS, runStaticChecks, resolveKvarnd, clientsOf, kvarndFor, tenantsSource, secretValue, projectedFile,
  secretFileAsSeen,
};
