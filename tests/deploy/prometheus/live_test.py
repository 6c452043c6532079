#!/usr/bin/env python3
"""Live test of the shipped Prometheus config, rules and Grafana dashboard against two real
kvarnd daemons.

It starts two kvarnd (Unix sockets in a temporary directory, metrics on ephemeral ports, one
tenants file with a tenant "demo" and a tenant "capped" whose session quota is 0, a disk tier
each and one real memcached shared by both), drives them with `kvarnctl demo` (plus a client
SIGKILLed mid-demo on each, so sessions expire; `kvarnctl status` as "capped", so quotas
refuse; `kvarnctl evict` of the demo tenant after each demo, so the next one onboards from
the tiers), and starts Debian's Prometheus with the
shipped prometheus.yml and kvarnd-rules.yml, copied with only the targets (the two daemons,
labelled with a namespace and a pod each) and the intervals (1 s) rewritten. Then, each
condition polled until it holds or the deadline passes:
  - both targets are up, with their namespace and pod labels;
  - every metric kvarnd exports is scraped from both, with the label values the rules and the
    dashboard rely on, and each class's states add up to its capacity;
  - every rule group of the rules file is loaded, every rule's health is "ok" with no
    lastError, and every recording rule has a series for each daemon;
  - every dashboard variable query returns both daemons' values;
  - every dashboard panel query, with the variables substituted as Grafana would ($namespace,
    $pod, $instance: '.*'; $__rate_interval: 1m), succeeds and returns a finite value for each
    daemon, and its legends are distinct (no two series of a panel render the same legend);
  - the killed clients' sessions expired and the capped tenant's refusals were counted.

Usage: live_test.py --kvarnd BIN --kvarnctl BIN --source-dir REPO [--prometheus BIN] [--memcached BIN]
                    [--rules FILE] [--dashboard FILE] [--config FILE] [--deadline S] [--keep]
"""

import argparse
import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_lib as lib  # noqa: E402

NAMESPACE = "kvarn-live"
PODS = ("kvarnd-a", "kvarnd-b")
DEMO_TOKEN = "live-test-demo-token"
CAPPED_TOKEN = "live-test-capped-token"
RATE_INTERVAL = "1m"
# Label values the rules and the dashboard expect (the daemon's contract).
EXPECTED_LABELS = {
    "kvarn_sampled_quantization_error_ratio_count": ("method", {"kvarn", "hadamard", "kivi"}),
    "kvarn_whatif_prefix_hit_tokens_total": ("capacity_scale", {"0.5", "1", "2", "4"}),
    "kvarn_pool_capacity_bytes": ("class", {"quant", "sink", "tail"}),
    "kvarn_pool_capacity_tokens": ("class", {"quant", "sink", "tail"}),
    "kvarn_pool_huge_page_bytes": ("class", {"quant", "sink", "tail"}),
    "kvarn_seal_duration_seconds_count": ("kind", {"quant", "sink"}),
    "kvarn_evictions_total": ("reason", {"allocation", "watermark", "request", "quota"}),
    "kvarn_seals_total": ("kind", {"quant", "sink", "dedup"}),
    "kvarn_tier_blocks": ("tier", {"disk", "memcached"}),
    "kvarn_tier_lookups_total": ("result", {"hit", "miss"}),
    "kvarn_tier_rejected_blocks_total": ("reason", {"truncated", "corrupt", "foreign", "wrong_key"}),
}
# Shared by both daemons: it salts the prefix hashes and keys the tier records' MAC, so a
# block one daemon wrote to memcached is the other's too.
SALT_SECRET = "live-test-salt"
EXPECTED_POOL_STATES = {
    "quant": {"free", "active", "cached", "sealing"},
    "sink": {"free", "active", "cached", "sealing"},
    "tail": {"free", "reserved", "retained"},
}


T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f} s] {msg}", flush=True)


_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """In the child before exec: SIGKILL when the test process dies (a ctest timeout)."""
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(args, stdout, stderr):
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            preexec_fn=die_with_parent)


def stop(procs, timeout=10.0):
    """SIGTERM to all, then SIGKILL to those still running after the timeout."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    until = time.monotonic() + timeout
    for p in live:
        try:
            p.wait(max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what, deadline, fn, interval=0.25):
    """Calls fn() until it returns (True, detail) or the deadline passes; returns (ok, detail)."""
    detail = None
    while True:
        try:
            ok, detail = fn()
        except (urllib.error.URLError, ConnectionError, OSError, ValueError, KeyError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"
        if ok:
            return True, detail
        if time.monotonic() > deadline:
            return False, f"{what}: not met by the deadline: {detail}"
        time.sleep(interval)


def scrape_value(text, name):
    m = re.search(rf"^{re.escape(name)}(?:\{{\}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


class Memcached:
    """A real memcached on loopback: the shared tier of both daemons."""

    def __init__(self, binary, tmp):
        self.port = free_port()
        self.log_file = open(os.path.join(tmp, "memcached.log"), "w")
        args = [binary, "-l", "127.0.0.1", "-p", str(self.port), "-U", "0", "-m", "64"]
        if os.geteuid() == 0:
            args += ["-u", "root"]
        self.proc = spawn(args, self.log_file, self.log_file)
        self.address = f"127.0.0.1:{self.port}"

    def wait_started(self, deadline):
        def answers():
            if self.proc.poll() is not None:
                raise ValueError(f"memcached exited ({self.proc.returncode})")
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as c:
                c.sendall(b"version\r\n")
                return c.recv(64).startswith(b"VERSION"), "version"
        return wait_for("memcached start", deadline, answers, 0.05)


class Daemon:
    def __init__(self, kvarnd, tmp, name, tenants_file, memcached):
        self.name = name
        self.sock = os.path.join(tmp, f"{name}.sock")
        self.log_path = os.path.join(tmp, f"{name}.log")
        self.log_file = open(self.log_path, "w")
        self.proc = spawn([
            kvarnd, f"--listen={self.sock}", "--metrics=127.0.0.1:0", f"--instance=live-{os.getpid()}-{name}",
            "--model_id=live-model", "--num_layers=2", "--num_kv_heads=2", "--head_dim=64",
            "--preset=kvarn_k4v2_g64", "--sink_tokens=64", "--capacity=16MiB", "--default_tail_slots=8",
            "--grace_ms=100", f"--tenants_file={tenants_file}", "--log_level=info",
            f"--disk_tier_dir={os.path.join(tmp, name + '-disk')}", "--disk_tier_bytes=64MiB",
            f"--memcached_servers={memcached}", f"--tenant_salt_secret={SALT_SECRET}",
        ], self.log_file, self.log_file)
        self.metrics_port = None

    def wait_started(self, deadline):
        def started():
            if self.proc.poll() is not None:
                raise ValueError(f"kvarnd {self.name} exited ({self.proc.returncode}): {open(self.log_path).read()}")
            m = re.search(r"event=kvarnd_started .*\bmetrics_port=(\d+)", open(self.log_path).read())
            if m:
                self.metrics_port = int(m.group(1))
            return m is not None, open(self.log_path).read()[-500:]
        return wait_for(f"kvarnd {self.name} start", deadline, started, 0.05)

    @property
    def target(self):
        return f"127.0.0.1:{self.metrics_port}"

    def metric(self, name):
        return scrape_value(http_get(f"http://{self.target}/metrics"), name)


class Prometheus:
    def __init__(self, binary, tmp, port, config):
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(tmp, "prometheus.log")
        self.log_file = open(self.log_path, "w")
        self.proc = spawn([binary, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                          self.log_file, self.log_file)

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            body = http_get(url)
        except urllib.error.HTTPError as e:
            body = e.read().decode()
        reply = json.loads(body)
        if reply.get("status") != "success":
            raise ValueError(f"{path} {params}: {reply.get('errorType')}: {reply.get('error')}")
        return reply["data"]

    def query(self, expr):
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise ValueError(f"{expr}: result type {data['resultType']}")
        return data["result"]


def rewrite_config(text, rules_name):
    """The shipped config with only the targets and intervals changed; every edit must apply
    exactly once, so a changed shipped file fails here instead of testing something else."""
    edits = [
        ("scrape_interval: 15s", "scrape_interval: 1s"),
        ("scrape_timeout: 10s", "scrape_timeout: 1s"),
        ("evaluation_interval: 15s", "evaluation_interval: 1s"),
        ('- targets: ["127.0.0.1:9464"]', "- targets: []"),
        ("- kvarnd-rules.yml", f"- {rules_name}"),
    ]
    for old, new in edits:
        n = text.count(old)
        if n != 1:
            raise ValueError(f"prometheus.yml: expected {old!r} once, found it {n} times")
        text = text.replace(old, new)
    if "kvarnd-targets.json" not in text:
        raise ValueError("prometheus.yml: no file_sd kvarnd-targets.json")
    return text


class Traffic(threading.Thread):
    """Short demos on both daemons and refused `status` calls as the capped tenant, in a loop,
    so that every rate the dashboard shows has recent samples."""

    def __init__(self, kvarnctl, daemons, demo_token, capped_token, tmp):
        super().__init__(daemon=True)
        self.kvarnctl, self.daemons = kvarnctl, daemons
        self.demo_token, self.capped_token = demo_token, capped_token
        self.stop_event = threading.Event()
        self.rounds = 0
        self.errors = []
        self.out = open(os.path.join(tmp, "traffic.log"), "w")

    def run(self):
        seed = 1
        while not self.stop_event.is_set():
            for d in self.daemons:
                demo = subprocess.run(
                    [self.kvarnctl, "demo", f"--target=unix:{d.sock}", "--tenant=demo",
                     f"--tenant-token-file={self.demo_token}", "--workers=3", "--requests=3",
                     "--decode-tokens=32", f"--seed={seed}"],
                    stdout=self.out, stderr=self.out, timeout=60, preexec_fn=die_with_parent)
                if demo.returncode != 0:
                    self.errors.append(f"demo on {d.name} exited {demo.returncode}")
                # The demo tenant gives up its cached blocks: they go to the disk tier, and the
                # next demo's shared prompts are onboarded from it (the tier panels' traffic).
                evict = subprocess.run([self.kvarnctl, "evict", f"--target=unix:{d.sock}", "--tenant=demo",
                                        f"--tenant-token-file={self.demo_token}"],
                                       stdout=self.out, stderr=self.out, timeout=30, preexec_fn=die_with_parent)
                if evict.returncode != 0:
                    self.errors.append(f"evict on {d.name} exited {evict.returncode}")
                subprocess.run([self.kvarnctl, "status", f"--target=unix:{d.sock}", "--tenant=capped",
                                f"--tenant-token-file={self.capped_token}"],
                               stdout=self.out, stderr=self.out, timeout=30, preexec_fn=die_with_parent)
                seed += 1
            self.rounds += 1
            self.stop_event.wait(0.5)


def kill_a_client(kvarnctl, d, token, tmp, deadline):
    """A demo client SIGKILLed while it holds sessions: the daemon must count them expired."""
    out = open(os.path.join(tmp, f"killed-client-{d.name}.log"), "w")
    before = d.metric("kvarn_sessions_expired_total") or 0
    proc = spawn([kvarnctl, "demo", f"--target=unix:{d.sock}", "--tenant=demo", f"--tenant-token-file={token}",
                  "--workers=2", "--requests=100000", "--decode-tokens=100000"], out, out)
    ok, detail = wait_for(f"{d.name}: killed client's sessions open", deadline,
                          lambda: ((d.metric("kvarn_sessions") or 0) >= 3, f"kvarn_sessions={d.metric('kvarn_sessions')}"))
    proc.kill()
    proc.wait()
    if not ok:
        return False, detail
    return wait_for(f"{d.name}: sessions expired after SIGKILL", deadline,
                    lambda: ((d.metric("kvarn_sessions_expired_total") or 0) > before,
                             f"kvarn_sessions_expired_total={d.metric('kvarn_sessions_expired_total')} (was {before})"))


class Results:
    def __init__(self):
        self.failures = []
        self.passed = []

    def record(self, name, ok, detail=""):
        (self.passed if ok else self.failures).append(f"{name}: {detail}" if detail else name)
        log(("PASS " if ok else "FAIL ") + name + ("" if ok or not detail else f": {detail}"))


def instance_set(result):
    return {s["metric"].get("instance") for s in result}


def check_metrics(prom, instances):
    missing = []
    for name in sorted(lib.known_series_names()):
        got = instance_set(prom.query(f'count by (instance) ({{__name__="{name}", job="kvarnd"}})'))
        if got != instances:
            missing.append(f"{name} (scraped from {sorted(got) or 'none'})")
    wrong = []
    for name, (label, values) in EXPECTED_LABELS.items():
        for inst in instances:
            got = {s["metric"].get(label) for s in prom.query(f'{name}{{job="kvarnd", instance="{inst}"}}')}
            if got != values:
                wrong.append(f"{name} on {inst}: {label} values {sorted(v or '' for v in got)}, want {sorted(values)}")
    for inst in instances:
        pairs = {}
        for s in prom.query(f'kvarn_pool_bytes{{job="kvarnd", instance="{inst}"}}'):
            pairs.setdefault(s["metric"].get("class"), set()).add(s["metric"].get("state"))
        if pairs != EXPECTED_POOL_STATES:
            wrong.append(f"kvarn_pool_bytes on {inst}: class/state {pairs}, want {EXPECTED_POOL_STATES}")
    for unit in ("bytes", "tokens"):
        for s in prom.query(f'abs(sum without (state) (kvarn_pool_{unit}{{job="kvarnd"}}) - kvarn_pool_capacity_{unit}) > 0'):
            wrong.append(f"kvarn_pool_{unit} states of class {s['metric'].get('class')} on {s['metric'].get('instance')} "
                         f"miss kvarn_pool_capacity_{unit} by {s['value'][1]}")
    for s in prom.query('sum without (class) (kvarn_pool_capacity_bytes{job="kvarnd"}) > kvarn_pool_configured_bytes'):
        wrong.append(f"capacity classes on {s['metric'].get('instance')} exceed kvarn_pool_configured_bytes")
    problems = ([f"missing: {', '.join(missing)}"] if missing else []) + wrong
    return not problems, "; ".join(problems) or f"{len(lib.known_series_names())} series names from both daemons"


def check_rules(prom, rules_text):
    groups, records, alerts = lib.rule_names(rules_text)
    data = prom.api("rules")
    loaded = {g["name"]: g for g in data["groups"]}
    problems = [f"group {g} not loaded" for g in groups if g not in loaded]
    seen = set()
    for g in data["groups"]:
        for r in g["rules"]:
            seen.add(r["name"])
            if r.get("health") != "ok" or r.get("lastError"):
                problems.append(f"{g['name']}/{r['name']}: health {r.get('health')!r} lastError {r.get('lastError')!r}")
            if r.get("lastEvaluation", "").startswith("0001-"):
                problems.append(f"{g['name']}/{r['name']}: not evaluated yet")
    problems += [f"rule {n} not loaded" for n in records + alerts if n not in seen]
    return not problems, "; ".join(problems) or f"{len(groups)} groups, {len(records)} records, {len(alerts)} alerts ok"


def check_records(prom, rules_text, instances):
    _, records, _ = lib.rule_names(rules_text)
    problems = []
    for r in records:
        got = instance_set(prom.query(r))
        if got != instances:
            problems.append(f"{r}: series for {sorted(got) or 'no daemon'}")
    return not problems, "; ".join(problems) or f"{len(records)} recorded series for both daemons"


def check_variables(prom, dash, expected):
    problems = []
    for name in ("namespace", "pod", "instance"):
        q = lib.substitute(lib.variable_query(lib.variables(dash)[name]), {"namespace": ".*", "pod": ".*", "instance": ".*"})
        m = re.match(r"^label_values\((.*),\s*(\w+)\s*\)$", q)
        if not m:
            problems.append(f"variable {name}: cannot read {q!r}")
            continue
        got = set(prom.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)}))
        if got != expected[name]:
            problems.append(f"variable {name}: {q} gives {sorted(got)}, want {sorted(expected[name])}")
    return not problems, "; ".join(problems) or "namespace, pod, instance"


def check_panel(prom, panel, instances):
    values = {"namespace": ".*", "pod": ".*", "instance": ".*", "__rate_interval": RATE_INTERVAL,
              "__interval": "15s", "__range": "1h", "datasource": ""}
    problems = []
    legends = []
    for t in panel["targets"]:
        expr = lib.substitute(t["expr"], values)
        try:
            result = prom.query(expr)
        except ValueError as e:
            problems.append(f"{t['refId']}: {e}")
            continue
        finite = {s["metric"].get("instance") for s in result if math.isfinite(float(s["value"][1]))}
        if finite != instances:
            problems.append(f"{t['refId']}: finite values for {sorted(i or '' for i in finite) or 'no daemon'} "
                            f"({len(result)} series) from {expr}")
        legends += [lib.render_legend(t.get("legendFormat", ""), s["metric"]) for s in result]
    dupes = sorted({l for l in legends if legends.count(l) > 1})
    if dupes:
        problems.append(f"legends collide: {dupes[:3]}")
    return not problems, "; ".join(problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvarnd", required=True)
    ap.add_argument("--kvarnctl", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--prometheus", default="/usr/bin/prometheus")
    ap.add_argument("--memcached", default=shutil.which("memcached") or "/usr/bin/memcached")
    ap.add_argument("--rules", help="rules file to load instead of the shipped one (to show the test fails)")
    ap.add_argument("--dashboard", help="dashboard to check instead of the shipped one")
    ap.add_argument("--config", help="prometheus.yml to start from instead of the shipped one")
    ap.add_argument("--deadline", type=float, default=90.0, help="seconds for all the waiting together")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, TSDB)")
    a = ap.parse_args()
    t0 = time.monotonic()
    deadline = t0 + a.deadline
    src = lambda p: os.path.join(a.source_dir, p)  # noqa: E731
    rules_path = a.rules or src("deploy/prometheus/kvarnd-rules.yml")
    config_path = a.config or src("deploy/prometheus/prometheus.yml")
    dash = lib.load_dashboard(a.dashboard or src("deploy/grafana/kvarnd-dashboard.json"))
    rules_text = open(rules_path, encoding="utf-8").read()

    tmp = tempfile.mkdtemp(prefix="kvprom-live.")
    daemons, prom, traffic, memcached = [], None, None, None
    res = Results()
    try:
        tokens = {}
        for name, token in (("demo", DEMO_TOKEN), ("capped", CAPPED_TOKEN)):
            tokens[name] = os.path.join(tmp, f"{name}.token")
            with open(tokens[name], "w") as f:
                f.write(token)
        tenants = os.path.join(tmp, "tenants")
        with open(tenants, "w") as f:
            f.write(f"demo token_sha256={hashlib.sha256(DEMO_TOKEN.encode()).hexdigest()} sessions=64\n")
            f.write(f"capped token_sha256={hashlib.sha256(CAPPED_TOKEN.encode()).hexdigest()} sessions=0\n")
        os.chmod(tenants, 0o600)

        memcached = Memcached(a.memcached, tmp)
        ok, detail = memcached.wait_started(deadline)
        if not ok:
            res.record("memcached starts", False, detail)
            return 1
        daemons = [Daemon(a.kvarnd, tmp, name, tenants, memcached.address) for name in ("a", "b")]
        for d in daemons:
            ok, detail = d.wait_started(deadline)
            if not ok:
                res.record(f"kvarnd {d.name} starts", False, detail)
                return 1
        log(f"kvarnd started: {', '.join(d.target for d in daemons)}")

        shutil.copy(rules_path, os.path.join(tmp, "kvarnd-rules.yml"))
        config = rewrite_config(open(config_path, encoding="utf-8").read(), "kvarnd-rules.yml")
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write(config)
        with open(os.path.join(tmp, "kvarnd-targets.json"), "w") as f:
            json.dump([{"targets": [d.target], "labels": {"namespace": NAMESPACE, "pod": pod}}
                       for d, pod in zip(daemons, PODS)], f)
        def start_prometheus():
            """Prometheus on a free port, ready (or exited: the port may have been taken
            between free_port() and its bind, then a second port is tried)."""
            for _ in range(2):
                p = Prometheus(a.prometheus, tmp, free_port(), os.path.join(tmp, "prometheus.yml"))
                ok, _ = wait_for("prometheus ready or exited", deadline, lambda: (
                    p.proc.poll() is not None or http_get(p.url + "/-/ready").strip() != "", "up"))
                if ok and p.proc.poll() is None:
                    return p
            return p
        prom = start_prometheus()

        for d in daemons:
            ok, detail = kill_a_client(a.kvarnctl, d, tokens["demo"], tmp, deadline)
            res.record(f"{d.name}: a SIGKILLed client's sessions expire", ok, detail)
        traffic = Traffic(a.kvarnctl, daemons, tokens["demo"], tokens["capped"], tmp)
        traffic.start()

        ok, detail = wait_for("prometheus ready", deadline,
                              lambda: (http_get(prom.url + "/-/ready").strip() != "", "ready"))
        if not ok or prom.proc.poll() is not None:
            res.record("prometheus starts", False, f"{detail}: {open(prom.log_path).read()[-2000:]}")
            return 1
        instances = {d.target for d in daemons}

        def targets_up():
            active = prom.api("targets", state="active")["activeTargets"]
            got = {(t["labels"].get("instance"), t["labels"].get("pod"), t["labels"].get("namespace"), t["health"])
                   for t in active if t["labels"].get("job") == "kvarnd"}
            want = {(d.target, pod, NAMESPACE, "up") for d, pod in zip(daemons, PODS)}
            return got == want, f"targets {sorted(got)}"
        ok, detail = wait_for("both targets up", deadline, targets_up)
        res.record("both kvarnd targets up with namespace and pod labels", ok, detail)
        log(f"targets up after {time.monotonic() - t0:.1f} s")

        ok, detail = wait_for("metrics", deadline, lambda: check_metrics(prom, instances), 1.0)
        res.record("every kvarnd metric scraped from both daemons, labels and sums as documented", ok, detail)
        ok, detail = wait_for("rules", deadline, lambda: check_rules(prom, rules_text), 0.5)
        res.record("every rule group loaded, every rule health ok", ok, detail)
        ok, detail = wait_for("records", deadline, lambda: check_records(prom, rules_text, instances), 0.5)
        res.record("every recording rule has a series per daemon", ok, detail)
        ok, detail = wait_for("variables", deadline, lambda: check_variables(
            prom, dash, {"namespace": {NAMESPACE}, "pod": set(PODS), "instance": instances}), 0.5)
        res.record("dashboard variables list both daemons", ok, detail)
        panels = lib.query_panels(dash)
        for p in panels:
            ok, detail = wait_for(p["title"], deadline, lambda p=p: check_panel(prom, p, instances), 0.5)
            res.record(f"panel {p['title']!r}", ok, detail)

        def counted(expr, what):
            got = instance_set(prom.query(expr))
            return got == instances, f"{what} on {sorted(got)}"
        ok, detail = wait_for("expired", deadline, lambda: counted('kvarn_sessions_expired_total{job="kvarnd"} > 0', "expired sessions"))
        res.record("expired sessions counted on both daemons", ok, detail)
        ok, detail = wait_for("refusals", deadline, lambda: counted(
            'kvarn_tenant_quota_rejections_total{job="kvarnd", tenant="capped", resource="sessions"} > 0', "refusals"))
        res.record("the capped tenant's refusals counted on both daemons", ok, detail)
        res.record("traffic ran without errors", not traffic.errors, "; ".join(traffic.errors[:3]))
        log(f"traffic: {traffic.rounds} rounds")
    except Exception as e:  # noqa: BLE001  (report, clean up, fail)
        res.record("live test ran", False, f"{type(e).__name__}: {e}")
    finally:
        if traffic is not None:
            traffic.stop_event.set()
            traffic.join(60)
        stop([prom.proc if prom else None] + [d.proc for d in daemons])
        stop([memcached.proc if memcached else None])
        if a.keep:
            log(f"kept {tmp}")
        elif res.failures:
            shutil.rmtree(os.path.join(tmp, "data"), ignore_errors=True)
            log(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    print(f"live test: {len(res.passed)} passed, {len(res.failures)} failed in {elapsed:.1f} s")
    for f in res.failures:
        print("FAIL:", f)
    return 1 if res.failures else 0


if __name__ == "__main__":
    sys.exit(main())
