"""Shared helpers of the deploy tests: the metrics kvarnd exports, the shipped dashboard's
panels and variables, and the names the shipped rules file defines. Standard library only."""

import json
import re

# Every metric kvarnd exports (docs/daemon.md, "Metrics"; the kvarn_tier_* ones when a tier is
# configured, docs/tiers.md), by exposition name. Histograms are
# listed by base name; their series are NAME_bucket, NAME_sum and NAME_count.
COUNTERS_AND_GAUGES = [
    "kvarn_build_info",
    "kvarn_compression_ratio",
    "kvarn_draining",
    "kvarn_evictions_total",
    "kvarn_pool_blocks",
    "kvarn_pool_bytes",
    "kvarn_pool_capacity_bytes",
    "kvarn_pool_capacity_tokens",
    "kvarn_pool_configured_bytes",
    "kvarn_pool_huge_page_bytes",
    "kvarn_pool_huge_page_fallbacks_total",
    "kvarn_pool_tokens",
    "kvarn_pool_usage_ratio",
    "kvarn_prefix_cache_hit_tokens_total",
    "kvarn_prefix_cache_queried_tokens_total",
    "kvarn_rpc_requests_total",
    "kvarn_seals_total",
    "kvarn_sequences",
    "kvarn_sessions",
    "kvarn_sessions_expired_total",
    "kvarn_tenant_quota",
    "kvarn_tenant_quota_rejections_total",
    "kvarn_tenant_usage",
    "kvarn_tier_blocks",
    "kvarn_tier_bytes",
    "kvarn_tier_capacity_bytes",
    "kvarn_tier_dropped_writes_total",
    "kvarn_tier_errors_total",
    "kvarn_tier_evicted_blocks_total",
    "kvarn_tier_hit_tokens_total",
    "kvarn_tier_lookups_total",
    "kvarn_tier_onboard_failures_total",
    "kvarn_tier_onboarded_blocks_total",
    "kvarn_tier_read_bytes_total",
    "kvarn_tier_rejected_blocks_total",
    "kvarn_tier_spill_dropped_total",
    "kvarn_tier_spilled_blocks_total",
    "kvarn_tier_write_queue_blocks",
    "kvarn_tier_write_queue_bytes",
    "kvarn_tier_written_blocks_total",
    "kvarn_tier_written_bytes_total",
    "kvarn_whatif_prefix_hit_tokens_total",
]
HISTOGRAMS = [
    "kvarn_rpc_duration_seconds",
    "kvarn_sampled_quantization_error_ratio",
    "kvarn_seal_duration_seconds",
    "kvarn_tier_onboard_seconds_per_block",
]
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def known_series_names():
    names = set(COUNTERS_AND_GAUGES)
    for h in HISTOGRAMS:
        names.update(h + s for s in HISTOGRAM_SUFFIXES)
    return names


# Variables Grafana defines itself.
GRAFANA_BUILTINS = {
    "__all", "__auto", "__interval", "__interval_ms", "__rate_interval", "__rate_interval_ms",
    "__range", "__range_s", "__range_ms", "__dashboard", "__from", "__to", "__name", "__org",
    "__user", "timeFilter", "__timeFilter",
}

# $name, ${name}, ${name:format}, [[name]]
VARIABLE_RE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)\]\]|\$(\w+)")
LEGEND_LABEL_RE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
METRIC_TOKEN_RE = re.compile(r"\b(kvarn[_:][A-Za-z0-9_:]*)")


def load_dashboard(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_panels(dashboard):
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        for inner in panel.get("panels", []) or []:
            yield inner


def query_panels(dashboard):
    return [p for p in iter_panels(dashboard) if p.get("type") != "row"]


def variables(dashboard):
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def variable_query(var):
    q = var.get("query")
    if isinstance(q, dict):
        return q.get("query", "")
    return q or ""


def referenced_variables(text):
    names = []
    for m in VARIABLE_RE.finditer(text):
        names.append(next(g for g in m.groups() if g))
    return names


def substitute(text, values):
    """Replaces Grafana variables as Grafana would interpolate them into a query."""

    def repl(m):
        name = next(g for g in m.groups() if g)
        if name not in values:
            raise KeyError(f"no value for variable {name!r} in {text!r}")
        return values[name]

    return VARIABLE_RE.sub(repl, text)


def render_legend(fmt, labels):
    return LEGEND_LABEL_RE.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()


def rule_names(rules_text):
    """(group names, record names, alert names) of a rules file, read line by line (the
    standard library has no YAML parser; the shipped file keeps one key per line)."""
    groups = re.findall(r"^\s*-\s*name:\s*(\S+)\s*$", rules_text, re.M)
    records = re.findall(r"^\s*-\s*record:\s*(\S+)\s*$", rules_text, re.M)
    alerts = re.findall(r"^\s*-\s*alert:\s*(\S+)\s*$", rules_text, re.M)
    return groups, records, alerts


def alert_blocks(rules_text):
    """{alert name: the text of its rule}, for line-level checks of each alert."""
    blocks = {}
    current = None
    for line in rules_text.splitlines():
        m = re.match(r"^\s*-\s*(alert|record):\s*(\S+)\s*$", line)
        if m:
            current = m.group(2) if m.group(1) == "alert" else None
            if current:
                blocks[current] = []
            continue
        if re.match(r"^\s*-\s*name:", line):
            current = None
        if current:
            blocks[current].append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def strip_comments(yaml_text):
    return "\n".join(line for line in yaml_text.splitlines() if not line.lstrip().startswith("#"))
