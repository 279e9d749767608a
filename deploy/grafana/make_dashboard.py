#!/usr/bin/env python3
"""Writes paramserver.json, the Grafana dashboard of the parameter server's
metrics (docs/observability.md). Edit the panels here and run it again:
    python3 deploy/grafana/make_dashboard.py
tests/prometheus_test.py checks that every metric name the expressions use
is exposed by a running job, and that every expression evaluates."""
import json
import os

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
R = "$__rate_interval"

panels = []
y = 0


def row(title):
    global y
    panels.append({"type": "row", "title": title, "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                   "id": len(panels) + 1, "panels": []})
    y += 1


def ts(title, targets, unit="short", w=8, h=8, x=0, desc="", stat=False):
    panels.append({
        "type": "stat" if stat else "timeseries",
        "title": title,
        "description": desc,
        "id": len(panels) + 1,
        "datasource": DS,
        "gridPos": {"h": h, "w": w, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom",
                               "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}}
        if not stat else {"reduceOptions": {"calcs": ["lastNotNull"],
                                            "fields": "", "values": False},
                          "colorMode": "value", "graphMode": "area"},
        "targets": [{"datasource": DS, "expr": e, "legendFormat": l,
                     "refId": chr(ord("A") + i)}
                    for i, (e, l) in enumerate(targets)],
    })


def line(*specs):
    """Panels side by side, 24 columns shared."""
    global y
    w = 24 // len(specs)
    for i, (args, kw) in enumerate(specs):
        ts(*args, w=w, x=i * w, **kw)
    y += 8


def P(*args, **kw):
    return (args, kw)


row("Job")
line(
    P("Examples / s", [
        (f"sum(rate(ps_worker_examples_total[{R}]))", "all workers"),
        (f"rate(ps_worker_examples_total[{R}])", "{{node}}"),
    ], unit="short", desc="rate of ps_worker_examples_total"),
    P("Worker clock", [
        ("ps_worker_clock", "{{node}}"),
        ("ps_scheduler_worker_clock", "W[{{worker}}] (scheduler's view)"),
    ], desc="clocks completed (SSP keeps them within tau)"),
    P("Share of time waiting on the network", [
        (f"rate(ps_worker_wait_seconds_total[{R}])", "{{node}}"),
        ("ps_worker_wait_share", "{{node}} since start"),
    ], unit="percentunit",
      desc="seconds blocked in Wait per second; the rest is computing"),
)
line(
    P("Failovers", [("ps_scheduler_failovers_total", "failovers")],
      stat=True, desc="servers failed over to their backups"),
    P("Nodes", [("sum by (role, state) (ps_scheduler_nodes)",
                 "{{role}} {{state}}")],
      desc="as the scheduler sees them"),
    P("Serving (health)", [("ps_node_serving", "{{node}}")],
      desc="1 while a node's gRPC health / /healthz say SERVING"),
)
row("Servers: push and pull")
line(
    P("Push requests / s (server)", [
        (f"sum by (node, table) (rate(ps_server_push_requests_total[{R}]))",
         "{{node}} table {{table}}"),
        (f"sum by (node) (rate(ps_server_push_errors_total[{R}]))",
         "{{node}} errors"),
    ], unit="reqps"),
    P("Pull requests / s (server)", [
        (f"sum by (node, table) (rate(ps_server_pull_requests_total[{R}]))",
         "{{node}} table {{table}}"),
        (f"sum by (node) (rate(ps_server_pull_errors_total[{R}]))",
         "{{node}} errors"),
    ], unit="reqps"),
    P("Bytes / s (server)", [
        (f"sum by (node) (rate(ps_server_push_bytes_total[{R}]))",
         "{{node}} push"),
        (f"sum by (node) (rate(ps_server_pull_bytes_total[{R}]))",
         "{{node}} pull"),
    ], unit="Bps"),
)
line(
    P("Push latency (server handler)", [
        ("histogram_quantile(0.5, sum by (le, node) "
         f"(rate(ps_server_push_latency_seconds_bucket[{R}])))", "{{node}} p50"),
        ("histogram_quantile(0.99, sum by (le, node) "
         f"(rate(ps_server_push_latency_seconds_bucket[{R}])))", "{{node}} p99"),
    ], unit="s"),
    P("Pull latency (server, consistency wait included)", [
        ("histogram_quantile(0.5, sum by (le, node) "
         f"(rate(ps_server_pull_latency_seconds_bucket[{R}])))", "{{node}} p50"),
        ("histogram_quantile(0.99, sum by (le, node) "
         f"(rate(ps_server_pull_latency_seconds_bucket[{R}])))", "{{node}} p99"),
    ], unit="s"),
    P("Request size (server, median)", [
        ("histogram_quantile(0.5, sum by (le, node) "
         f"(rate(ps_server_push_size_bytes_bucket[{R}])))", "{{node}} push"),
        ("histogram_quantile(0.5, sum by (le, node) "
         f"(rate(ps_server_pull_size_bytes_bucket[{R}])))", "{{node}} pull"),
    ], unit="bytes"),
)
line(
    P("Keys stored", [("sum by (node, table) (ps_server_keys)",
                       "{{node}} table {{table}}")]),
    P("Key ranges owned", [("ps_server_ranges", "{{node}}")]),
    P("Per-worker clock on the servers", [
        ("min by (worker) (ps_server_worker_clock)", "W[{{worker}}]")],
      desc="lowest clock each worker completed on the servers' ranges"),
)
row("Workers: push and pull")
line(
    P("Push / pull requests / s (worker)", [
        (f"sum by (node) (rate(ps_worker_push_requests_total[{R}]))",
         "{{node}} push"),
        (f"sum by (node) (rate(ps_worker_pull_requests_total[{R}]))",
         "{{node}} pull"),
    ], unit="reqps"),
    P("Push / pull latency p99 (worker, all servers)", [
        ("histogram_quantile(0.99, sum by (le, node) "
         f"(rate(ps_worker_push_latency_seconds_bucket[{R}])))", "{{node}} push"),
        ("histogram_quantile(0.99, sum by (le, node) "
         f"(rate(ps_worker_pull_latency_seconds_bucket[{R}])))", "{{node}} pull"),
    ], unit="s"),
    P("Bytes / s (worker)", [
        (f"sum by (node) (rate(ps_worker_push_bytes_total[{R}]))",
         "{{node}} push"),
        (f"sum by (node) (rate(ps_worker_pull_bytes_total[{R}]))",
         "{{node}} pull"),
    ], unit="Bps"),
)
row("Processes")
line(
    P("Resident memory", [("process_resident_memory_bytes", "{{node}}")],
      unit="bytes"),
    P("CPU", [(f"rate(process_cpu_seconds_total[{R}])", "{{node}}")],
      unit="percentunit", desc="cores used"),
    P("Threads", [("process_threads", "{{node}}")]),
)

dashboard = {
    "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus",
                  "type": "datasource", "pluginId": "prometheus",
                  "pluginName": "Prometheus"}],
    "__requires": [{"type": "datasource", "id": "prometheus",
                    "name": "Prometheus", "version": "1.0.0"}],
    "title": "Parameter server",
    "uid": "paramserver",
    "description": "Push/pull traffic and latency by table, keys, clocks, "
                   "wait share, examples/s, failovers, memory "
                   "(docs/observability.md). Scrape targets need a `node` "
                   "label (ps_launch's metrics_targets.json has it).",
    "tags": ["paramserver"],
    "timezone": "browser",
    "schemaVersion": 36,
    "version": 1,
    "refresh": "5s",
    "time": {"from": "now-15m", "to": "now"},
    "templating": {"list": []},
    "annotations": {"list": []},
    "panels": panels,
}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                   "paramserver.json")
with open(out, "w") as f:
    json.dump(dashboard, f, indent=2)
    f.write("\n")
print(f"wrote {out}: {len(panels)} panels")
