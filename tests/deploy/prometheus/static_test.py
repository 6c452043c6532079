#!/usr/bin/env python3
"""Static checks of the shipped Grafana dashboard, Prometheus rules and scrape config.

Dashboard: the datasource variable and the namespace/pod/instance variables exist (label_values
queries, "All" matching everything); every panel and target uses the datasource variable;
every legend names the instance or the pod; every variable used is defined; every metric
selector is narrowed by the three variables and every aggregation keeps them; every metric or
recorded series a panel reads exists; no two panels overlap.
Rules: every alert has `for`, a severity, a summary and a runbook at
docs/operations.md#<alert name in lower case> (and, when docs/operations.md exists, that
heading); every metric a rule reads is one kvarnd exports.
Scrape config: the commented Kubernetes job parses (promtool, with its discovery swapped for
a static one: Debian's Prometheus is built without Kubernetes discovery).

Usage: static_test.py --source-dir REPO [--promtool PATH] [--dashboard FILE] [--rules FILE]
Exit status 0 when every check passes; each failure is printed.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_lib as lib  # noqa: E402

REQUIRED_VARIABLES = ("namespace", "pod", "instance")
DATASOURCE_REFS = ("${datasource}", "$datasource")
SEVERITIES = ("critical", "warning", "info")


class Checks:
    def __init__(self):
        self.failures = []
        self.passed = 0

    def expect(self, cond, message):
        if cond:
            self.passed += 1
        else:
            self.failures.append(message)
        return cond


def datasource_ref(obj):
    ds = obj.get("datasource")
    if isinstance(ds, dict):
        return ds.get("uid", "")
    return ds or ""


def check_dashboard(c, dash, record_names):
    vars_ = lib.variables(dash)
    ds = vars_.get("datasource")
    c.expect(ds is not None and ds.get("type") == "datasource" and ds.get("query") == "prometheus",
             "dashboard: no datasource variable of type datasource querying prometheus")
    for name in REQUIRED_VARIABLES:
        v = vars_.get(name)
        if not c.expect(v is not None, f"dashboard: variable {name} is not defined"):
            continue
        q = lib.variable_query(v)
        c.expect(v.get("type") == "query" and re.match(rf"^label_values\(.*,\s*{name}\s*\)$", q) is not None,
                 f"dashboard: variable {name} is not a label_values(..., {name}) query: {q!r}")
        c.expect(datasource_ref(v) in DATASOURCE_REFS, f"dashboard: variable {name} does not use the datasource variable")
        c.expect(v.get("includeAll") is True and v.get("allValue") == ".*" and v.get("multi") is True,
                 f"dashboard: variable {name} needs multi, includeAll and allValue '.*' (a missing label must match All)")

    defined = set(vars_)
    for name in lib.referenced_variables(lib.json.dumps(dash)):
        c.expect(name in defined or name in lib.GRAFANA_BUILTINS, f"dashboard: variable ${name} is used but not defined")

    known = lib.known_series_names() | set(record_names)
    ids = set()
    boxes = []
    for p in lib.query_panels(dash):
        title = p.get("title", "?")
        c.expect(p.get("id") not in ids, f"panel {title!r}: id {p.get('id')} is not unique")
        ids.add(p.get("id"))
        c.expect(datasource_ref(p) in DATASOURCE_REFS, f"panel {title!r}: datasource does not reference $datasource")
        g = p.get("gridPos", {})
        if c.expect(all(k in g for k in "hwxy"), f"panel {title!r}: no gridPos"):
            boxes.append((title, g["x"], g["y"], g["w"], g["h"]))
        targets = p.get("targets", [])
        c.expect(len(targets) > 0, f"panel {title!r}: no targets")
        refs = [t.get("refId") for t in targets]
        c.expect(len(set(refs)) == len(refs), f"panel {title!r}: refIds repeat: {refs}")
        for t in targets:
            where = f"panel {title!r} target {t.get('refId')}"
            expr = t.get("expr", "")
            c.expect(datasource_ref(t) in DATASOURCE_REFS, f"{where}: datasource does not reference $datasource")
            legend_labels = set(lib.LEGEND_LABEL_RE.findall(t.get("legendFormat", "")))
            c.expect(bool(legend_labels & {"instance", "pod"}),
                     f"{where}: legendFormat {t.get('legendFormat')!r} names neither instance nor pod")
            c.expect(expr.strip() != "", f"{where}: empty expr")
            for m in lib.METRIC_TOKEN_RE.finditer(expr):
                name = m.group(1)
                c.expect(name in known, f"{where}: {name} is neither a kvarnd metric nor a recorded series")
                rest = expr[m.end():]
                sel = re.match(r"\{([^}]*)\}", rest)
                ok = sel is not None and all(f'{v}=~"${v}"' in sel.group(1) for v in REQUIRED_VARIABLES)
                c.expect(ok, f"{where}: selector of {name} is not narrowed by namespace, pod and instance")
            for m in re.finditer(r"\b(by|without)\s*\(([^)]*)\)", expr):
                labels = {s.strip() for s in m.group(2).split(",") if s.strip()}
                if m.group(1) == "by":
                    c.expect(set(REQUIRED_VARIABLES) <= labels, f"{where}: 'by ({m.group(2)})' drops namespace, pod or instance")
                else:
                    c.expect(not (set(REQUIRED_VARIABLES) & labels), f"{where}: 'without ({m.group(2)})' drops a target label")
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            overlap = a[1] < b[1] + b[3] and b[1] < a[1] + a[3] and a[2] < b[2] + b[4] and b[2] < a[2] + a[4]
            c.expect(not overlap, f"dashboard: panels {a[0]!r} and {b[0]!r} overlap")
    for p in lib.iter_panels(dash):
        if p.get("type") == "row":
            g = p.get("gridPos", {})
            boxes_in_row = [b for b in boxes if b[2] == g.get("y")]
            c.expect(not boxes_in_row, f"row {p.get('title')!r} overlaps panel {boxes_in_row[:1]}")


def github_anchor(heading):
    slug = heading.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


def check_rules(c, rules_text, operations_md):
    _, _, alerts = lib.rule_names(rules_text)
    c.expect(len(alerts) > 0, "rules: no alerts found")
    anchors = None
    if operations_md is not None:
        anchors = {github_anchor(h) for h in re.findall(r"^#+\s+(.*)$", operations_md, re.M)}
    for name, block in lib.alert_blocks(rules_text).items():
        c.expect(re.search(r"^\s+for:\s*\d+[smh]", block, re.M) is not None, f"alert {name}: no `for`")
        sev = re.search(r"\bseverity:\s*([A-Za-z]+)", block)
        c.expect(sev is not None and sev.group(1) in SEVERITIES, f"alert {name}: severity must be one of {SEVERITIES}")
        c.expect(re.search(r"^\s+summary:\s*\S", block, re.M) is not None, f"alert {name}: no summary")
        want = f"docs/operations.md#{name.lower()}"
        rb = re.search(r"^\s+runbook:\s*\"?([^\"\s]+)\"?", block, re.M)
        c.expect(rb is not None and rb.group(1) == want, f"alert {name}: runbook must be {want!r}, is {rb.group(1) if rb else None!r}")
        if anchors is not None:
            c.expect(name.lower() in anchors, f"alert {name}: docs/operations.md has no heading with anchor #{name.lower()}")
    known = lib.known_series_names()
    code = lib.strip_comments(rules_text)
    for m in re.finditer(r"\b(kvarn_[A-Za-z0-9_]+)", code):
        c.expect(m.group(1) in known, f"rules: {m.group(1)} is not a metric kvarnd exports")


def check_kubernetes_block(c, config_text, promtool):
    m = re.search(r"^# BEGIN kubernetes\n(.*?)^# END kubernetes", config_text, re.M | re.S)
    if not c.expect(m is not None, "prometheus.yml: no '# BEGIN kubernetes' ... '# END kubernetes' block"):
        return
    job = "\n".join(line[1:] if line.startswith("#") else line for line in m.group(1).splitlines())
    swapped = job.replace("kubernetes_sd_configs:\n      - role: pod", "static_configs:\n      - targets: []")
    c.expect(swapped != job, "prometheus.yml: the Kubernetes block has no 'kubernetes_sd_configs: - role: pod'")
    with tempfile.TemporaryDirectory(prefix="kvprom-static.") as tmp:
        path = os.path.join(tmp, "k8s.yml")
        with open(path, "w") as f:
            f.write("global: {scrape_interval: 15s}\nscrape_configs:\n" + swapped + "\n")
        r = subprocess.run([promtool, "check", "config", path], capture_output=True, text=True)
        c.expect(r.returncode == 0, f"prometheus.yml: the Kubernetes block does not parse: {r.stdout}{r.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--promtool", default="promtool")
    ap.add_argument("--dashboard")
    ap.add_argument("--rules")
    ap.add_argument("--config")
    a = ap.parse_args()
    dashboard = a.dashboard or os.path.join(a.source_dir, "deploy/grafana/kvarnd-dashboard.json")
    rules = a.rules or os.path.join(a.source_dir, "deploy/prometheus/kvarnd-rules.yml")
    config = a.config or os.path.join(a.source_dir, "deploy/prometheus/prometheus.yml")
    ops_path = os.path.join(a.source_dir, "docs/operations.md")
    operations_md = open(ops_path, encoding="utf-8").read()  # every alert's runbook lives there

    c = Checks()
    rules_text = open(rules, encoding="utf-8").read()
    _, records, _ = lib.rule_names(rules_text)
    check_dashboard(c, lib.load_dashboard(dashboard), records)
    check_rules(c, rules_text, operations_md)
    check_kubernetes_block(c, open(config, encoding="utf-8").read(), a.promtool)
    for f in c.failures:
        print("FAIL:", f)
    print(f"static checks: {c.passed} passed, {len(c.failures)} failed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
