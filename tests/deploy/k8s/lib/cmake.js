'use strict';
// What a CMakeLists.txt needs from the source tree, and under which if() conditions: its
// add_subdirectory() folders and its ${PROJECT_SOURCE_DIR}/... paths. The conditions are
// evaluated as far as the configure command's -D flags and the file's own option() and CACHE
// defaults allow, in three values (true, false, null: unknown), so a check can tell a folder
// the configure step switches off from one it needs.

const FALSE_CONSTANTS = /^(0|OFF|NO|FALSE|N|IGNORE|NOTFOUND|.*-NOTFOUND)$/i;
const TRUE_CONSTANTS = /^(1|ON|YES|TRUE|Y|[1-9][0-9]*(\.[0-9]+)?)$/i;
const KEYWORDS = new Set(['NOT', 'AND', 'OR', 'STREQUAL', 'EQUAL', 'LESS', 'GREATER', 'MATCHES', 'EXISTS', 'DEFINED',
  'COMMAND', 'TARGET', 'POLICY', 'IS_DIRECTORY', 'VERSION_LESS', 'VERSION_GREATER', 'VERSION_EQUAL',
  'VERSION_LESS_EQUAL', 'VERSION_GREATER_EQUAL', 'IN_LIST', 'STRLESS', 'STRGREATER']);

function stripComments(text) {
  return text.split('\n').map((l) => {
    let quoted = false;
    for (let i = 0; i < l.length; ++i) {
      if (l[i] === '"' && l[i - 1] !== '\\') quoted = !quoted;
      if (l[i] === '#' && !quoted) return l.slice(0, i);
    }
    return l;
  }).join('\n');
}

function tokenize(args) {
  const out = [];
  const re = /"((?:[^"\\]|\\.)*)"|([()])|([^\s()"]+)/g;
  let m;
  while ((m = re.exec(args)) !== null) {
    if (m[1] !== undefined) out.push({ quoted: true, text: m[1] });
    else if (m[2]) out.push({ paren: m[2] });
    else out.push({ quoted: false, text: m[3] });
  }
  return out;
}

// Values of the variables: -D flags win over option() and set(... CACHE ...) defaults.
function knownVariables(text, defines) {
  const vars = new Map();
  const body = stripComments(text);
  for (const m of body.matchAll(/\boption\s*\(\s*([A-Za-z0-9_]+)\s+"(?:[^"\\]|\\.)*"\s*([A-Za-z0-9_]*)\s*\)/g)) vars.set(m[1], m[2] || 'OFF');
  for (const m of body.matchAll(/\bset\s*\(\s*([A-Za-z0-9_]+)\s+(?:"((?:[^"\\]|\\.)*)"|([^\s")]+))\s+CACHE\b/g)) {
    vars.set(m[1], m[2] !== undefined ? m[2] : m[3]);
  }
  for (const [k, v] of defines) vars.set(k, v);
  return vars;
}

// Evaluates one if() condition; null where it depends on what this cannot know.
function evaluate(args, vars) {
  const toks = tokenize(args);
  let i = 0;
  const value = (t) => {
    if (!t || t.paren) return null;
    if (t.quoted) return /\$\{/.test(t.text) ? null : t.text;
    if (vars.has(t.text)) return vars.get(t.text);
    if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(t.text) && !TRUE_CONSTANTS.test(t.text) && !FALSE_CONSTANTS.test(t.text)) return undefined;
    return /\$\{/.test(t.text) ? null : t.text;
  };
  const truth = (t) => {
    if (!t.quoted && vars.has(t.text)) {
      const v = vars.get(t.text);
      return !(v === '' || FALSE_CONSTANTS.test(v));
    }
    if (TRUE_CONSTANTS.test(t.text)) return true;
    if (t.quoted ? t.text === '' || FALSE_CONSTANTS.test(t.text) : FALSE_CONSTANTS.test(t.text)) return false;
    return null;
  };
  const and3 = (a, b) => (a === false || b === false ? false : a === true && b === true ? true : null);
  const or3 = (a, b) => (a === true || b === true ? true : a === false && b === false ? false : null);
  const not3 = (a) => (a === null ? null : !a);
  const peekWord = () => (toks[i] && !toks[i].paren && !toks[i].quoted ? toks[i].text : null);
  let parseOr;
  const primary = () => {
    const t = toks[i];
    if (!t) return null;
    if (t.paren === '(') {
      i += 1;
      const v = parseOr();
      if (toks[i] && toks[i].paren === ')') i += 1;
      return v;
    }
    if (!t.quoted && ['EXISTS', 'DEFINED', 'COMMAND', 'TARGET', 'POLICY', 'IS_DIRECTORY'].includes(t.text)) {
      i += 2;
      return null;
    }
    i += 1;
    const op = peekWord();
    if (op && KEYWORDS.has(op) && !['NOT', 'AND', 'OR'].includes(op)) {
      const rhs = toks[i + 1];
      i += 2;
      if (op !== 'STREQUAL') return null;
      const a = value(t);
      const b = value(rhs);
      if (a === null || b === null || a === undefined || b === undefined) return null;
      return a === b;
    }
    return truth(t);
  };
  const parseNot = () => {
    if (peekWord() === 'NOT') {
      i += 1;
      return not3(parseNot());
    }
    return primary();
  };
  const parseAnd = () => {
    let v = parseNot();
    while (peekWord() === 'AND') {
      i += 1;
      v = and3(v, parseNot());
    }
    return v;
  };
  parseOr = () => {
    let v = parseAnd();
    while (peekWord() === 'OR') {
      i += 1;
      v = or3(v, parseAnd());
    }
    return v;
  };
  return parseOr();
}

// [{ path, what, conditions: [text], active: true|false|null }]: active is false when some
// enclosing branch is certainly not taken.
function sourceReferences(text, defines) {
  const vars = knownVariables(text, defines || new Map());
  const body = stripComments(text);
  const frames = [];
  const out = [];
  const active = () => frames.reduce((acc, f) => (acc === false || f.now === false ? false : acc === true && f.now === true ? true : null), true);
  const record = (p, what) => out.push({ path: p, what, conditions: frames.map((f) => f.text), active: active() });
  const re = /\b(if|elseif|else|endif|add_subdirectory)\s*\(([^)]*(?:\([^)]*\)[^)]*)*)\)|\$\{(?:PROJECT_SOURCE_DIR|CMAKE_SOURCE_DIR|CMAKE_CURRENT_SOURCE_DIR)\}\/([^\s)"$]+)/g;
  for (const m of body.matchAll(re)) {
    if (m[3]) {
      record(m[3].replace(/\/+$/, ''), 'path');
      continue;
    }
    const args = m[2].trim();
    if (m[1] === 'if') {
      const v = evaluate(args, vars);
      frames.push({ text: args, now: v, taken: v });
    } else if (m[1] === 'elseif' || m[1] === 'else') {
      const f = frames[frames.length - 1];
      if (!f) continue;
      const before = f.taken;
      const mine = m[1] === 'else' ? true : evaluate(args, vars);
      f.now = before === true ? false : before === false ? mine : (mine === false ? false : null);
      f.taken = before === true || mine === true ? true : before === false && mine === false ? false : null;
      f.text = m[1] === 'else' ? `else of ${f.text}` : args;
    } else if (m[1] === 'endif') {
      frames.pop();
    } else {
      record(args.split(/\s+/)[0].replace(/^"|"$/g, ''), 'add_subdirectory');
    }
  }
  return out;
}

module.exports = { evaluate, knownVariables, sourceReferences };
