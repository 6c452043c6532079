'use strict';
// The labels Prometheus gives a kvarnd target found through the ServiceMonitor and PodMonitor:
// the labels prometheus-operator generates (job, namespace, service, pod, container, endpoint,
// instance), then the monitor's relabelings and metricRelabelings with Prometheus' relabel
// semantics. The result must carry the job that deploy/prometheus/kvarnd-rules.yml selects and
// the labels deploy/grafana/kvarnd-dashboard.json's variables read.

const M = require('./model');

const RULES = 'deploy/prometheus/kvarnd-rules.yml';
const DASHBOARD = 'deploy/grafana/kvarnd-dashboard.json';

function sanitize(name) {
  return name.replace(/[^a-zA-Z0-9_]/g, '_');
}

// Go's regexp.Expand for $1, ${1}, $name and ${name}.
function expand(template, match) {
  return template.replace(/\$(?:\{([A-Za-z0-9_]+)\}|([0-9]+)|([A-Za-z_][A-Za-z0-9_]*))/g, (all, braced, num, name) => {
    const key = braced ?? num ?? name;
    if (/^[0-9]+$/.test(key)) return match[parseInt(key, 10)] ?? '';
    return (match.groups && match.groups[key]) ?? '';
  });
}

// Applies relabel rules (prometheus-operator field names) to labels; null when dropped.
function relabel(input, rules) {
  const labels = { ...input };
  for (const r of rules || []) {
    const action = String(r.action || 'replace').toLowerCase();
    const sep = r.separator ?? ';';
    const value = (r.sourceLabels || []).map((l) => labels[l] ?? '').join(sep);
    const re = new RegExp(`^(?:${r.regex ?? '(.*)'})$`);
    const target = r.targetLabel;
    switch (action) {
      case 'replace': {
        const m = re.exec(value);
        if (!m) break;
        const t = expand(target, m);
        const v = expand(r.replacement ?? '$1', m);
        if (v === '') delete labels[t];
        else labels[t] = v;
        break;
      }
      case 'lowercase': labels[target] = value.toLowerCase(); break;
      case 'uppercase': labels[target] = value.toUpperCase(); break;
      case 'keep': if (!re.test(value)) return null; break;
      case 'drop': if (re.test(value)) return null; break;
      case 'keepequal': if (value !== (labels[target] ?? '')) return null; break;
      case 'dropequal': if (value === (labels[target] ?? '')) return null; break;
      case 'labeldrop': for (const k of Object.keys(labels)) if (re.test(k)) delete labels[k]; break;
      case 'labelkeep': for (const k of Object.keys(labels)) if (!re.test(k)) delete labels[k]; break;
      case 'labelmap':
        for (const k of Object.keys(labels)) {
          const m = re.exec(k);
          if (m) labels[expand(r.replacement ?? '$1', m)] = labels[k];
        }
        break;
      case 'hashmod': labels[target] = '0'; break;
      default: throw new Error(`relabel action ${r.action} is not modelled`);
    }
  }
  return labels;
}

// The operator's labels for one target (before the monitor's relabelings).
function targetLabels(kind, monitor, pod, container, portName, service) {
  const labels = {
    __address__: `10.0.0.1:${portName}`,
    __metrics_path__: '/metrics',
    __scheme__: 'http',
    __meta_kubernetes_namespace: pod.ns,
    __meta_kubernetes_pod_name: `${M.nameOf(pod.workload)}-pod`,
    __meta_kubernetes_pod_node_name: 'node-1',
    __meta_kubernetes_pod_container_name: container,
    __meta_kubernetes_pod_container_port_name: portName,
  };
  for (const [k, v] of Object.entries(pod.labels)) labels[`__meta_kubernetes_pod_label_${sanitize(k)}`] = v;
  const jobLabel = monitor.spec.jobLabel;
  let job;
  if (kind === 'ServiceMonitor') {
    const svcLabels = (service.metadata || {}).labels || {};
    for (const [k, v] of Object.entries(svcLabels)) labels[`__meta_kubernetes_service_label_${sanitize(k)}`] = v;
    labels.__meta_kubernetes_service_name = M.nameOf(service);
    job = (jobLabel && svcLabels[jobLabel]) || M.nameOf(service);
  } else {
    job = (jobLabel && pod.labels[jobLabel]) || `${M.namespaceOf(monitor)}/${M.nameOf(monitor)}`;
  }
  Object.assign(labels, {
    instance: labels.__address__,
    job,
    namespace: pod.ns,
    pod: labels.__meta_kubernetes_pod_name,
    container,
    endpoint: portName,
  });
  if (kind === 'ServiceMonitor') labels.service = M.nameOf(service);
  return labels;
}

// What the rules and the dashboard need: the job values the rules select, the labels the
// dashboard's variables read.
function expectations(inputs) {
  const rules = inputs.text(RULES) || '';
  const jobs = new Set([...rules.matchAll(/\bjob\s*=~?\s*"([^"]*)"/g)].map((m) => m[1]));
  const labels = new Set();
  let dash = null;
  try {
    dash = JSON.parse(inputs.text(DASHBOARD) || 'null');
  } catch (e) {
    dash = null;
  }
  for (const v of ((dash && dash.templating) || {}).list || []) {
    const q = typeof v.query === 'string' ? v.query : (v.query && v.query.query) || v.definition || '';
    // label_values(SELECTOR, LABEL): the last argument (the selector may hold commas).
    const m = /label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$/.exec(q.trim());
    if (m) labels.add(m[2]);
  }
  return { jobs, labels, dashboardRead: dash !== null };
}

function containerWithPort(pod, port) {
  for (const ct of M.containers(pod)) {
    for (const p of ct.c.ports || []) if (p.name === port || p.containerPort === port) return { ct, p };
  }
  return null;
}

function checkJobLabel(model, check) {
  const want = expectations(model.inputs);
  check.expect(want.jobs.size === 1, RULES, `the rules select ${want.jobs.size} job values (${[...want.jobs].join(', ')}), not one`);
  check.expect(want.dashboardRead && want.labels.size > 0, DASHBOARD, 'unreadable, or no label_values() variable');
  const job = [...want.jobs][0];
  const seen = { count: 0 };
  const judge = (where, labels) => {
    seen.count += 1;
    if (!check.expect(labels, where, 'its relabelings drop the kvarnd target')) return;
    check.expect(labels.job === job, where, `job is "${labels.job}", the rules select job="${job}"`);
    for (const l of want.labels) check.expect(labels[l], where, `label ${l}, which the dashboard's variables read, is missing`);
  };
  const apply = (where, base, ep) => {
    try {
      const t = relabel(base, ep.relabelings);
      if (!t) return judge(where, null);
      for (const k of Object.keys(t)) if (k.startsWith('__')) delete t[k];
      return judge(where, relabel(t, ep.metricRelabelings));
    } catch (e) {
      return check.expect(false, where, e.message);
    }
  };
  const services = model.docs.filter((d) => d.obj.kind === 'Service');
  for (const d of model.docs.filter((x) => x.obj.kind === 'ServiceMonitor')) {
    const sm = d.obj;
    const sel = sm.spec.namespaceSelector || {};
    for (const s of services) {
      const ns = M.namespaceOf(s.obj);
      const inScope = sel.any || (sel.matchNames ? sel.matchNames.includes(ns) : ns === M.namespaceOf(sm));
      if (!inScope || !M.selectorMatches(sm.spec.selector, (s.obj.metadata || {}).labels || {})) continue;
      const pods = model.pods.filter((p) => p.ns === ns && M.selectorMatches({ matchLabels: s.obj.spec.selector }, p.labels));
      for (const ep of sm.spec.endpoints || []) {
        const sp = (s.obj.spec.ports || []).find((p) => p.name === ep.port);
        for (const pod of pods) {
          const cp = sp && containerWithPort(pod, sp.targetPort ?? sp.port);
          if (!cp) continue;
          apply(`${M.describe(d)} endpoint ${ep.port} -> ${pod.where}`, targetLabels('ServiceMonitor', sm, pod, cp.ct.c.name, ep.port, s.obj), ep);
        }
      }
    }
  }
  for (const d of model.docs.filter((x) => x.obj.kind === 'PodMonitor')) {
    const pm = d.obj;
    const sel = pm.spec.namespaceSelector || {};
    for (const pod of model.pods) {
      const inScope = sel.any || (sel.matchNames ? sel.matchNames.includes(pod.ns) : pod.ns === M.namespaceOf(pm));
      if (!inScope || !M.selectorMatches(pm.spec.selector, pod.labels)) continue;
      for (const ep of pm.spec.podMetricsEndpoints || []) {
        const cp = containerWithPort(pod, ep.port);
        if (!cp) continue;
        apply(`${M.describe(d)} endpoint ${ep.port} -> ${pod.where}`, targetLabels('PodMonitor', pm, pod, cp.ct.c.name, ep.port), ep);
      }
    }
  }
  const monitors = model.docs.filter((x) => ['ServiceMonitor', 'PodMonitor'].includes(x.obj.kind)).length;
  check.expect(monitors > 0 && seen.count >= monitors, 'deploy/kubernetes', `${monitors} monitors gave ${seen.count} kvarnd targets: every monitor must find one`);
}

module.exports = { relabel, expand, targetLabels, checkJobLabel };
