'use strict';
// Reads every manifest and validates every document against the API schemas of the pinned
// kubernetes-models packages, rejecting fields the schema does not know (as the API server's
// strict field validation, kubectl's default, does).

const fs = require('fs');
const path = require('path');

function listManifestFiles(dir) {
  const out = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.ya?ml$/.test(e.name)) out.push(p);
    }
  };
  walk(dir);
  return out;
}

// texts: Map of relative file name -> YAML text. YAML 1.1, as Kubernetes reads it (0400 is
// octal, yes/no are booleans).
function parseManifests(texts, YAML) {
  const docs = [];
  const errors = [];
  for (const [file, text] of texts) {
    const parsed = YAML.parseAllDocuments(text, { version: '1.1', uniqueKeys: true });
    const list = Array.isArray(parsed) ? parsed : [];
    list.forEach((ydoc, index) => {
      if (ydoc.errors.length) {
        errors.push(`${file}#${index}: ${ydoc.errors.map((e) => e.message).join('; ')}`);
        return;
      }
      const obj = ydoc.toJS();
      if (obj === null || obj === undefined) return;
      docs.push({ file, index, obj, ydoc });
    });
  }
  return { docs, errors };
}

function readManifests(dir) {
  const texts = new Map();
  for (const f of listManifestFiles(dir)) texts.set(path.relative(dir, f), fs.readFileSync(f, 'utf8'));
  return texts;
}

function schemaModule(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || typeof kind !== 'string') return null;
  if (!/^[A-Za-z][A-Za-z0-9]*$/.test(kind)) return null;
  const parts = apiVersion.split('/');
  if (parts.length > 2 || !parts.every((p) => /^[a-z0-9.-]+$/.test(p))) return null;
  const [group, version] = parts.length === 2 ? parts : ['', parts[0]];
  if (group === 'monitoring.coreos.com') return `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`;
  return group ? `kubernetes-models/${group}/${version}/${kind}` : `kubernetes-models/${version}/${kind}`;
}

// A copy of obj whose objects record which of their keys the validator read. The compiled
// schema validators read every property the schema names (and iterate maps), so a key never
// read is one the schema does not have.
function tracked(obj, where, records) {
  if (obj === null || typeof obj !== 'object') return obj;
  if (Array.isArray(obj)) return obj.map((v, i) => tracked(v, `${where}[${i}]`, records));
  const copy = {};
  for (const [k, v] of Object.entries(obj)) copy[k] = tracked(v, `${where}.${k}`, records);
  const rec = { where, keys: Object.keys(obj), read: new Set() };
  records.push(rec);
  return new Proxy(copy, {
    get(target, key, receiver) {
      if (typeof key === 'string') rec.read.add(key);
      return Reflect.get(target, key, receiver);
    },
  });
}

// Returns a list of problems with one document (empty when it is valid).
function validateDocument(req, obj) {
  const mod = schemaModule(obj.apiVersion, obj.kind);
  if (!mod) return [`apiVersion '${obj.apiVersion}' / kind '${obj.kind}' is malformed`];
  let Model;
  try {
    Model = req(mod)[obj.kind];
  } catch (e) {
    return [`no schema for ${obj.apiVersion} ${obj.kind} in the pinned packages (${mod})`];
  }
  if (typeof Model !== 'function') return [`${mod} has no model ${obj.kind}`];
  // A validator that accepts anything would make this check vacuous: it must refuse the
  // kind with a wrong apiVersion.
  try {
    Model.prototype.validate.call({ ...obj, apiVersion: 'not/a-version' });
    return [`the validator of ${obj.kind} accepted a wrong apiVersion: it checks nothing`];
  } catch (e) {
    // expected
  }
  const records = [];
  try {
    Model.prototype.validate.call(tracked(obj, '', records));
  } catch (e) {
    return [e.message];
  }
  const unknown = [];
  for (const r of records) {
    for (const k of r.keys) if (!r.read.has(k)) unknown.push(`${r.where}.${k}`.replace(/^\./, ''));
  }
  return unknown.map((u) => `unknown field ${u} (not in the ${obj.apiVersion} ${obj.kind} schema)`);
}

module.exports = { listManifestFiles, parseManifests, readManifests, schemaModule, validateDocument };
