#!/usr/bin/env python3
"""Issue 11: a real Prometheus scrapes a local cluster (ctest label prometheus).

Installs Debian's `prometheus` package when it is missing (apt-get, as root,
without starting the package's own service), starts a small synthetic job
with ps_launch, writes a scrape config for the metrics ports ps_launch
printed (one "metrics <node> http://host:port/metrics" line per process),
starts prometheus on a free loopback port with a temporary storage dir, and
reads back through its HTTP query API:
  * up == 1 for every node (scheduler, servers, workers);
  * a non-zero push rate, rate(ps_server_push_requests_total[5s]), for
    every server, and a non-zero examples rate for every worker;
  * every metric name the Grafana dashboard (deploy/grafana/) uses exists,
    and every dashboard expression evaluates;
  * every node's /healthz answers "serving".
Stops everything it started. Exits 77 (skipped) only when prometheus cannot
be installed.

usage: prometheus_test.py BIN_DIR SOURCE_DIR
"""
import json
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
import urllib.parse
import urllib.request

SKIP = 77
DEADLINE_S = 150  # for the whole test once prometheus is installed


def log(msg):
    print(f"[prometheus_test] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_prometheus():
    for p in (shutil.which("prometheus"), "/usr/bin/prometheus"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def install_prometheus():
    """apt-get install prometheus without letting its postinst start the
    packaged service (no systemd in a container, but the package also has a
    SysV init script that invoke-rc.d would run)."""
    if os.geteuid() != 0:
        log("prometheus is not installed and this is not root: cannot install")
        return None
    policy = "/usr/sbin/policy-rc.d"
    made_policy = False
    if not os.path.exists(policy):
        with open(policy, "w") as f:
            f.write("#!/bin/sh\n# prometheus_test: no service starts\nexit 101\n")
        os.chmod(policy, 0o755)
        made_policy = True
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    try:
        log("installing Debian's prometheus package (apt-get)")
        r = subprocess.run(["apt-get", *lock, "install", "-y", "-q",
                            "--no-install-recommends", "prometheus"],
                           env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=900)
        if r.returncode != 0:
            log("install failed, updating the package lists first")
            subprocess.run(["apt-get", *lock, "update", "-q"], env=env,
                           stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=600)
            r = subprocess.run(["apt-get", *lock, "install", "-y", "-q",
                                "--no-install-recommends", "prometheus"],
                               env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               timeout=900)
        if r.returncode != 0:
            log("apt-get install prometheus failed:\n" + r.stdout[-3000:])
            return None
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"apt-get install prometheus failed: {e}")
        return None
    finally:
        if made_policy:
            os.remove(policy)
    return find_prometheus()


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(base, expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    doc = json.loads(get(url))
    if doc.get("status") != "success":
        raise RuntimeError(f"query {expr}: {doc}")
    return doc["data"]["result"]


def dashboard_metric_names(path):
    """Every metric name the dashboard's PromQL expressions use."""
    with open(path) as f:
        dash = json.load(f)
    exprs = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "expr" and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(dash)
    names = set()
    for e in exprs:
        # Drop label matchers and range selectors, then take identifiers
        # that look like metric names of ours or of process_*.
        e = re.sub(r"\{[^}]*\}", "", e)
        e = re.sub(r"\[[^\]]*\]", "", e)
        for tok in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
            if tok.startswith(("ps_", "process_")):
                names.add(tok)
    return exprs, names


def screenshot(base, path, tmp):
    """docs/img: Prometheus's graph page for the running job, by headless
    Chromium (Debian's chromium package), after ~30 s of scrapes."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        log("no chromium: no screenshot")
        return
    time.sleep(30)
    params = {}
    graphs = [
        ("sum by (node) (rate(ps_server_push_requests_total[5s]))", "0"),
        ("sum by (node) (rate(ps_worker_examples_total[5s]))", "0"),
    ]
    for i, (expr, tab) in enumerate(graphs):
        params[f"g{i}.expr"] = expr
        params[f"g{i}.tab"] = tab
        params[f"g{i}.range_input"] = "1m"
        params[f"g{i}.show_exemplars"] = "0"
    url = f"{base}/graph?" + urllib.parse.urlencode(params)
    r = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu",
         "--hide-scrollbars", f"--user-data-dir={os.path.join(tmp, 'chrome')}",
         "--window-size=1400,1200", "--virtual-time-budget=15000",
         f"--screenshot={os.path.abspath(path)}", url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=120)
    log(f"screenshot {path}: chromium exit {r.returncode}")


class Procs:
    """Children of this test, each in its own process group."""

    def __init__(self):
        self.procs = []

    def start(self, args, **kw):
        p = subprocess.Popen(args, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bin_dir, source_dir = sys.argv[1], sys.argv[2]
    prom = find_prometheus() or install_prometheus()
    if prom is None:
        print("SKIPPED: Debian's prometheus package is not installed and "
              "cannot be installed here", flush=True)
        return SKIP
    log(f"using {prom}: " +
        subprocess.run([prom, "--version"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True).stdout
        .splitlines()[0])

    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="ps_prometheus_test.")
    procs = Procs()
    failures = []
    try:
        # 1. A job long enough to be scraped a few times: many small epochs
        # of synthetic data; the test stops it once it has what it needs.
        launch_out = open(os.path.join(tmp, "launch.log"), "w+")
        launch = procs.start(
            [os.path.join(bin_dir, "ps_launch"),
             "--config", os.path.join(source_dir, "deploy/configs/quickstart.yaml"),
             "--run-dir", os.path.join(tmp, "run"),
             "--set", "data.synthetic.train_rows=200000",
             "--set", "data.synthetic.test_rows=1000",
             "--set", "data.synthetic.features=20000",
             "--set", "training.epochs=1000",
             "--set", "training.minibatch=200",
             "--set", f"output.model_dir={os.path.join(tmp, 'model')}",
             "--set", "output.log_level=warn"],
            stdout=launch_out, stderr=subprocess.STDOUT)
        targets = {}  # node -> host:port
        want = 1 + 2 + 2  # quickstart: H, S[0..1], W[0..1]
        while len(targets) < want:
            if launch.poll() is not None:
                launch_out.seek(0)
                raise RuntimeError("ps_launch exited early:\n" +
                                   launch_out.read()[-4000:])
            if time.monotonic() - start > 60:
                raise RuntimeError("ps_launch printed no metrics ports")
            launch_out.seek(0)
            for line in launch_out.read().splitlines():
                m = re.match(r"ps_launch: metrics (\S+) http://(\S+)/metrics$",
                             line)
                if m:
                    targets[m.group(1)] = m.group(2)
            time.sleep(0.2)
        log(f"ps_launch printed {targets}")

        # 2. The scrape config and prometheus.
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: paramserver\n"
                    "    static_configs:\n")
            for node, addr in sorted(targets.items()):
                f.write(f"      - targets: ['{addr}']\n"
                        f"        labels: {{node: '{node}'}}\n")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        prom_log = open(os.path.join(tmp, "prometheus.log"), "w+")
        prom_proc = procs.start(
            [prom, f"--config.file={cfg}",
             f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
             f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=prom_log, stderr=subprocess.STDOUT)
        while True:
            try:
                get(f"{base}/-/ready", timeout=1)
                break
            except OSError:
                pass
            if prom_proc.poll() is not None:
                prom_log.seek(0)
                raise RuntimeError("prometheus exited:\n" +
                                   prom_log.read()[-4000:])
            if time.monotonic() - start > 90:
                raise RuntimeError("prometheus not ready in time")
            time.sleep(0.5)
        log(f"prometheus ready on {base}")

        # 3. What the test reads back.
        servers = sorted(n for n in targets if n.startswith("S["))
        workers = sorted(n for n in targets if n.startswith("W["))
        exprs, names = dashboard_metric_names(
            os.path.join(source_dir, "deploy/grafana/paramserver.json"))
        checks_ok = False
        last = {}
        while time.monotonic() - start < DEADLINE_S:
            if launch.poll() is not None:
                launch_out.seek(0)
                raise RuntimeError("the job ended before the checks passed:\n" +
                                   launch_out.read()[-4000:])
            up = {r["metric"].get("node"): float(r["value"][1])
                  for r in query(base, 'up{job="paramserver"}')}
            push = {r["metric"].get("node"): float(r["value"][1])
                    for r in query(base, "sum by (node) "
                                   "(rate(ps_server_push_requests_total[5s]))")}
            ex = {r["metric"].get("node"): float(r["value"][1])
                  for r in query(base, "rate(ps_worker_examples_total[5s])")}
            missing = [n for n in names
                       if not query(base, f"count({{__name__=\"{n}\"}})")]
            last = {"up": up, "push rate": push, "examples rate": ex,
                    "dashboard metrics missing": missing}
            if (all(up.get(n) == 1 for n in targets) and
                    all(push.get(s, 0) > 0 for s in servers) and
                    all(ex.get(w, 0) > 0 for w in workers) and not missing):
                checks_ok = True
                break
            time.sleep(1)
        log(f"read back: {last}")
        # Every node's /healthz says serving while the job runs.
        for node, addr in sorted(targets.items()):
            try:
                body = get(f"http://{addr}/healthz").strip()
            except OSError as err:
                body = str(err)
            if body != "serving":
                failures.append(f"{node} /healthz: {body!r}")
        if not checks_ok:
            failures.append(f"not every check passed in {DEADLINE_S} s: {last}")
        else:
            for s in servers:
                log(f"{s}: push rate {push[s]:.1f}/s")
            log(f"every node up; {len(names)} dashboard metric names found "
                f"in {len(exprs)} expressions")
        shot = os.environ.get("PS_PROMETHEUS_SCREENSHOT")
        if shot and checks_ok:
            screenshot(base, shot, tmp)
        # The dashboard expressions themselves evaluate.
        for e in exprs:
            try:
                query(base, e.replace("$__rate_interval", "5s")
                      .replace("$__interval", "5s"))
            except Exception as err:  # noqa: BLE001
                failures.append(f"dashboard expression {e!r}: {err}")
    except Exception as e:  # noqa: BLE001
        failures.append(str(e))
    finally:
        procs.stop_all()
        elapsed = time.monotonic() - start
        if failures:
            for p in ("launch.log", "prometheus.log"):
                path = os.path.join(tmp, p)
                if os.path.exists(path):
                    with open(path) as f:
                        log(f"--- {p} (tail)\n" + f.read()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"took {elapsed:.1f} s")
    if failures:
        for f in failures:
            print(f"FAILED: {f}", flush=True)
        return 1
    print("PASSED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
