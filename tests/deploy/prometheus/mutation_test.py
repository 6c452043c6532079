#!/usr/bin/env python3
"""Shows that the promtool unit tests catch broken rules: each mutation below breaks one rule
of a copy of deploy/prometheus/kvarnd-rules.yml the way a plausible edit would (a join
without `on`, a threshold, a `for`, a missing fallback, a wrong label) and promtool's unit
tests must then fail. The unmutated copy must pass first.

Usage: mutation_test.py --source-dir REPO [--promtool PATH]
"""

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile

TESTS = ["records_test.yml", "alerts_test.yml"]
RULES = "deploy/prometheus/kvarnd-rules.yml"
TEST_DIR = "tests/deploy/prometheus"

# (what it breaks, text in the rules file, replacement). Each text occurs exactly once.
MUTATIONS = [
    ("pool alert: 'and' without on(job, instance) (the original bug)",
     "and on (job, instance)\n          rate(kvarn_evictions_total", "and\n          rate(kvarn_evictions_total"),
    ("pool alert: usage threshold", 'kvarn:pool_class_usage_ratio{class=~"quant|sink"}) > 0.95', 'kvarn:pool_class_usage_ratio{class=~"quant|sink"}) > 0.995'),
    ("pool alert: the whole pool's usage ratio (tail included)",
     'max without (class) (kvarn:pool_class_usage_ratio{class=~"quant|sink"}) > 0.95', "kvarn_pool_usage_ratio > 0.95"),
    ("pool alert: the emptiest class", "max without (class) (kvarn:pool_class_usage_ratio", "min without (class) (kvarn:pool_class_usage_ratio"),
    ("class usage: used share inverted", "1 - kvarn_pool_bytes{state=\"free\"}", "kvarn_pool_bytes{state=\"free\"}"),
    ("class usage: empty classes divide by 0", "/ ignoring (state) (kvarn_pool_capacity_bytes > 0)", "/ ignoring (state) kvarn_pool_capacity_bytes"),
    ("pool alert: eviction reason", 'kvarn_evictions_total{reason="allocation"}', 'kvarn_evictions_total{reason=~"allocation|watermark"}'),
    ("pool alert: for", "for: 10m\n        labels:\n          severity: warning\n        annotations:\n          summary: \"kvarnd {{ $labels.instance }} is",
     "for: 1m\n        labels:\n          severity: warning\n        annotations:\n          summary: \"kvarnd {{ $labels.instance }} is"),
    ("seal alert: threshold", "[5m])) > 0.05", "[5m])) > 0.1"),
    ("seal alert: summed over kinds",
     "histogram_quantile(0.99, rate(kvarn_seal_duration_seconds_bucket[5m]))",
     "histogram_quantile(0.99, sum without (kind) (rate(kvarn_seal_duration_seconds_bucket[5m])))"),
    ("rpc ratio: no 0 fallback when no error series exists",
     "            or\n              0 * sum without (method, code) (rate(kvarn_rpc_requests_total[5m]))\n", ""),
    ("rpc ratio: RESOURCE_EXHAUSTED not counted", "DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|", "DEADLINE_EXCEEDED|"),
    ("rpc ratio: NOT_FOUND counted", "UNIMPLEMENTED|ABORTED|OTHER", "UNIMPLEMENTED|ABORTED|OTHER|NOT_FOUND"),
    ("rpc ratio: aggregated across pods",
     "/ (sum without (method, code) (rate(kvarn_rpc_requests_total[5m])) > 0)",
     "/ on () group_left () (sum(rate(kvarn_rpc_requests_total[5m])) > 0)"),
    ("rpc alert: threshold", "kvarn:rpc_error_ratio:rate5m > 0.05", "kvarn:rpc_error_ratio:rate5m > 0.25"),
    ("hit ratio: idle pods give NaN", "/ (rate(kvarn_prefix_cache_queried_tokens_total[5m]) > 0)\n\n",
     "/ rate(kvarn_prefix_cache_queried_tokens_total[5m])\n\n"),
    ("what-if ratio: joined on() across pods", "/ ignoring (capacity_scale) group_left ()", "/ on () group_left ()"),
    ("effective capacity: tail slots counted", 'kvarn_pool_capacity_tokens{class=~"quant|sink"})', 'kvarn_pool_capacity_tokens)'),
    ("fp16 capacity: bytes per token from all classes", 'kvarn_pool_capacity_bytes{class=~"sink|tail"}', 'kvarn_pool_capacity_bytes'),
    ("cached tokens: sealing counted", 'kvarn_pool_tokens{class=~"quant|sink", state="cached"}', 'kvarn_pool_tokens{class=~"quant|sink", state=~"cached|sealing"}'),
    ("fit tokens: free only", 'state=~"free|cached"', 'state="free"'),
    ("sessions alert: threshold", "increase(kvarn_sessions_expired_total[15m]) > 2", "increase(kvarn_sessions_expired_total[15m]) > 1"),
    ("down alert: any job", 'up{job="kvarnd"} == 0', "up == 0"),
    ("down alert: for", "for: 2m\n        labels:\n          severity: critical", "for: 5m\n        labels:\n          severity: critical"),
    ("draining alert: for", "kvarn_draining > 0\n        for: 2m", "kvarn_draining > 0\n        for: 0m"),
    ("quant alert: margin", "> ignoring (method) 1.05 * kvarn:sampled_quantization_error_ratio:mean30m{method=\"hadamard\"}",
     "> ignoring (method) 1.5 * kvarn:sampled_quantization_error_ratio:mean30m{method=\"hadamard\"}"),
    ("quant alert: no margin for kivi", "> ignoring (method) 1.05 * kvarn:sampled_quantization_error_ratio:mean30m{method=\"kivi\"}",
     "> ignoring (method) kvarn:sampled_quantization_error_ratio:mean30m{method=\"kivi\"}"),
    ("quant alert: no sample-count guard", "[30m]) >= 50", "[30m]) >= 0"),
    ("quant error mean: sum over count swapped", "rate(kvarn_sampled_quantization_error_ratio_sum[30m])\n            / (rate(kvarn_sampled_quantization_error_ratio_count[30m]) > 0)",
     "rate(kvarn_sampled_quantization_error_ratio_count[30m])\n            / (rate(kvarn_sampled_quantization_error_ratio_sum[30m]) > 0)"),
    ("tenant alert: for", "rate(kvarn_tenant_quota_rejections_total[5m]) > 0\n        for: 15m",
     "rate(kvarn_tenant_quota_rejections_total[5m]) > 0\n        for: 2m"),
    ("runbook anchor", "docs/operations.md#kvarnddown", "docs/operations.md#kvarnd-down"),
]


def run_tests(promtool, root):
    r = subprocess.run([promtool, "test", "rules"] + TESTS, cwd=os.path.join(root, TEST_DIR),
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def make_tree(base, source_dir, rules_text):
    """A copy of the rules and the unit tests at their relative paths under base."""
    os.makedirs(os.path.join(base, TEST_DIR))
    os.makedirs(os.path.join(base, os.path.dirname(RULES)))
    for t in TESTS:
        shutil.copy(os.path.join(source_dir, TEST_DIR, t), os.path.join(base, TEST_DIR, t))
    with open(os.path.join(base, RULES), "w") as f:
        f.write(rules_text)
    return base


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--promtool", default="promtool")
    a = ap.parse_args()
    original = open(os.path.join(a.source_dir, RULES), encoding="utf-8").read()
    failures = []
    with tempfile.TemporaryDirectory(prefix="kvprom-mutation.") as root:
        rc, out = run_tests(a.promtool, make_tree(os.path.join(root, "original"), a.source_dir, original))
        if rc != 0:
            print("FAIL: the unmutated rules do not pass their unit tests:\n" + out)
            return 1
        print("ok: unmutated rules pass")

        def attempt(i):
            what, old, new = MUTATIONS[i]
            n = original.count(old)
            if n != 1:
                return f"{what}: the text to mutate occurs {n} times (the rules changed; update the mutation)", None
            tree = make_tree(os.path.join(root, f"m{i}"), a.source_dir, original.replace(old, new))
            rc, out = run_tests(a.promtool, tree)
            if rc == 0:
                return f"{what}: the unit tests still pass on the mutated rules", None
            failed = [line.strip() for line in out.splitlines() if line.strip().startswith(("name:", "expr:"))]
            return None, f"ok: caught '{what}' ({'; '.join(failed[:2]) or out.strip().splitlines()[-1]})"

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            for failure, message in pool.map(attempt, range(len(MUTATIONS))):
                if failure:
                    failures.append(failure)
                else:
                    print(message)
    for f in failures:
        print("FAIL:", f)
    print(f"mutations: {len(MUTATIONS) - len(failures)} of {len(MUTATIONS)} caught")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
