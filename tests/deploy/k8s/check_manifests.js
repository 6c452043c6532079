'use strict';
// Offline validation of deploy/kubernetes and deploy/docker (ctest -L deploy):
//   node check_manifests.js --node-dir=DIR --kvarnd=BIN --kvarnctl=BIN --build-dir=DIR
//        [--repo=DIR] [--only=GROUP[,GROUP...]] [--self-test]
// --node-dir holds the node_modules that `npm ci` installed from this folder's lock file.
// Groups (default: all of them):
//   schema      every document of every manifest against the Kubernetes and prometheus-operator
//               schemas of the pinned kubernetes-models packages, unknown fields refused
//   rules       the project's rules (lib/checks.js) and `kvarnd --check_config` on every
//               shipped config (lib/daemon.js)
//   live        the real kvarnd started on every shipped config, the manifests' probes run
//               against it, readiness failing while it drains (lib/daemon.js)
//   dockerfile  deploy/docker/Dockerfile against the repository, the build and the manifests
//               (lib/dockerfile.js)
// --self-test applies each mutation of lib/mutations.js (whose check is in the selected groups)
// to a copy of the files and requires the check it targets to fail, and every selected check
// to have such a mutation: every check is shown able to fail.

const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');
const { parseManifests, readManifests, validateDocument } = require('./lib/load');
const { Check, CHECKS, runStaticChecks, resolveKvarnd } = require('./lib/checks');
const { readHelp, runConfigChecks, runDaemonChecks } = require('./lib/daemon');
const { parseDockerfile, DOCKER_CHECKS } = require('./lib/dockerfile');
const { MUTATIONS, applyMutation } = require('./lib/mutations');
const M = require('./lib/model');

// Repository files the checks read besides the manifests (mutations may change them too).
const OTHER_FILES = [
  'deploy/docker/Dockerfile', '.dockerignore', 'CMakeLists.txt',
  'deploy/prometheus/kvarnd-rules.yml', 'deploy/grafana/kvarnd-dashboard.json',
];

const GROUPS = {
  schema: ['schema'],
  rules: [...CHECKS.map(([id]) => id), 'check-config'],
  live: ['kvarnd-start', 'probes-live'],
  dockerfile: DOCKER_CHECKS.map(([id]) => id),
};

function parseArgs(argv) {
  const out = {};
  for (const a of argv) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(a);
    if (!m) throw new Error(`unexpected argument ${a}`);
    out[m[1]] = m[2] === undefined ? true : m[2];
  }
  return out;
}

function isKvarndImageOf(model) {
  const want = model.dockerfile.image;
  const repo = (s) => String(s || '').replace(/[:@][^/]*$/, '');
  return (image) => Boolean(image) && (image === want || repo(image) === repo(want) || /(^|\/)kvarnd([:@]|$)/.test(image));
}

function buildModel(inputs, opts, req) {
  const { docs, errors } = parseManifests(inputs.texts, req('yaml'));
  const model = { docs, parseErrors: errors, dockerfile: parseDockerfile(inputs.text('deploy/docker/Dockerfile') || ''), help: opts.help, inputs };
  model.pods = M.pods(docs);
  model.kvarnd = resolveKvarnd(model);
  return model;
}

function schemaCheck(model, req) {
  const schema = new Check('schema', 'every document validates against the API schemas (kubernetes-models), no unknown fields');
  for (const e of model.parseErrors) schema.expect(false, 'YAML', e);
  for (const d of model.docs) {
    const problems = validateDocument(req, d.obj);
    schema.expect(problems.length === 0, M.describe(d), problems.join('; '));
  }
  if (schema.assertions === 0) schema.failures.push('no documents found');
  return schema;
}

function dockerChecks(model) {
  const ctx = { inputs: model.inputs, df: model.dockerfile, model, isKvarndImage: isKvarndImageOf(model) };
  return DOCKER_CHECKS.map(([id, title, fn]) => {
    const c = new Check(id, title);
    try {
      fn(ctx, c);
    } catch (e) {
      c.failures.push(`the check threw: ${e.stack || e}`);
    }
    if (c.assertions === 0) c.failures.push('asserted nothing: it found nothing to check');
    return c;
  });
}

async function runAll(inputs, opts, req, cache, selected) {
  const model = buildModel(inputs, opts, req);
  const wants = (group) => GROUPS[group].some((id) => selected.has(id));
  const checks = [];
  if (wants('schema')) checks.push(schemaCheck(model, req));
  if (wants('rules') || wants('live')) {
    // --check_config first: the memory rule reads its tail-slot figures.
    const cc = runConfigChecks(model, opts, cache);
    if (wants('rules')) checks.push(...runStaticChecks(model), cc);
  }
  if (wants('live')) checks.push(...await runDaemonChecks(model, opts, cache));
  if (wants('dockerfile')) checks.push(...dockerChecks(model));
  return { model, checks: checks.filter((c) => selected.has(c.id)) };
}

function report(checks) {
  for (const c of checks) {
    const status = c.failures.length ? 'FAIL' : 'ok  ';
    console.log(`${status} ${c.id.padEnd(14)} ${c.assertions} assertions: ${c.title}`);
    for (const f of c.failures) console.log(`       - ${f.split('\n').join('\n         ')}`);
  }
}

async function selfTest(inputs, opts, req, cache, selected) {
  let bad = 0;
  const root = typeof process.getuid === 'function' && process.getuid() === 0;
  const skipped = MUTATIONS.filter((m) => selected.has(m.check) && m.root && !root);
  for (const mut of skipped) console.log(`skip mutation ${mut.id}: needs root (${mut.why})`);
  const mutations = MUTATIONS.filter((m) => selected.has(m.check) && !skipped.includes(m));
  for (const mut of mutations) {
    const mutated = applyMutation(inputs, mut);
    if (mutated.error) {
      console.log(`FAIL mutation ${mut.id}: ${mutated.error}`);
      bad += 1;
      continue;
    }
    const { checks } = await runAll(mutated.inputs, opts, req, cache, new Set([mut.check]));
    const target = checks.find((c) => c.id === mut.check);
    if (target && target.failures.length > 0) {
      console.log(`ok   mutation ${mut.id.padEnd(28)} -> ${mut.check} fails: ${target.failures[0].split('\n')[0].slice(0, 150)}`);
    } else {
      console.log(`FAIL mutation ${mut.id}: check ${mut.check} did not fail (${mut.why})`);
      bad += 1;
    }
  }
  return { bad, count: mutations.length, covered: new Set(mutations.map((m) => m.check)) };
}

function readInputs(repo, buildDir, binaries) {
  const others = new Map();
  for (const rel of OTHER_FILES) {
    const p = path.join(repo, rel);
    if (fs.existsSync(p)) others.set(rel, fs.readFileSync(p, 'utf8'));
  }
  return makeInputs({ repo, buildDir, binaries, texts: readManifests(path.join(repo, 'deploy', 'kubernetes')), others });
}

function makeInputs(fields) {
  return { ...fields, text: (rel) => fields.others.get(rel) };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const repo = path.resolve(args.repo || path.join(__dirname, '..', '..', '..'));
  for (const k of ['node-dir', 'kvarnd', 'kvarnctl', 'build-dir']) if (!args[k]) throw new Error(`--${k} is required`);
  const groups = args.only ? String(args.only).split(',') : Object.keys(GROUPS);
  for (const g of groups) if (!GROUPS[g]) throw new Error(`--only: unknown group ${g} (${Object.keys(GROUPS).join(', ')})`);
  const selected = new Set(groups.flatMap((g) => GROUPS[g]));
  const nodeDir = path.resolve(args['node-dir']);
  const req = createRequire(path.join(nodeDir, 'package.json'));
  const pins = JSON.parse(fs.readFileSync(path.join(__dirname, 'package.json'), 'utf8')).dependencies;
  for (const [name, version] of Object.entries(pins)) {
    const file = path.join(nodeDir, 'node_modules', name, 'package.json');
    if (!fs.existsSync(file)) throw new Error(`${name} is not installed in ${nodeDir}: run npm ci there`);
    const got = JSON.parse(fs.readFileSync(file, 'utf8')).version;
    if (got !== version) throw new Error(`${name} ${got} is installed, ${version} is pinned: rerun npm ci`);
  }
  console.log(`node ${process.version}; schemas: ${Object.entries(pins).map(([n, v]) => `${n}@${v}`).join(', ')}; groups: ${groups.join(', ')}`);
  const opts = { kvarnd: path.resolve(args.kvarnd), kvarnctl: path.resolve(args.kvarnctl) };
  opts.help = readHelp(opts.kvarnd);
  const inputs = readInputs(repo, path.resolve(args['build-dir']), [opts.kvarnd, opts.kvarnctl]);
  const cache = new Map();
  const { model, checks } = await runAll(inputs, opts, req, cache, selected);
  report(checks);
  const failed = checks.filter((c) => c.failures.length);
  const assertions = checks.reduce((s, c) => s + c.assertions, 0);
  console.log(`${model.docs.length} documents in ${inputs.texts.size} manifest files; ` +
    `${checks.length} checks, ${assertions} assertions, ${failed.length} failed`);
  if (failed.length) return 1;
  if (args['self-test']) {
    const { bad, count, covered } = await selfTest(inputs, opts, req, cache, selected);
    const uncovered = checks.map((c) => c.id).filter((id) => !covered.has(id));
    for (const id of uncovered) console.log(`FAIL check ${id} has no mutation showing it can fail`);
    console.log(`self-test: ${count} mutations, ${count - bad} made their check fail; ` +
      `${checks.length - uncovered.length} of ${checks.length} checks shown able to fail`);
    if (bad || uncovered.length) return 1;
  }
  return 0;
}

main().then((code) => { process.exitCode = code; }, (e) => {
  console.error(`check_manifests: ${e.stack || e}`);
  process.exitCode = 2;
});
