'use strict';
// The real kvarnd on every configuration the manifests ship. runConfigChecks: `kvarnd
// --check_config` on the ConfigMap's file with the container's own flags, exactly as shipped,
// and what it says of the pool. runDaemonChecks: a start (listen, metrics and the tenants file
// moved to a temporary directory), the manifest's own probes against it, a drain and a clean
// exit. Every wait is a condition polled until a deadline.

const { spawn, spawnSync } = require('child_process');
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');
const { Check, tenantsSource, secretValue, clientsOf, kvarndFor, projectedFile, secretFileAsSeen } = require('./checks');
const M = require('./model');

const START_DEADLINE_MS = 30000;
const PROBE_DEADLINE_MS = 10000;
const POLL_MS = 50;

// `kvarnd --help`: which settings exist and their defaults.
function readHelp(kvarnd) {
  const r = spawnSync(kvarnd, ['--help'], { encoding: 'utf8', timeout: 10000 });
  const flags = new Set();
  const defaults = new Map();
  if (r.status !== 0) return { ok: false, error: `${kvarnd} --help: ${r.error || r.stderr || r.status}`, flags, defaults };
  const lines = r.stdout.split('\n');
  for (let i = 0; i < lines.length; ++i) {
    const m = /^ {2}--([a-z0-9_]+)$/.exec(lines[i]);
    if (!m) continue;
    flags.add(m[1]);
    const d = /\(default ([^)]*)\)/.exec(lines[i + 1] || '');
    if (!d) continue;
    const v = d[1].split(/[:,]\s|\s/)[0];
    defaults.set(m[1], v === 'none' || v === 'empty' ? '' : v);
  }
  return { ok: true, flags, defaults };
}

function fieldsOf(line) {
  const out = {};
  for (const m of line.matchAll(/([a-z_]+)=("(?:[^"\\]|\\.)*"|\S+)/g)) {
    out[m[1]] = m[2].startsWith('"') ? m[2].slice(1, -1).replace(/\\(.)/g, '$1') : m[2];
  }
  return out;
}

function until(deadlineMs, attempt) {
  const end = Date.now() + deadlineMs;
  return new Promise((resolve) => {
    const step = async () => {
      const r = await attempt();
      if (r.done || Date.now() >= end) resolve(r);
      else setTimeout(step, POLL_MS);
    };
    step();
  });
}

function startKvarnd(bin, args, as) {
  return new Promise((resolve) => {
    const child = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'], ...(as || {}) });
    const state = { child, log: '' };
    let settled = false;
    const settle = (r) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(Object.assign(state, r));
    };
    const timer = setTimeout(() => settle({ ok: false, reason: `no event=kvarnd_started within ${START_DEADLINE_MS} ms` }), START_DEADLINE_MS);
    child.stderr.on('data', (d) => {
      state.log += d;
      const m = /^.*event=kvarnd_started.*$/m.exec(state.log);
      if (m) settle({ ok: true, fields: fieldsOf(m[0]) });
    });
    child.on('exit', (code, signal) => {
      state.exit = { code, signal };
      settle({ ok: false, reason: `exited (${code ?? signal}) before event=kvarnd_started` });
    });
    child.on('error', (e) => settle({ ok: false, reason: String(e) }));
  });
}

function waitExit(state, deadlineMs) {
  return new Promise((resolve) => {
    if (state.exit) return resolve(state.exit);
    const timer = setTimeout(() => resolve(null), deadlineMs);
    state.child.once('exit', (code, signal) => {
      clearTimeout(timer);
      state.exit = { code, signal };
      resolve(state.exit);
    });
    return undefined;
  });
}

function httpGet(port, p) {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: p, timeout: 2000 }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve({ status: 0, body: String(e) }));
  });
}

function runExec(argv) {
  return new Promise((resolve) => {
    const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    child.on('exit', (code) => resolve({ code, out: out.trim() }));
    child.on('error', (e) => resolve({ code: -1, out: String(e) }));
  });
}

// A probe of the manifest, rewritten for the temporary daemon.
// A tenant and its token, from a shipped worker that reaches kvarnd k.
function workerCredentials(model, k) {
  for (const cl of clientsOf(model)) {
    if (kvarndFor(model, cl) !== k) continue;
    const tenant = M.envValue(cl.ct.c, 'KVARN_TENANT');
    const file = M.envValue(cl.ct.c, 'KVARN_TENANT_TOKEN_FILE');
    const f = tenant && file ? projectedFile(model, cl.ct, file) : null;
    const token = f && f.obj ? secretValue(f.obj, f.key) : undefined;
    if (token !== undefined) return { tenant, token: token.split('\n')[0] };
  }
  return null;
}

function probeRunner(probe, k, sock, port, kvarnctl) {
  if (probe.exec) {
    const argv = probe.exec.command.map((a) => (a === `--target=unix:${k.listen}` ? `--target=unix:${sock}` : a));
    if (path.posix.basename(argv[0]) === 'kvarnctl') argv[0] = kvarnctl;
    return { what: argv.slice(1).join(' '), run: async () => { const r = await runExec(argv); return { ok: r.code === 0, code: r.code, text: r.out }; } };
  }
  if (probe.httpGet) {
    return { what: `GET ${probe.httpGet.path}`, run: async () => { const r = await httpGet(port, probe.httpGet.path); return { ok: r.status === 200, code: r.status, text: r.body.trim() }; } };
  }
  return null;
}

async function exercise(model, k, opts, start, live) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvarn-k8s-'));
  const w = k.ct.where;
  const result = {};
  try {
    const conf = path.join(dir, 'kvarnd.conf');
    fs.writeFileSync(conf, k.text);
    const sock = path.join(dir, 'kvarnd.sock');
    const args = [`--config=${conf}`];
    for (const [key, v] of k.flags) if (!['config', 'listen', 'metrics', 'tenants_file'].includes(key)) args.push(`--${key}=${v}`);
    args.push(`--listen=${sock}`, '--metrics=127.0.0.1:0');
    const src = tenantsSource(model, k);
    let tenantLines = 0;
    if (src) {
      const text = src.obj ? secretValue(src.obj, src.key) : undefined;
      if (!start.expect(text !== undefined, w, `tenants_file ${src.file}: no shipped Secret provides it, nothing to start kvarnd with`)) return result;
      const t = path.join(dir, 'tenants');
      fs.writeFileSync(t, text, { mode: 0o600 });
      args.push(`--tenants_file=${t}`);
      tenantLines = text.split('\n').filter((l) => l.replace(/(^|\s)#.*$/, '').trim()).length;
    }
    const st = await startKvarnd(opts.kvarnd, args);
    if (!start.expect(st.ok, w, `kvarnd did not start: ${st.reason}\n${st.log.trim()}`)) return result;
    const f = st.fields;
    result.started = {
      capacity_bytes: Number(f.capacity_bytes),
      tail_bytes: Number(f.tail_slots) * 4 * Number(/_g([0-9]+)$/.exec(f.preset || '')?.[1]) * Number(f.layers) * Number(f.kv_heads) * Number(f.head_dim),
      backend: f.backend,
    };
    const backend = k.setting('backend');
    start.expect(backend === 'auto' || f.backend === backend, w, `configured backend ${backend}, kvarnd started ${f.backend}`);
    if (src) start.expect((f.trust || '').includes(`authenticated tenants: ${tenantLines}`), w, `kvarnd did not load the ${tenantLines} tenants: trust=${f.trust}`);
    const port = Number(f.metrics_port);
    const probes = ['startupProbe', 'livenessProbe', 'readinessProbe'].map((n) => [n, k.ct.c[n]]).filter(([, p]) => p);
    for (const [name, p] of probes) {
      const runner = probeRunner(p, k, sock, port, opts.kvarnctl);
      if (!live.expect(runner, `${w} ${name}`, 'neither exec nor httpGet: cannot be run')) continue;
      const r = await until(PROBE_DEADLINE_MS, async () => { const x = await runner.run(); return { ...x, done: x.ok }; });
      live.expect(r.ok, `${w} ${name}`, `${runner.what} never succeeded against the running kvarnd (last: ${r.code} ${r.text})`);
      if (name === 'readinessProbe' && p.httpGet) live.expect(/^ready\b/.test(r.text), `${w} ${name}`, `body '${r.text}' is not "ready"`);
    }
    // Draining: a worker's session held open keeps kvarnd draining; readiness must turn false
    // while liveness stays true. The session is a `kvarnctl demo` worker (as the tenant of a
    // shipped worker where kvarnd authenticates tenants), killed once that was seen.
    const demoArgs = ['demo', `--target=unix:${sock}`, '--workers=1', '--requests=100000', '--system-prompts=1'];
    if (src) {
      const cred = workerCredentials(model, k);
      if (start.expect(cred, w, 'no shipped worker has a tenant token for this kvarnd: cannot open a session to drain')) {
        const tf = path.join(dir, 'token');
        fs.writeFileSync(tf, cred.token, { mode: 0o600 });
        demoArgs.push(`--tenant=${cred.tenant}`, `--tenant-token-file=${tf}`);
      }
    }
    const holder = spawn(opts.kvarnctl, demoArgs, { stdio: ['ignore', 'pipe', 'pipe'] });
    let held = '';
    holder.stdout.on('data', (d) => { held += d; });
    holder.stderr.on('data', (d) => { held += d; });
    const sessionUp = await until(PROBE_DEADLINE_MS, async () => ({ done: /event=session_open [^\n]*tail_slots=[1-9]/.test(st.log) }));
    const drainable = live.expect(sessionUp.done, w, `kvarnctl demo opened no session to hold a drain open: ${held.trim().slice(-400)}`);
    st.child.kill('SIGTERM');
    if (drainable) {
      const ready = probes.find(([n]) => n === 'readinessProbe');
      const liveness = probes.find(([n]) => n === 'livenessProbe');
      if (ready && ready[1].httpGet) {
        const r = await until(PROBE_DEADLINE_MS, async () => { const x = await httpGet(port, ready[1].httpGet.path); return { ...x, done: x.status === 503 }; });
        live.expect(r.status === 503, `${w} readinessProbe`, `readiness did not turn 503 while draining (last ${r.status} ${r.body.trim()})`);
      }
      if (liveness && liveness[1].httpGet) {
        const r = await httpGet(port, liveness[1].httpGet.path);
        live.expect(r.status === 200, `${w} livenessProbe`, `liveness answered ${r.status} while draining: the kubelet would restart a draining kvarnd`);
      }
      const ex = probes.find(([, p]) => p.exec);
      if (ex) {
        const r = await probeRunner(ex[1], k, sock, port, opts.kvarnctl).run();
        live.expect(!r.ok, `${w} ${ex[0]}`, 'kvarnctl health still passed while kvarnd drained');
      }
    }
    holder.kill('SIGKILL');
    const drainMs = parseInt(k.setting('drain_ms'), 10) || 0;
    const exit = await waitExit(st, drainMs + START_DEADLINE_MS);
    start.expect(exit && exit.code === 0, w, `kvarnd did not exit 0 within drain_ms + ${START_DEADLINE_MS} ms after SIGTERM (${JSON.stringify(exit)})\n${st.log.trim()}`);
    if (!exit) st.child.kill('SIGKILL');
    return result;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// fp16 bytes of one block (a tail slot): K and V, 2 bytes each, of G tokens of every layer and
// kv-head.
function fp16BlockBytes(k) {
  const g = Number((/_g([0-9]+)$/.exec(k.setting('preset') || '') || [])[1]);
  return 4 * g * Number(k.setting('num_layers')) * Number(k.setting('num_kv_heads')) * Number(k.setting('head_dim'));
}

function configCheck(model, k, opts, check) {
  const w = k.ct.where;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvarn-k8s-'));
  try {
    const conf = path.join(dir, path.posix.basename(k.flags.get('config') || 'kvarnd.conf'));
    fs.writeFileSync(conf, k.text);
    const args = [`--config=${conf}`];
    for (const [key, v] of k.flags) if (key !== 'config') args.push(`--${key}=${v}`);
    const r = spawnSync(opts.kvarnd, [...args, '--check_config'], { encoding: 'utf8', timeout: 20000 });
    const said = `${r.stdout || ''}${r.stderr || ''}`.trim();
    if (!check.expect(r.status === 0 && /^config ok$/m.test(r.stdout || ''), w,
      `kvarnd --check_config --config=<the ConfigMap's ${k.configKey}> refused it (exit ${r.status}${r.error ? `, ${r.error}` : ''}): ${said}`)) return undefined;
    // kvarnd's own reading of the file must be the one the rules judged.
    const m = /^listen (\S+), tcp (\S+), metrics (\S+), backend (\S+),/m.exec(r.stdout);
    if (check.expect(m, w, `no "listen ..., backend ..." line in kvarnd --check_config's output:\n${said}`)) {
      check.expect(m[1] === k.listen, w, `kvarnd listens on ${m[1]}, the manifests were judged for ${k.listen}`);
      check.expect(m[3] === k.setting('metrics'), w, `kvarnd serves metrics on ${m[3]}, the manifests were judged for ${k.setting('metrics')}`);
      check.expect(m[4] === k.setting('backend'), w, `kvarnd's backend is ${m[4]}, the manifests were judged for ${k.setting('backend')}`);
    }
    const tail = /^\s*tail\s+([0-9]+) x /m.exec(r.stdout);
    const configured = /^capacity .* configured, pool /m.test(r.stdout);
    check.expect(tail && configured, w, `kvarnd --check_config printed no capacity and tail lines:\n${said}`);
    if (!tail) return undefined;
    return { capacity_bytes: M.parseBytes(k.setting('capacity') || ''), tail_bytes: Number(tail[1]) * fp16BlockBytes(k), plan: r.stdout };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// Adds k.checked (capacity, tail budget) to every kvarnd of the model: `kvarnd --check_config`.
function runConfigChecks(model, opts, cache) {
  const check = new Check('check-config', 'kvarnd --check_config accepts every shipped config with its container\'s flags, and reads it as the rules did');
  if (!check.expect(model.help.ok && model.help.flags.has('check_config'), opts.kvarnd, model.help.error || 'this kvarnd has no --check_config')) return check;
  for (const k of model.kvarnd) {
    if (!check.expect(k.text !== undefined, k.ct.where, 'no config to check')) continue;
    const key = JSON.stringify({ check: true, text: k.text, flags: [...k.flags] });
    let hit = cache && cache.get(key);
    if (!hit) {
      const c = new Check('check-config', '');
      hit = { c, r: configCheck(model, k, opts, c) };
      if (cache) cache.set(key, hit);
    }
    check.assertions += hit.c.assertions;
    check.failures.push(...hit.c.failures);
    k.checked = hit.r;
  }
  return check;
}

// Whether a uid other than the file's owner and group may execute `file`: it and every
// directory above it have the "other" execute bit.
function othersMayExecute(file) {
  let at = path.resolve(file);
  for (;;) {
    try {
      if ((fs.statSync(at).mode & 0o001) === 0) return false;
    } catch (e) {
      return false;
    }
    const up = path.dirname(at);
    if (up === at) return true;
    at = up;
  }
}

// kvarnd as the pod runs it, where this process may arrange that (root): as the container's
// uid and gid, in a socket directory prepared as the DaemonSet's prepare container does
// (owner kvarnd, 0700), with the tenants file owned and moded as the kubelet writes the Secret
// (secretFileAsSeen). Shows that kvarnd itself accepts the mounted tenants file; returns
// undefined (nothing asserted) when not root.
async function asMounted(model, k, opts, check) {
  const src = tenantsSource(model, k);
  if (!src || !src.obj || src.key === undefined || typeof process.getuid !== 'function' || process.getuid() !== 0) return undefined;
  const sec = M.effectiveSecurity(k.ct);
  const w = `${k.ct.where} (as uid ${sec.runAsUser})`;
  if (!check.expect(Number.isInteger(sec.runAsUser) && Number.isInteger(sec.runAsGroup), w, 'no runAsUser/runAsGroup to run kvarnd as')) return false;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvarn-k8s-mounted-'));
  try {
    fs.chmodSync(dir, 0o711);
    const run = path.join(dir, 'run');
    fs.mkdirSync(run, { mode: 0o700 });
    fs.chownSync(run, sec.runAsUser, sec.runAsGroup);
    const conf = path.join(dir, 'kvarnd.conf');
    fs.writeFileSync(conf, k.text, { mode: 0o644 });
    const seen = secretFileAsSeen(k.pod, src);
    const tenants = path.join(dir, 'tenants');
    fs.writeFileSync(tenants, secretValue(src.obj, src.key) || '');
    fs.chownSync(tenants, seen.uid, seen.gid);
    fs.chmodSync(tenants, seen.mode);
    const args = [`--config=${conf}`];
    for (const [key, v] of k.flags) if (!['config', 'listen', 'metrics', 'tenants_file'].includes(key)) args.push(`--${key}=${v}`);
    args.push(`--listen=${path.join(run, 'kvarnd.sock')}`, '--metrics=127.0.0.1:0', `--tenants_file=${tenants}`);
    // A build tree the pod's uid cannot reach (a checkout in root's 0700 home) would refuse
    // the exec: kvarnd then runs from a copy in this directory.
    let bin = opts.kvarnd;
    if (!othersMayExecute(bin)) {
      bin = path.join(dir, 'kvarnd');
      fs.copyFileSync(opts.kvarnd, bin);
      fs.chmodSync(bin, 0o755);
    }
    const st = await startKvarnd(bin, args, { uid: sec.runAsUser, gid: sec.runAsGroup });
    const mode = `root:${seen.gid} mode 0${seen.mode.toString(8)}`;
    const ok = check.expect(st.ok, w, `kvarnd refused the tenants file as mounted (${mode}) or did not start: ${st.reason}\n${st.log.trim()}`);
    if (ok) {
      st.child.kill('SIGTERM');
      const exit = await waitExit(st, START_DEADLINE_MS);
      if (!exit) st.child.kill('SIGKILL');
    }
    return ok;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// Adds k.started (capacity, tail budget, backend) to every kvarnd of the model. Results are
// cached by configuration, so the self-test reruns only what a mutation changed.
async function runDaemonChecks(model, opts, cache) {
  const start = new Check('kvarnd-start', 'the real kvarnd accepts and starts every shipped config, and exits 0 on SIGTERM');
  const live = new Check('probes-live', 'the manifests\' probes pass against the real kvarnd; readiness fails while it drains');
  start.expect(model.help.ok, opts.kvarnd, model.help.error);
  for (const k of model.kvarnd) {
    if (k.text === undefined) {
      start.expect(false, k.ct.where, 'no config to start kvarnd with');
      continue;
    }
    const src = tenantsSource(model, k);
    const key = JSON.stringify({
      text: k.text, flags: [...k.flags], listen: k.listen,
      tenants: src && src.obj ? secretValue(src.obj, src.key) : null,
      mounted: src && src.obj ? [secretFileAsSeen(k.pod, src), M.effectiveSecurity(k.ct)] : null,
      probes: ['startupProbe', 'livenessProbe', 'readinessProbe'].map((n) => k.ct.c[n] || null),
    });
    let hit = cache && cache.get(key);
    if (!hit) {
      const s = new Check('kvarnd-start', '');
      const l = new Check('probes-live', '');
      const r = await exercise(model, k, opts, s, l);
      r.asMounted = await asMounted(model, k, opts, s);
      hit = { s, l, r };
      if (cache) cache.set(key, hit);
    }
    if (hit.r.asMounted === undefined && tenantsSource(model, k)) {
      console.log(`note: ${k.ct.where}: not root, so kvarnd is not run as the pod's uid against the tenants file as mounted`);
    }
    start.assertions += hit.s.assertions;
    start.failures.push(...hit.s.failures);
    live.assertions += hit.l.assertions;
    live.failures.push(...hit.l.failures);
    k.started = hit.r.started;
  }
  for (const c of [start, live]) if (c.assertions === 0) c.failures.push('asserted nothing: it found nothing to check');
  return [start, live];
}

module.exports = { readHelp, runConfigChecks, runDaemonChecks };
