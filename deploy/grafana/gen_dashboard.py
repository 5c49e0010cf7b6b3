#!/usr/bin/env python3
"""Writes qosd.json, the Grafana dashboard, beside this script.

Edit here rather than in the JSON, then run `python3 gen_dashboard.py`.
manager/tests/deploy_grafana.rs checks that each expression in qosd.json names
only metrics a live `qosd run` exports and that a real Prometheus evaluates it.
"""
import json
import os
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance",app=~"$app"'
panels = []
y = 0
def row(title):
    global y
    panels.append({"type": "row", "title": title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "id": len(panels) + 1, "panels": []})
    y += 1
def ts(title, desc, unit, targets, x, w=12, h=8, kind="timeseries", extra=None):
    p = {"type": kind, "title": title, "description": desc, "datasource": DS,
         "gridPos": {"h": h, "w": w, "x": x, "y": y}, "id": len(panels) + 1,
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
         "targets": [dict(refId=chr(65 + i), datasource=DS, expr=e, legendFormat=l) for i, (e, l) in enumerate(targets)]}
    if extra: p.update(extra)
    panels.append(p)
def nl(h=8):
    global y
    y += h

row("Latency and load")
ts("Latency vs target", "Each latency-critical app's latency at its target's quantile (over the last decision interval), and the target.", "s", [
    (f'qosd_app_latency_seconds{{{SEL}}} and on(instance, app, quantile) qosd_app_latency_target_seconds', "{{app}} p{{quantile}} ({{instance}})"),
    (f'qosd_app_latency_target_seconds{{{SEL}}}', "{{app}} target ({{instance}})"),
], 0)
ts("Latency percentiles", "p50, p95 and p99 of every app over the last decision interval.", "s", [
    (f'qosd_app_latency_seconds{{{SEL},quantile=~"0.5|0.95|0.99"}}', "{{app}} p{{quantile}} ({{instance}})"),
], 12)
nl()
ts("Requests per second", "Completed requests per second, from the request counter.", "reqps", [
    (f'rate(qosd_app_requests_total{{{SEL}}}[$__rate_interval])', "{{app}} ({{instance}})"),
], 0)
ts("Slack", "PARTIES slack (target - latency) / target: below 0.05 an app is upsized, above 0.20 it may be downsized.", "percentunit", [
    (f'qosd_app_slack_ratio{{{SEL}}}', "{{app}} ({{instance}})"),
], 12)
nl()
row("Allocations")
ts("Cores", "Physical cores given to each app.", "short", [
    (f'qosd_app_cores{{{SEL}}}', "{{app}} ({{instance}})")], 0, w=6)
ts("Frequency", "Frequency set on each app's cores (only where cpufreq is in use).", "hertz", [
    (f'qosd_app_frequency_hertz{{{SEL}}}', "{{app}} ({{instance}})")], 6, w=6)
ts("LLC ways", "Last-level-cache ways given to each app (resctrl or pqos).", "short", [
    (f'qosd_app_llc_ways{{{SEL}}}', "{{app}} ({{instance}})")], 12, w=6)
ts("Memory bandwidth", "Memory-bandwidth throttle of each app (resctrl MB).", "percentunit", [
    (f'qosd_app_memory_bandwidth_ratio{{{SEL}}}', "{{app}} ({{instance}})")], 18, w=6)
nl()
ts("CPU quota", "CPU bandwidth (CFS quota: cgroup v2 cpu.max or v1 cpu.cfs_quota_us) of each app, in CPUs; only where actuators.enabled lists cpu_quota.", "short", [
    (f'qosd_app_cpu_quota_cpus{{{SEL}}}', "{{app}} ({{instance}})")], 0, w=8)
ts("CPU utilisation", "Share of its CPUs each app used, and the node's busy share.", "percentunit", [
    (f'qosd_app_cpu_utilization_ratio{{{SEL}}}', "{{app}} ({{instance}})"),
    ('qosd_node_cpu_utilization_ratio{instance=~"$instance"}', "node ({{instance}})"),
], 8, w=8)
ts("Knobs in use", "1 when the policy turns the knob on that node; 0 when the node lacks it or the config disables it.", "short", [
    ('qosd_knob_in_use{instance=~"$instance"}', "{{resource}} via {{backend}} ({{instance}})"),
], 16, w=8, extra={"options": {"legend": {"displayMode": "table", "placement": "right"}}})
nl()
row("Best-effort work")
ts("Best-effort throughput", "Operations per second of each best-effort app's batch job (a config `job:` qosd runs) over the last decision interval: what the latency-critical apps leave goes here. 0 while the job is restarting. Empty where no app runs a `job:`.", "ops", [
    (f'qosd_app_be_ops_per_second{{{SEL}}}', "{{app}} ({{instance}})")], 0)
ts("CPU used", "CPUs each app's processes used (CPU seconds per second, from the kernel's count): the CPU a best-effort job got, beside its quota.", "short", [
    (f'rate(qosd_app_cpu_seconds_total{{{SEL}}}[$__rate_interval])', "{{app}} ({{instance}})")], 12)
nl()
ts("CPU priority", "CPU priority class of each app's group: 1 the idle class (cpu.idle, else the lowest weight: a best-effort app yields the CPU to latency-critical threads at once), 2 normal weight; only where actuators.enabled lists cpu_priority.", "short", [
    (f'qosd_app_cpu_priority{{{SEL}}}', "{{app}} ({{instance}})")], 0)
nl()
row("Power")
NO_POWER = " Empty where qosd runs with sensors.power: false or cannot load its sched_switch program (see qosd's startup banner)."
ts("Power", "Power attributed to each app and the node's; estimate=\"true\" when it comes from qosd's model (no RAPL), not a measurement." + NO_POWER, "watt", [
    (f'qosd_app_power_watts{{{SEL}}}', "{{app}} ({{instance}}, estimate={{estimate}})"),
    ('qosd_node_power_watts{instance=~"$instance"}', "node ({{instance}}, estimate={{estimate}})"),
], 0)
ts("Energy per request", "Joules per request: the app's power divided by its request rate." + NO_POWER, "joule", [
    (f'sum without(estimate) (qosd_app_power_watts{{{SEL}}}) / rate(qosd_app_requests_total{{{SEL}}}[$__rate_interval])', "{{app}} ({{instance}})"),
], 12)
nl()
row("Decisions and health")
ts("Decisions", "Policy decisions per interval, by app, resource and kind (upsize, downsize, revert, reclaim, grant).", "short", [
    (f'sum by (instance, app, resource, kind) (increase(qosd_decisions_total{{{SEL}}}[$__rate_interval]))', "{{app}} {{kind}} {{resource}} ({{instance}})"),
], 0, extra={"fieldConfig": {"defaults": {"unit": "short", "custom": {"drawStyle": "bars"}}, "overrides": []}})
ts("Drops and errors", "eBPF request records lost to a full ring buffer, allocations that could not be applied, monitoring ticks missed: all should stay at zero. Lost records are empty where no app is eBPF-fed (no tracer is attached then).", "short", [
    ('rate(qosd_ebpf_dropped_records_total{instance=~"$instance"}[$__rate_interval])', "eBPF records dropped/s ({{instance}})"),
    (f'rate(qosd_app_apply_errors_total{{{SEL}}}[$__rate_interval])', "apply errors/s {{app}} ({{instance}})"),
    ('rate(qosd_missed_ticks_total{instance=~"$instance"}[$__rate_interval])', "missed ticks/s ({{instance}})"),
], 12)
nl()
ts("qosd's own cost", "CPU and memory qosd itself uses.", "percentunit", [
    ('rate(process_cpu_seconds_total{job=~"$job",instance=~"$instance"}[$__rate_interval])', "CPU ({{instance}})"),
], 0)
ts("Processes per app", "Processes qosd found for each app, and whether it manages it.", "short", [
    (f'qosd_app_processes{{{SEL}}}', "{{app}} processes ({{instance}})"),
    (f'qosd_app_managed{{{SEL}}}', "{{app}} managed ({{instance}})"),
], 12)

dash = {
    "title": "qosd",
    "uid": "qosd-node",
    "description": "qosd: per-app latency against target, load, allocations (cores, frequency, LLC ways, memory bandwidth, CPU quota), power and energy per request, decisions and drops. Metrics: qosd's /metrics, listed in the qosd README (Deployment: metrics).",
    "tags": ["qosd", "qos", "ebpf"],
    "editable": True,
    "schemaVersion": 39,
    "version": 1,
    "time": {"from": "now-1h", "to": "now"},
    "refresh": "10s",
    "timezone": "",
    "graphTooltip": 1,
    "annotations": {"list": []},
    "templating": {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0},
        {"name": "job", "label": "Job", "type": "query", "datasource": DS, "query": {"query": "label_values(qosd_build_info, job)", "refId": "job"}, "definition": "label_values(qosd_build_info, job)", "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2, "current": {}, "hide": 0},
        {"name": "instance", "label": "Node", "type": "query", "datasource": DS, "query": {"query": "label_values(qosd_build_info{job=~\"$job\"}, instance)", "refId": "instance"}, "definition": "label_values(qosd_build_info{job=~\"$job\"}, instance)", "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2, "current": {}, "hide": 0},
        {"name": "app", "label": "App", "type": "query", "datasource": DS, "query": {"query": "label_values(qosd_app_info{instance=~\"$instance\"}, app)", "refId": "app"}, "definition": "label_values(qosd_app_info{instance=~\"$instance\"}, app)", "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2, "current": {}, "hide": 0},
    ]},
    "panels": panels,
}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qosd.json")
with open(out, "w") as f:
    json.dump(dash, f, indent=2)
    f.write("\n")
print(f"wrote {out}: {len(panels)} panels")
