'use strict';
// deploy/docker/Dockerfile, checked without Docker: its stages and base images, what its COPY
// instructions read from the repository (and whether .dockerignore lets them through), what the
// runtime stage takes from the build (the build's own install rules), the packages of the
// shared libraries the built kvarnd and kvarnctl link (ldd, dpkg -S), and the paths the
// Kubernetes manifests run from the image.

const { spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');
const M = require('./model');
const { sourceReferences } = require('./cmake');

// Debian 12 images: debian:12, debian:12.N, debian:bookworm, with -slim or a date, or a digest.
const DEBIAN12 = /^(docker\.io\/)?(library\/)?debian:(12(\.[0-9]+)?|bookworm)(-slim)?(-[0-9]{8})?(@sha256:[0-9a-f]{64})?$/;
const SLIM = /-slim\b/;
// Paths the base image provides that the manifests may run (the DaemonSet's prepare script).
const BASE_PATHS = new Set(['/bin/sh', '/usr/bin/stat', '/bin/chown', '/bin/chmod']);
const COMPILER_PACKAGES = /^(build-essential|g\+\+.*|gcc.*|clang.*|cmake|ninja-build|make|.*-dev)$/;

// Instructions with continuation lines joined and comment lines dropped, as BuildKit reads them.
function instructions(text) {
  const out = [];
  let current = null;
  text.split('\n').forEach((raw, i) => {
    const line = raw.replace(/\r$/, '');
    if (current === null) {
      if (/^\s*(#|$)/.test(line)) return;
      current = { line: i + 1, text: '' };
    } else if (/^\s*#/.test(line)) {
      return;
    }
    const cont = /\\\s*$/.test(line);
    current.text += (current.text ? ' ' : '') + line.replace(/\\\s*$/, '').trim();
    if (!cont) {
      const m = /^([A-Za-z]+)\s*(.*)$/.exec(current.text);
      out.push({ line: current.line, cmd: m ? m[1].toUpperCase() : '', args: m ? m[2] : current.text });
      current = null;
    }
  });
  if (current) out.push({ line: current.line, cmd: 'INCOMPLETE', args: current.text });
  return out;
}

function jsonOrWords(args) {
  const t = args.trim();
  if (t.startsWith('[')) {
    try {
      const v = JSON.parse(t);
      if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return { exec: true, words: v };
    } catch (e) {
      // shell form
    }
  }
  return { exec: false, words: t.split(/\s+/).filter(Boolean) };
}

function parseCopy(args, workdir) {
  const { words } = jsonOrWords(args);
  const flags = {};
  while (words.length && words[0].startsWith('--')) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(words.shift());
    if (m) flags[m[1]] = m[2] === undefined ? true : m[2];
  }
  const dest = words.pop();
  const absDest = dest && (dest.startsWith('/') ? dest : path.posix.join(workdir, dest));
  return { flags, sources: words, dest, absDest };
}

// Stages with their instructions, and what the checks need from them.
function parseDockerfile(text) {
  const stages = [];
  const problems = [];
  let st = null;
  for (const ins of instructions(text)) {
    if (ins.cmd === 'INCOMPLETE') problems.push(`line ${ins.line}: a continuation runs off the end`);
    if (ins.cmd === 'FROM') {
      const w = ins.args.split(/\s+/).filter((x) => !x.startsWith('--'));
      st = { line: ins.line, image: w[0], name: /^as$/i.test(w[1] || '') ? w[2] : undefined, copies: [], runs: [], users: [], entrypoint: null, workdir: '/' };
      stages.push(st);
      continue;
    }
    if (!st) {
      if (ins.cmd !== 'ARG') problems.push(`line ${ins.line}: ${ins.cmd} before the first FROM`);
      continue;
    }
    if (ins.cmd === 'WORKDIR') st.workdir = path.posix.resolve(st.workdir, ins.args.trim());
    else if (ins.cmd === 'COPY' || ins.cmd === 'ADD') st.copies.push({ line: ins.line, cmd: ins.cmd, ...parseCopy(ins.args, st.workdir) });
    else if (ins.cmd === 'RUN') st.runs.push({ line: ins.line, text: ins.args });
    else if (ins.cmd === 'USER') st.users.push({ line: ins.line, text: ins.args.trim() });
    else if (ins.cmd === 'ENTRYPOINT') st.entrypoint = { line: ins.line, ...jsonOrWords(ins.args) };
  }
  const final = stages[stages.length - 1];
  const lastUser = final && final.users.length ? final.users[final.users.length - 1].text : null;
  const um = lastUser && /^([0-9]+)(?::([0-9]+))?$/.exec(lastUser);
  const tag = /docker build\b[^\n]*\s-t\s+(\S+)/.exec(text);
  return {
    stages,
    problems,
    final,
    userText: lastUser,
    user: um ? { uid: parseInt(um[1], 10), gid: um[2] === undefined ? undefined : parseInt(um[2], 10) } : null,
    image: tag ? tag[1] : null,
  };
}

// .dockerignore patterns (Go filepath.Match plus **, later "!" patterns re-include).
function dockerignore(text) {
  const rules = [];
  for (const raw of (text || '').split('\n')) {
    let p = raw.trim();
    if (!p || p.startsWith('#')) continue;
    const negate = p.startsWith('!');
    if (negate) p = p.slice(1).trim();
    p = path.posix.normalize(p).replace(/^\/+/, '').replace(/\/+$/, '');
    let re = '';
    for (let i = 0; i < p.length; ++i) {
      const c = p[i];
      if (c === '*' && p[i + 1] === '*') {
        re += '.*';
        i += 1;
        if (p[i + 1] === '/') i += 1;
      } else if (c === '*') re += '[^/]*';
      else if (c === '?') re += '[^/]';
      else re += c.replace(/[.+^${}()|[\]\\]/g, '\\$&');
    }
    rules.push({ negate, re: new RegExp(`^${re}(/.*)?$`), text: raw.trim() });
  }
  return (rel) => {
    let excluded = null;
    for (const r of rules) if (r.re.test(rel)) excluded = r.negate ? null : r.text;
    return excluded;
  };
}

// Executables the build installs into <prefix>/bin: its cmake_install.cmake scripts.
function installedExecutables(buildDir) {
  const out = new Map();
  const walk = (d, depth) => {
    let entries;
    try {
      entries = fs.readdirSync(d, { withFileTypes: true });
    } catch (e) {
      return;
    }
    for (const e of entries) {
      const p = path.join(d, e.name);
      if (e.isDirectory() && depth < 8 && e.name !== 'CMakeFiles' && e.name !== 'node_modules') walk(p, depth + 1);
      else if (e.name === 'cmake_install.cmake') {
        const t = fs.readFileSync(p, 'utf8');
        for (const m of t.matchAll(/file\(INSTALL DESTINATION "\$\{CMAKE_INSTALL_PREFIX\}\/([^"]*)" TYPE EXECUTABLE FILES "([^"]+)"\)/g)) {
          out.set(path.posix.join(m[1], path.posix.basename(m[2])), m[2]);
        }
      }
    }
  };
  walk(buildDir, 0);
  return out;
}

// Debian packages of the shared libraries `binaries` link, and libraries no package owns
// (memoized: the self-test asks once per mutation).
const packagesMemo = new Map();
function runtimePackages(binaries) {
  const key = binaries.join('\0');
  if (!packagesMemo.has(key)) packagesMemo.set(key, lookUpPackages(binaries));
  return packagesMemo.get(key);
}

function lookUpPackages(binaries) {
  const libs = new Set();
  const errors = [];
  for (const b of binaries) {
    const r = spawnSync('ldd', [b], { encoding: 'utf8' });
    if (r.status !== 0) {
      errors.push(`ldd ${b}: ${(r.stderr || r.error || '').toString().trim()}`);
      continue;
    }
    for (const m of r.stdout.matchAll(/=>\s+(\/\S+)/g)) libs.add(m[1]);
  }
  // Every name a library goes by: ldd's, its real path, and the other side of Debian 12's
  // merged /usr (dpkg may know /lib/x86_64-linux-gnu/libc.so.6 under either name).
  const names = new Map();
  for (const lib of libs) {
    const candidates = [lib];
    try {
      candidates.push(fs.realpathSync(lib));
    } catch (e) {
      // ldd named it; keep the name
    }
    for (const c of [...candidates]) {
      if (c.startsWith('/usr/lib/')) candidates.push(c.slice(4));
      else if (c.startsWith('/lib/')) candidates.push(`/usr${c}`);
    }
    names.set(lib, candidates);
  }
  // One dpkg-query for all of them: it prints "package[, package]: path" per path it knows.
  const all = [...new Set([...names.values()].flat())];
  const owners = new Map();
  if (all.length) {
    const r = spawnSync('dpkg-query', ['-S', ...all], { encoding: 'utf8', maxBuffer: 16 << 20 });
    for (const line of (r.stdout || '').split('\n')) {
      const m = /^([^:]+(?::[a-z0-9]+)?(?:, [^:]+(?::[a-z0-9]+)?)*): (\/\S+)$/.exec(line);
      if (m) owners.set(m[2], m[1].split(',')[0].trim().split(':')[0]);
    }
  }
  const packages = new Map();
  const unowned = [];
  for (const [lib, candidates] of names) {
    const owner = candidates.map((c) => owners.get(c)).find(Boolean);
    if (owner) {
      if (!packages.has(owner)) packages.set(owner, []);
      packages.get(owner).push(path.posix.basename(lib));
    } else {
      unowned.push(lib);
    }
  }
  return { packages, unowned, errors };
}

function aptInstalls(runs) {
  const out = [];
  for (const r of runs) {
    for (const m of r.text.matchAll(/apt-get\s+install\s+([^&|;]*)/g)) {
      for (const w of m[1].split(/\s+/)) if (w && !w.startsWith('-')) out.push(w);
    }
  }
  return out;
}

// Absolute paths the manifests execute inside containers of the kvarnd image.
function pathsRun(model, isKvarndImage) {
  const out = [];
  for (const pod of model.pods) {
    for (const ct of M.containers(pod)) {
      if (!isKvarndImage(ct.c.image)) continue;
      const add = (p, what) => { if (p && p.startsWith('/')) out.push({ p, where: `${ct.where} ${what}` }); };
      const argv = ct.c.command || [];
      add(argv[0], 'command');
      for (const a of [...argv.slice(1), ...(ct.c.args || [])]) {
        for (const m of String(a).matchAll(/(?:^|[\s;&|(])(?:exec\s+)?(\/usr\/local\/bin\/[A-Za-z0-9_.-]+)/g)) add(m[1], 'script');
      }
      for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
        const ex = ct.c[probe] && ct.c[probe].exec;
        if (ex) add((ex.command || [])[0], probe);
      }
    }
  }
  return out;
}

function checkStages({ inputs, df }, check) {
  const W = 'deploy/docker/Dockerfile';
  for (const p of df.problems) check.expect(false, W, p);
  if (!check.expect(df.stages.length >= 2, W, `${df.stages.length} stage(s): a build stage and a runtime stage are required`)) return;
  const names = new Set();
  for (const st of df.stages) {
    const fromStage = names.has(st.image);
    check.expect(fromStage || DEBIAN12.test(st.image || ''), `${W}:${st.line}`, `FROM ${st.image} is not a Debian 12 (bookworm) image`);
    if (st.name) names.add(st.name);
  }
  const build = df.stages[0];
  const final = df.final;
  check.expect(build.name, `${W}:${build.line}`, 'the build stage has no name (FROM ... AS build) for the runtime stage to copy from');
  check.expect(SLIM.test(final.image || '') && !names.has(final.image), `${W}:${final.line}`, `the runtime stage starts from ${final.image}, not a slim Debian 12 image`);
  for (const script of ['deploy/setup.sh', 'deploy/build.sh']) {
    const run = build.runs.find((r) => r.text.includes(script));
    if (!check.expect(run, W, `the build stage never runs ${script}`)) continue;
    const copied = build.copies.some((c) => !c.flags.from && c.line < run.line && c.sources.some((s) => script === s || script.startsWith(`${s.replace(/\/+$/, '')}/`)));
    check.expect(copied, `${W}:${run.line}`, `${script} runs before any COPY brings it in`);
  }
  const installs = aptInstalls(final.runs);
  for (const p of installs) check.expect(!COMPILER_PACKAGES.test(p), `${W}:${final.line}`, `the runtime stage installs ${p}: build tools and -dev packages belong in the build stage`);
  for (const r of final.runs) {
    check.expect(!/deploy\/(setup|build)\.sh|cmake\s|ninja\b/.test(r.text), `${W}:${r.line}`, 'the runtime stage builds: it must only copy the build stage\'s output');
  }
  for (const c of final.copies) {
    check.expect(c.flags.from, `${W}:${c.line}`, `the runtime stage copies ${c.sources.join(' ')} from the build context: only the build's output belongs there`);
  }
}

function checkCopies({ inputs, df }, check) {
  const W = 'deploy/docker/Dockerfile';
  const ignored = dockerignore(inputs.text('.dockerignore'));
  check.expect(inputs.text('.dockerignore') !== undefined, '.dockerignore', 'missing: the whole checkout (build trees, .git) would be the build context');
  for (const p of ['.git', 'build']) check.expect(ignored(p), '.dockerignore', `does not exclude ${p}`);
  const copied = [];
  for (const st of df.stages) {
    for (const c of st.copies) {
      if (c.flags.from) continue;
      check.expect(c.cmd === 'COPY', `${W}:${c.line}`, 'ADD fetches and unpacks; COPY is what a build context needs');
      for (const s of c.sources) {
        const rel = path.posix.normalize(s).replace(/^\.\/?/, '').replace(/\/+$/, '') || '.';
        const abs = path.join(inputs.repo, rel);
        check.expect(!/[*?[]/.test(rel) && fs.existsSync(abs), `${W}:${c.line}`, `COPY ${s}: no such file or directory in the repository`);
        const why = rel === '.' ? null : ignored(rel);
        check.expect(!why, `${W}:${c.line}`, `COPY ${s}: .dockerignore excludes it (${why})`);
        copied.push(rel);
      }
    }
  }
  // What the top-level CMakeLists.txt reads from the source tree must be copied, unless the
  // build stage's -D flags (over the file's own defaults) switch off the branch reading it.
  const top = inputs.text('CMakeLists.txt') || '';
  const buildRun = df.stages[0].runs.map((r) => r.text).join('\n');
  const defines = new Map([...buildRun.matchAll(/-D([A-Za-z0-9_]+)(?::[A-Z]+)?=(\S*)/g)].map((m) => [m[1], m[2].replace(/^"|"$/g, '')]));
  const refs = sourceReferences(top, defines);
  check.expect(refs.some((r) => r.what === 'add_subdirectory'), 'CMakeLists.txt', 'no add_subdirectory() found');
  check.expect(copied.includes('CMakeLists.txt'), W, 'the top-level CMakeLists.txt is not copied');
  for (const r of refs) {
    const covered = copied.some((c) => r.path === c || r.path.startsWith(`${c}/`));
    check.expect(covered || r.active === false, W,
      `${r.path} (${r.what === 'path' ? 'read' : 'add_subdirectory'} in CMakeLists.txt${r.conditions.length ? ` under if(${r.conditions.join(') if(')})` : ''}) is not copied, and the build's -D flags do not switch that off`);
  }
}

function checkRuntime({ inputs, df, model, isKvarndImage }, check) {
  const W = 'deploy/docker/Dockerfile';
  const final = df.final;
  const u = df.user;
  check.expect(u && u.uid > 0 && u.gid > 0, W, `the runtime stage's USER ${df.userText} is not a numeric non-root uid:gid (runAsNonRoot can only verify a numeric user)`);
  if (u) {
    const ua = final.runs.map((r) => r.text).join('\n');
    check.expect(new RegExp(`useradd\\b[^\\n]*--uid\\s+${u.uid}\\b`).test(ua), W, `no useradd --uid ${u.uid} in the runtime stage: the uid has no passwd entry`);
  }
  // What the runtime stage receives from the build stage, and where.
  const provided = new Map();
  const build = df.stages[0];
  const installRun = build.runs.find((r) => /cmake\s+--install\b/.test(r.text));
  const prefix = installRun && (/--prefix[=\s]+(\S+)/.exec(installRun.text) || [])[1];
  check.expect(prefix, W, 'the build stage never runs cmake --install --prefix DIR');
  const installed = inputs.buildDir ? installedExecutables(inputs.buildDir) : new Map();
  check.expect(installed.size > 0, `${inputs.buildDir}`, 'the build directory installs no executable (no cmake_install.cmake with TYPE EXECUTABLE): pass --build-dir');
  for (const c of final.copies) {
    if (!c.flags.from) continue;
    check.expect(c.flags.from === build.name, `${W}:${c.line}`, `COPY --from=${c.flags.from}: not the build stage ${build.name}`);
    for (const s of c.sources) {
      const rel = prefix && s.startsWith(`${prefix}/`) ? s.slice(prefix.length + 1) : null;
      const from = rel && installed.get(rel);
      check.expect(from && fs.existsSync(from), `${W}:${c.line}`,
        `COPY --from=${c.flags.from} ${s}: not an executable the build installs under ${prefix} (installs: ${[...installed.keys()].join(', ')})`);
      const dest = c.absDest.endsWith('/') ? path.posix.join(c.absDest, path.posix.basename(s)) : c.absDest;
      provided.set(dest, s);
    }
  }
  const ep = final.entrypoint;
  if (check.expect(ep && ep.exec && ep.words.length > 0, W, 'no ENTRYPOINT in exec form (["/path", ...]): a shell form would not pass SIGTERM to kvarnd')) {
    check.expect(provided.has(ep.words[0]) && path.posix.basename(ep.words[0]) === 'kvarnd', `${W}:${ep.line}`,
      `ENTRYPOINT ${ep.words[0]} is not the kvarnd the runtime stage copies from the build (${[...provided.keys()].join(', ')})`);
  }
  const runs = pathsRun(model, isKvarndImage);
  check.expect(runs.length > 0, 'deploy/kubernetes', 'no container of the kvarnd image runs an absolute path');
  for (const r of runs) {
    check.expect(provided.has(r.p) || BASE_PATHS.has(r.p), r.where, `runs ${r.p}, which the image does not contain (it has ${[...provided.keys()].join(', ')})`);
  }
  // The runtime packages: exactly those of the libraries the built binaries link.
  const listed = aptInstalls(final.runs);
  check.expect(listed.length > 0, W, 'the runtime stage installs no package: kvarnd links shared libraries');
  if (!inputs.binaries.length) return;
  const probe = spawnSync('dpkg-query', ['--version'], { encoding: 'utf8' });
  if (probe.status !== 0) {
    console.log('note: dpkg-query is absent; the runtime package list is not compared with ldd');
    return;
  }
  const rp = runtimePackages(inputs.binaries);
  for (const e of rp.errors) check.expect(false, W, e);
  const cudaOff = /-DKVARN_WITH_CUDA=OFF\b/.test(build.runs.map((r) => r.text).join('\n'));
  for (const lib of rp.unowned) {
    check.expect(cudaOff && /cuda|libcu/i.test(lib), W, `${lib} (linked by the built binaries) belongs to no Debian package${/cuda/i.test(lib) ? ' and the image build does not switch CUDA off' : ''}`);
  }
  for (const [pkg, libs] of rp.packages) {
    check.expect(listed.includes(pkg), W, `the runtime stage does not install ${pkg} (${libs.join(', ')}, linked by kvarnd or kvarnctl)`);
  }
  for (const pkg of listed) {
    check.expect(rp.packages.has(pkg), W, `the runtime stage installs ${pkg}, which no library of kvarnd or kvarnctl comes from: only the runtime libraries belong there`);
  }
}

const DOCKER_CHECKS = [
  ['docker-stages', 'multi-stage Debian 12 build through deploy/setup.sh and deploy/build.sh; the runtime stage only copies', checkStages],
  ['docker-copy', 'every COPY source exists, passes .dockerignore, and the build has every source folder it configures', checkCopies],
  ['docker-runtime', 'numeric USER, ENTRYPOINT and the manifests\' paths are installed build outputs; runtime packages = ldd', checkRuntime],
];

module.exports = { parseDockerfile, dockerignore, installedExecutables, runtimePackages, DOCKER_CHECKS };
