#!/usr/bin/env python3
"""Generates the Grafana dashboards of the Tenstorrent driver manager.

    python3 dashboards/generate.py          # rewrite dashboards/*.json
    python3 dashboards/generate.py --check  # exit 1 if the JSON files are stale

The JSON files are the shipped artifacts (the chart copies them into
chart/files/dashboards/); this script is their source, so panels stay uniform.
hack/test-alerts.sh runs the --check mode. Only non-Angular panel types are used
(timeseries, stat, gauge, table, state-timeline, bargauge, text).
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
# The matchers of the cluster and job variables, in every query.
SCRAPE = 'cluster=~"$cluster",job=~"$job"'

# Node upgrade states, in order, with the code the per-node timeline uses and a colour.
STATES = [
    ("Pending", 1, "blue"),
    ("Cordoning", 2, "yellow"),
    ("Draining", 3, "orange"),
    ("Upgrading", 4, "purple"),
    ("Uncordoning", 5, "super-light-green"),
    ("Done", 6, "green"),
    ("Failed", 7, "red"),
    # spec.unmanage: the vacate cycle.
    ("Unloading", 8, "dark-orange"),
    ("Unmanaged", 9, "text"),
    ("UnloadFailed", 10, "dark-red"),
]
STATE_COLOURS = {s: c for s, _, c in STATES} | {"HostManaged": "text"}


class Layout:
    """Places panels left to right on Grafana's 24-column grid."""

    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def place(self, w, h):
        if self.x + w > 24:
            self.newline()
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def newline(self):
        if self.x:
            self.y += self.row_h
        self.x = 0
        self.row_h = 0

    def id(self):
        i = self.next_id
        self.next_id += 1
        return i


def target(expr, legend="__auto", ref="A", instant=False, fmt="time_series"):
    t = {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
        "refId": ref,
    }
    if fmt != "time_series":
        t["format"] = fmt
    return t


def targets(*specs, **common):
    out = []
    for i, spec in enumerate(specs):
        expr, legend = spec if isinstance(spec, tuple) else (spec, "__auto")
        out.append(target(expr, legend, ref=chr(ord("A") + i), **common))
    return out


def thresholds(*steps):
    """steps: (value or None, colour) pairs, the first with None."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def panel(L, kind, title, w, h, tgts, *, unit, description="", defaults=None,
          options=None, overrides=None, transformations=None):
    """unit is required: "short" for counts, "none" for codes and names, else Grafana's unit id."""
    d = {"color": {"mode": "palette-classic"}, "mappings": [],
         "thresholds": thresholds((None, "green"))}
    d["unit"] = unit
    d.update(defaults or {})
    p = {
        "id": L.id(),
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": L.place(w, h),
        "targets": tgts,
        "fieldConfig": {"defaults": d, "overrides": overrides or []},
        "options": options or {},
    }
    if transformations:
        p["transformations"] = transformations
    return p


def increase_bars(L, title, w, h, metric, by, legend, sel=None, *, description):
    """The increase of the counter `metric` per window, summed by `by` (of the
    policies the dashboard selects, or the series `sel` matches), as stacked
    bars: whole numbers, summed in the legend."""
    sel = CR if sel is None else sel
    tgts = targets((f"sum by ({by}) (increase({metric}{{{sel}}}[$__rate_interval]))", legend))
    return panel(L, "timeseries", title, w, h, tgts, description=description,
                 defaults={"custom": ts_custom(draw="bars", fill=80, stack=True), "decimals": 0},
                 options=ts_options(["sum"]), unit="short")


def count_series(L, title, w, h, expr, legend, *, description, stack=False):
    """Whole counts over time (a gauge's value per series), from 0, the last
    value in the legend."""
    return panel(L, "timeseries", title, w, h, targets((expr, legend)), description=description,
                 defaults={"custom": ts_custom(stack=stack, fill=10 if stack else 0), "decimals": 0, "min": 0},
                 options=ts_options(["lastNotNull"]), unit="short")


def bargauge_options(display_mode):
    """A horizontal bar gauge of each series' last value."""
    return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal", "displayMode": display_mode, "showUnfilled": True,
            "valueMode": "color", "namePlacement": "auto", "sizing": "auto", "minVizHeight": 16,
            "minVizWidth": 8, "maxVizHeight": 300}


def duration_bars(L, title, w, h, tgts, description):
    """Quantiles of duration histograms over the time range, one bar each."""
    return panel(L, "bargauge", title, w, h, tgts, description=description, unit="s",
                 defaults={"min": 0, "color": {"mode": "continuous-GrYlRd"}},
                 options=bargauge_options("gradient"))


def dashboard_link(title, uid):
    """A link to the dashboard `uid`, keeping the time range and variables."""
    return {"title": title, "type": "link", "url": f"/d/{uid}",
            "icon": "dashboard", "keepTime": True, "includeVars": True, "asDropdown": False,
            "targetBlank": False, "tags": [], "tooltip": ""}


def text_panel(L, title, content, w, h):
    return {
        "id": L.id(), "type": "text", "title": title, "gridPos": L.place(w, h),
        "options": {"mode": "markdown", "content": content,
                    "code": {"language": "plaintext", "showLineNumbers": False, "showMiniMap": False}},
    }


def row(L, title):
    L.newline()
    p = {"id": L.id(), "type": "row", "title": title, "collapsed": False, "panels": [],
         "gridPos": {"h": 1, "w": 24, "x": 0, "y": L.y}}
    L.y += 1
    return p


def stat_options(text_mode="auto", calc="lastNotNull", color_mode="value", graph="none"):
    return {
        "reduceOptions": {"calcs": [calc], "fields": "", "values": False},
        "orientation": "auto", "textMode": text_mode, "colorMode": color_mode,
        "graphMode": graph, "justifyMode": "auto", "wideLayout": True,
        "showPercentChange": False,
    }


def stat_panel(L, title, w, h, tgts, *, description, unit="short", text_mode="auto",
               color_mode="value", **kw):
    """A stat panel of counts unless `unit` says otherwise (see stat_options)."""
    return panel(L, "stat", title, w, h, tgts, description=description, unit=unit,
                 options=stat_options(text_mode=text_mode, color_mode=color_mode), **kw)


def ts_options(legend_calcs=None, mode="multi"):
    return {
        "legend": {"displayMode": "table" if legend_calcs else "list", "placement": "bottom",
                   "showLegend": True, "calcs": legend_calcs or []},
        "tooltip": {"mode": mode, "sort": "desc"},
    }


def ts_custom(stack=False, draw="line", fill=10):
    return {
        "drawStyle": draw, "lineInterpolation": "stepAfter" if draw == "line" else "linear",
        "lineWidth": 1, "fillOpacity": fill, "showPoints": "never", "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "axisPlacement": "auto", "axisSoftMin": 0,
    }


def colour_by_name(names_colours):
    return [
        {"matcher": {"id": "byName", "options": n},
         "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": c}}]}
        for n, c in names_colours.items()
    ]


def query_variable(name, label, query, all_value):
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2, "regex": "", "sort": 1, "hide": 0,
        "includeAll": True, "multi": True, "allValue": all_value,
        "current": {}, "options": [],
    }


def templating(extra=()):
    # cluster: a Prometheus that scrapes several clusters labels them so
    # (".*" also matches a series without the label, a single-cluster setup).
    # job: the scrape job(s) of the controller. Every query filters on both.
    return {"list": [
        {
            "name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "regex": "", "hide": 0, "refresh": 1,
            "current": {}, "options": [], "includeAll": False, "multi": False,
        },
        query_variable("cluster", "Cluster", "label_values(ttdriver_build_info, cluster)", ".*"),
        query_variable("job", "Job", 'label_values(ttdriver_build_info{cluster=~"$cluster"}, job)', ".*"),
        query_variable("cr", "Policy (cr)", f"label_values(ttdriver_node_state{{{SCRAPE}}}, cr)", ".+"),
        *extra,
    ]}


def dashboard(uid, title, description, panels, tags, links=()):
    return {
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ],
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["tenstorrent", "tt-kmd", "driver-manager", *tags],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "refresh": "30s",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "links": list(links),
        "templating": templating(),
        "panels": panels,
    }


CR = SCRAPE + ',cr=~"$cr"'


def rollout():
    L = Layout()
    P = []
    P.append(row(L, "Progress"))
    P.append(stat_panel(
        L, "Target version", 4, 5,
        targets((f'max by (cr, version) (ttdriver_policy_desired_version{{{CR}}})', "{{cr}}: {{version}}"),
                instant=True),
        description="spec.version of the selected policies (ttdriver_policy_desired_version).",
        text_mode="name", color_mode="none",
        unit="none",
    ))
    P.append(panel(
        L, "gauge", "Progress (Done / matched)", 4, 5,
        targets(f'sum(ttdriver_policy_nodes{{{CR},state="Done"}}) '
                f'/ sum(ttdriver_policy_nodes{{{CR},state!="HostManaged"}})', instant=True),
        description="Share of the matched container-managed nodes that run the target version (state Done). "
                    "Host-managed (DKMS) nodes are not upgraded and not counted.",
        unit="percentunit",
        defaults={"min": 0, "max": 1, "color": {"mode": "thresholds"},
                  "thresholds": thresholds((None, "orange"), (0.5, "yellow"), (1, "green"))},
        options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                 "showThresholdLabels": False, "showThresholdMarkers": True, "orientation": "auto"},
    ))
    P.append(stat_panel(
        L, "Nodes", 6, 5,
        targets((f'sum(ttdriver_policy_nodes{{{CR},state="Done"}})', "Done"),
                (f'sum(ttdriver_policy_nodes{{{CR},state!="HostManaged"}})', "Matched"),
                (f'sum(ttdriver_policy_nodes{{{CR},state="HostManaged"}})', "Host-managed"),
                (f'sum(ttdriver_policy_prepared_nodes{{{CR}}})', "Prepared"),
                (f'sum(ttdriver_policy_next_kernel_build_failed_nodes{{{CR}}})', "Next kernel fails"),
                instant=True),
        description="Nodes upgraded (Done), matched by the policies (every state but host-managed), "
                    "host-managed (DKMS install, left alone), prepared (the target built and verified "
                    "into the node's cache ahead of its cycle, or loaded), and with an installed kernel "
                    "the target does not build for (a reboot into it would find no module).",
        color_mode="none",
    ))
    P.append(stat_panel(
        L, "Failed nodes", 3, 5,
        targets(f'sum(ttdriver_policy_nodes{{{CR},state=~"Failed|UnloadFailed"}})', instant=True),
        description="Nodes in state Failed or UnloadFailed. Such a node stays as it is (cordoned if its "
                    "cycle had started) and holds its rollout; see the runbook (TTDriverNodeFailed).",
        defaults={"color": {"mode": "thresholds"},
                  "thresholds": thresholds((None, "green"), (1, "red"))},
        color_mode="background",
    ))
    P.append(stat_panel(
        L, "Unavailable / maxUnavailable", 4, 5,
        targets((f'sum(ttdriver_rollout_unavailable_nodes{{{CR}}})', "unavailable"),
                (f'sum(ttdriver_rollout_max_unavailable{{{CR}}})', "maxUnavailable"),
                instant=True),
        description="Nodes the rollout currently holds out of service, against the policies' maxUnavailable budget.",
        color_mode="none",
    ))
    P.append(stat_panel(
        L, "Nodes in progress", 3, 5,
        targets(f'sum(ttdriver_policy_nodes{{{CR},state=~"Cordoning|Draining|Upgrading|Uncordoning|Unloading"}})',
                instant=True),
        description="Nodes in Cordoning, Draining, Upgrading, Uncordoning or Unloading.",
        color_mode="none",
    ))
    P.append(panel(
        L, "timeseries", "Nodes per state", 12, 8,
        targets((f'sum by (state) (ttdriver_policy_nodes{{{CR}}})', "{{state}}")),
        description="ttdriver_policy_nodes, stacked: how the matched nodes move from Pending to Done.",
        defaults={"custom": ts_custom(stack=True, fill=60), "decimals": 0},
        overrides=colour_by_name(STATE_COLOURS),
        options=ts_options(["lastNotNull"]),
        unit="short",
    ))
    P.append(panel(
        L, "bargauge", "Nodes by loaded tt-kmd version", 12, 8,
        targets((f'sum by (version, install_mode) (ttdriver_nodes_by_kmd_version{{{SCRAPE}}})',
                 "{{version}} ({{install_mode}})"), instant=True),
        description="All Tenstorrent nodes of the cluster by the tt-kmd version they report "
                    "(node label driver.tenstorrent.com/kmd-version) and install mode.",
        defaults={"decimals": 0, "min": 0, "color": {"mode": "palette-classic"}},
        options=bargauge_options("basic"),
        unit="short",
    ))

    P.append(panel(
        L, "timeseries", "Build ahead: prepared nodes", 24, 7,
        targets((f'sum(ttdriver_policy_prepared_nodes{{{CR}}})', "prepared"),
                (f'sum(ttdriver_policy_nodes{{{CR},state!="HostManaged"}})', "matched"),
                (f'sum(ttdriver_policy_nodes{{{CR},state="Done"}})', "done"),
                (f'sum(ttdriver_policy_next_kernel_build_failed_nodes{{{CR}}})',
                 "next kernel fails")),
        description="Nodes that hold the target version (built and verified ahead into their cache "
                    "while they serve, or loaded) against the matched and the Done nodes: with "
                    "build-ahead (upgradePolicy.prepare) the prepared line runs ahead of Done, and a "
                    "node is cordoned only once prepared. 'next kernel fails': nodes with an "
                    "installed kernel the target does not build for.",
        defaults={"decimals": 0, "min": 0},
        options=ts_options(["lastNotNull"]),
        unit="short",
    ))

    P.append(row(L, "Nodes"))
    cases = "\n  or ".join(
        f'(ttdriver_node_state{{{CR},state="{s}"}} * {code})' for s, code, _ in STATES)
    P.append(panel(
        L, "state-timeline", "Per-node state", 24, 10,
        targets((f"max by (cr, node) (\n  {cases}\n)", "{{node}}")),
        description="Upgrade state of every node over time (from ttdriver_node_state).",
        defaults={
            "custom": {"fillOpacity": 80, "lineWidth": 0, "hideFrom": {"legend": False, "tooltip": False, "viz": False}},
            "color": {"mode": "fixed", "fixedColor": "transparent"},
            "mappings": [{"type": "value", "options": {
                str(code): {"text": s, "color": c, "index": i}
                for i, (s, code, c) in enumerate(STATES)}}],
        },
        options={"mergeValues": True, "showValue": "auto", "alignValue": "left", "rowHeight": 0.9,
                 "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                 "tooltip": {"mode": "single", "sort": "none"}},
        unit="none",
    ))
    P.append(panel(
        L, "table", "Time in current state", 12, 10,
        targets((f'max by (cr, node, state) (ttdriver_node_state{{{CR}}} == 1)\n'
                 f'  * on (cr, node) group_left ()\n'
                 f'max by (cr, node) (time() - ttdriver_node_state_since_timestamp_seconds{{{CR}}})', ""),
                instant=True, fmt="table"),
        description="Every node with its current state and how long it has been there. "
                    "In-progress states older than 30 minutes raise TTDriverNodeStuckInPhase.",
        unit="s",
        defaults={"custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False}},
        overrides=[
            {"matcher": {"id": "byName", "options": "Time in state"},
             "properties": [{"id": "custom.cellOptions", "value": {"type": "color-text"}},
                            {"id": "color", "value": {"mode": "thresholds"}},
                            {"id": "thresholds", "value": thresholds((None, "text"), (1800, "orange"))}]},
            {"matcher": {"id": "byName", "options": "State"},
             "properties": [{"id": "custom.cellOptions", "value": {"type": "color-text"}},
                            {"id": "mappings", "value": [{"type": "value", "options": {
                                s: {"color": c, "index": i} for i, (s, _, c) in enumerate(STATES)}}]}]},
        ],
        options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""},
                 "sortBy": [{"displayName": "Time in state", "desc": True}]},
        transformations=[{"id": "organize", "options": {
            "excludeByName": {"Time": True},
            "indexByName": {"cr": 0, "node": 1, "state": 2, "Value": 3},
            "renameByName": {"cr": "Policy", "node": "Node", "state": "State", "Value": "Time in state"}}}],
    ))
    P.append(duration_bars(
        L, "Phase duration p50 / p95 (time range)", 12, 10,
        targets((f'histogram_quantile(0.5, sum by (phase, le) (increase(ttdriver_phase_duration_seconds_bucket{{{CR}}}[$__range])))',
                 "{{phase}} p50"),
                (f'histogram_quantile(0.95, sum by (phase, le) (increase(ttdriver_phase_duration_seconds_bucket{{{CR}}}[$__range])))',
                 "{{phase}} p95"),
                (f'histogram_quantile(0.95, sum by (le) (increase(ttdriver_node_upgrade_duration_seconds_bucket{{{CR}}}[$__range])))',
                 "whole node p95"),
                (f'histogram_quantile(0.95, sum by (le) (increase(ttdriver_node_scheduling_surface_seconds_bucket{{{CR}}}[$__range])))',
                 "scheduling surface p95"),
                instant=True),
        description="Time nodes spent in each state (ttdriver_phase_duration_seconds, observed when a node leaves "
                    "the state), for a whole node cycle, Cordoning to Done (ttdriver_node_upgrade_duration_seconds), "
                    "and from a validated swap to the scheduler seeing every card again (DRA plugin restarted, "
                    "ResourceSlices whole: ttdriver_node_scheduling_surface_seconds), "
                    "over the dashboard's time range. Quantiles are estimated from histogram buckets.",
    ))
    P.append(panel(
        L, "timeseries", "Phase duration p50 / p95 over time", 24, 8,
        targets((f'histogram_quantile(0.5, sum by (phase, le) (rate(ttdriver_phase_duration_seconds_bucket{{{CR}}}[$__rate_interval])))',
                 "{{phase}} p50"),
                (f'histogram_quantile(0.95, sum by (phase, le) (rate(ttdriver_phase_duration_seconds_bucket{{{CR}}}[$__rate_interval])))',
                 "{{phase}} p95")),
        description="The same quantiles per evaluation window; gaps mean no node left that state in the window.",
        unit="s",
        defaults={"custom": ts_custom(draw="points", fill=0) | {"pointSize": 6, "showPoints": "always"}},
        options=ts_options(),
    ))

    P.append(row(L, "Failures and draining"))
    P.append(panel(
        L, "bargauge", "Node failures by reason (time range)", 8, 8,
        targets((f'sum by (reason) (increase(ttdriver_node_failures_total{{{CR}}}[$__range]))', "{{reason}}"),
                instant=True),
        description="Nodes that entered Failed during the time range, by reason "
                    "(see docs/troubleshooting.md, \"A node is Failed\").",
        defaults={"decimals": 0, "min": 0, "color": {"mode": "thresholds"},
                  "thresholds": thresholds((None, "green"), (0.5, "red"))},
        options=bargauge_options("basic"),
        unit="short",
    ))
    P.append(increase_bars(
        L, "Pods evicted", 8, 8, "ttdriver_pods_evicted_total", "pass", "{{pass}}",
        description="Pods evicted while draining nodes; pass=pass1: pods using /dev/tenstorrent (hostPath, "
                    "device plugin or DRA), pass=pass2: the other pods of the node.",
    ))
    P.append(increase_bars(
        L, "Drain blocked", 8, 8, "ttdriver_drain_blocked_total", "pass", "{{pass}}",
        description="Evictions refused while draining (a PodDisruptionBudget or an error). Persistent blocks end "
                    "in a DrainTimeout failure.",
    ))
    P.append(increase_bars(
        L, "State transitions", 24, 8, "ttdriver_node_transitions_total", "from, to", "{{from}} → {{to}}",
        description="Node state transitions per window (ttdriver_node_transitions_total).",
    ))
    # Verified upgrades: what the check after the swap, the soak and the
    # maintenance windows did (docs/upgrade-flow.md).
    P.append(row(L, "Verified upgrades"))
    P.append(increase_bars(
        L, "Rollbacks", 8, 8, "ttdriver_node_rollbacks_total", "cr", "{{cr}}",
        description="Nodes whose new module failed validation after the swap and went back to the previous "
                    "version (ttdriver_node_rollbacks_total). Each halts its policy's rollout; alert "
                    "TTDriverNodeRolledBack.",
    ))
    P.append(increase_bars(
        L, "Validation and soak failures", 8, 8, "ttdriver_node_failures_total", "cr, reason", "{{cr}} {{reason}}",
        sel=CR + ',reason=~"ValidationFailed|SoakFailed"',
        description="Nodes Failed because the new module did not serve every card (ValidationFailed, rolled "
                    "back or held) or because of trouble during the soak after their upgrade (SoakFailed).",
    ))
    P.append(count_series(
        L, "Rollout held on purpose", 8, 8,
        f'max by (cr, reason) (ttdriver_policy_rollout_held{{{CR}}})', "{{cr}} {{reason}}",
        description="Policies whose new cycles wait on purpose (ttdriver_policy_rollout_held): Soaking (the "
                    "node upgraded last soaks, upgradePolicy.soakSeconds), OutsideMaintenanceWindow "
                    "(upgradePolicy.maintenanceWindows) or WaitingForPromotion (spec.promoteAfter: the canary "
                    "has not been Ready at the version for its soak, or is halted: "
                    "ttdriver_policy_promotion_blocked, alert TTDriverPromotionBlocked): 1 while it holds, "
                    "0 otherwise.",
    ))
    # The VFIO binder (vfioManager): its own pods, scraped under their own
    # job (the "Job" variable's All matches it); node is the PodMonitor's label.
    P.append(row(L, "VFIO passthrough"))
    P.append(increase_bars(
        L, "VFIO bind errors", 8, 8, "tt_vfio_bind_errors_total", "node, action", "{{node}} {{action}}",
        sel=SCRAPE,
        description="Failed binds and restores (tt_vfio_bind_errors_total; action=bind|unbind). A function "
                    "refused for want of an IOMMU counts here; the binder's log names it (docs/vfio.md).",
    ))
    bound = ("PCI functions the VFIO binder holds on vfio-pci (tt_vfio_devices_bound_total), per extended "
             "resource. A node whose Tenstorrent functions are all there is left alone by the driver policy "
             "(reason VfioPassthrough).")
    P.append(count_series(L, "Functions on vfio-pci by resource", 8, 8,
                          f"sum by (resource) (tt_vfio_devices_bound_total{{{SCRAPE}}})", "{{resource}}",
                          description=bound, stack=True))
    P.append(panel(
        L, "table", "Passthrough functions", 8, 8,
        targets((f"max by (node, bdf, resource, board_type) (tt_vfio_device_info{{{SCRAPE}}})", ""),
                instant=True, fmt="table"),
        description="Every function the binder matched, with its board kind from the PCI subsystem ID "
                    "(tt_vfio_device_info). No-IOMMU nodes: tt_vfio_noiommu_mode.",
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}],
        unit="none",
    ))
    # The firmware policies (TenstorrentFirmwarePolicy): every policy of the
    # scrape, by its own cr (the $cr variable lists the driver policies).
    P.append(row(L, "Firmware (TenstorrentFirmwarePolicy)"))
    P.append(count_series(
        L, "Firmware nodes by state", 8, 8, f"sum by (cr, state) (ttfw_policy_nodes{{{SCRAPE}}})",
        "{{cr}} {{state}}", stack=True,
        description="Nodes of each firmware policy by state (ttfw_policy_nodes): Pending, Cordoning, Draining, "
                    "Flashing, Uncordoning, Done, Failed (docs/firmware.md).",
    ))
    P.append(count_series(
        L, "Nodes by firmware version", 8, 8, f"sum by (version) (ttfw_nodes_by_fw_version{{{SCRAPE}}})",
        "{{version}}", stack=True,
        description="Nodes by the firmware every card read back last (label firmware.tenstorrent.com/fw-version).",
    ))
    P.append(increase_bars(
        L, "Flashes", 8, 8, "ttfw_flash_jobs_total", "cr, result", "{{cr}} {{result}}", sel=SCRAPE,
        description="Flashes that ended per window: success (every card read back the target) or failed "
                    "(ttfw_flash_jobs_total; the node's reason says why).",
    ))
    P.append(duration_bars(
        L, "Flash to cards published p50 / p95 (time range)", 24, 6,
        targets((f'histogram_quantile(0.5, sum by (cr, le) (increase(ttfw_scheduling_surface_seconds_bucket{{{SCRAPE}}}[$__range])))',
                 "{{cr}} p50"),
                (f'histogram_quantile(0.95, sum by (cr, le) (increase(ttfw_scheduling_surface_seconds_bucket{{{SCRAPE}}}[$__range])))',
                 "{{cr}} p95"),
                instant=True),
        description="Per firmware policy, from a flash that read back to the scheduler seeing every card of the node "
                    "again (deploy gates opened, the stack back, DRA plugin restarted, ResourceSlices whole: "
                    "ttfw_scheduling_surface_seconds), over the dashboard's time range. Only nodes where something "
                    "publishes the cards; a node past the deadline fails DevicesNotPublished instead.",
    ))
    return dashboard(
        "ttdriver-rollout", "Tenstorrent driver rollout",
        "Progress of tt-kmd rollouts driven by TenstorrentDriverPolicy resources: target version, nodes per "
        "state, per-node timeline, phase durations, failures and drains.",
        P, ["rollout"],
        links=[dashboard_link("Driver manager controller", "ttdriver-controller")],
    )


def controller():
    L = Layout()
    P = []
    P.append(row(L, "Controller"))
    P.append(stat_panel(
        L, "Replicas up", 3, 5,
        targets(f"count(ttdriver_build_info{{{SCRAPE}}})", instant=True),
        description="Controller replicas Prometheus scrapes (series of ttdriver_build_info). "
                    "None for 5 minutes raises TTDriverControllerDown.",
        defaults={"color": {"mode": "thresholds"}, "thresholds": thresholds((None, "red"), (1, "green"))},
        color_mode="background",
    ))
    P.append(stat_panel(
        L, "Leader", 5, 5,
        targets((f"max by (instance) (ttdriver_leader{{{SCRAPE}}})", "{{instance}}"), instant=True),
        description="ttdriver_leader per replica: the leader drives rollouts and exports the per-policy series.",
        defaults={"color": {"mode": "thresholds"}, "thresholds": thresholds((None, "text"), (1, "green")),
                  "mappings": [{"type": "value", "options": {"0": {"text": "follower", "index": 0},
                                                             "1": {"text": "leader", "index": 1}}}]},
        unit="none",
    ))
    P.append(stat_panel(
        L, "Build", 6, 5,
        targets((f"count by (version) (ttdriver_build_info{{{SCRAPE}}})", "{{version}}"), instant=True),
        description="Controller build version (ttdriver_build_info); the value is the number of replicas running it.",
        text_mode="name", color_mode="none",
    ))
    P.append(stat_panel(
        L, "Last successful reconcile", 10, 5,
        targets((f'time() - max by (cr) (ttdriver_last_successful_reconcile_timestamp_seconds{{{CR}}})', "{{cr}}"),
                instant=True),
        description="Time since the last reconcile of each policy that ended without error.",
        unit="s",
        defaults={"color": {"mode": "thresholds"},
                  "thresholds": thresholds((None, "green"), (900, "orange"), (3600, "red"))},
    ))

    P.append(row(L, "Reconcile"))
    P.append(panel(
        L, "timeseries", "Reconcile rate", 8, 8,
        targets((f'sum by (cr, result) (rate(ttdriver_reconcile_total{{{CR}}}[$__rate_interval]))', "{{cr}} {{result}}")),
        description="Reconcile passes per second by policy and result.",
        unit="ops",
        defaults={"custom": ts_custom(fill=10)},
        overrides=[{"matcher": {"id": "byRegexp", "options": ".* error"},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}],
        options=ts_options(),
    ))
    P.append(panel(
        L, "timeseries", "Reconcile error ratio", 8, 8,
        targets((f'sum by (cr) (rate(ttdriver_reconcile_total{{{CR},result="error"}}[$__rate_interval]))\n'
                 f'  /\nsum by (cr) (rate(ttdriver_reconcile_total{{{CR}}}[$__rate_interval]))', "{{cr}}")),
        description="Share of reconciles ending in error. Above 20% for 15 minutes raises TTDriverReconcileErrors.",
        unit="percentunit",
        defaults={"min": 0, "max": 1, "custom": ts_custom(fill=10) | {"thresholdsStyle": {"mode": "line"}},
                  "thresholds": thresholds((None, "green"), (0.2, "red"))},
        options=ts_options(),
    ))
    P.append(panel(
        L, "timeseries", "Reconcile duration", 8, 8,
        targets((f'histogram_quantile(0.5, sum by (le) (rate(ttdriver_reconcile_duration_seconds_bucket{{{CR}}}[$__rate_interval])))', "p50"),
                (f'histogram_quantile(0.95, sum by (le) (rate(ttdriver_reconcile_duration_seconds_bucket{{{CR}}}[$__rate_interval])))', "p95"),
                (f'histogram_quantile(0.99, sum by (le) (rate(ttdriver_reconcile_duration_seconds_bucket{{{CR}}}[$__rate_interval])))', "p99")),
        description="Duration of one reconcile pass (ttdriver_reconcile_duration_seconds).",
        unit="s",
        defaults={"custom": ts_custom(fill=0)},
        options=ts_options(),
    ))
    P.append(increase_bars(
        L, "Errors by stage", 24, 8, "ttdriver_errors_total", "cr, stage", "{{cr}} {{stage}}",
        description="Controller errors by policy and stage (ttdriver_errors_total).",
    ))

    P.append(row(L, "Actors"))
    P.append(increase_bars(
        L, "Actor restarts", 12, 8, "ttdriver_actor_restarts_total", "actor", "{{actor}}", sel=SCRAPE,
        description="Supervised actors restarted after a failure, by actor kind. A restarted actor reloads its "
                    "state from the cluster; frequent restarts point at a bug or an unreachable API server.",
    ))
    P.append(panel(
        L, "timeseries", "Mailbox saturation", 12, 8,
        targets((f'sum by (actor) (rate(ttdriver_actor_mailbox_full_total{{{SCRAPE}}}[$__rate_interval]))', "{{actor}}")),
        description="Messages refused per second because an actor's mailbox was full, by actor kind. "
                    "Sustained values mean the actor cannot keep up.",
        unit="ops",
        defaults={"custom": ts_custom(fill=10)},
        options=ts_options(),
    ))
    P.append(increase_bars(
        L, "Watch restarts", 24, 8, "ttdriver_watch_restarts_total", "kind", "{{kind}}", sel=SCRAPE,
        description="Watches of the controller's caches that failed and restarted with backoff, by kind "
                    "(ttdriver_watch_restarts_total). A few are normal (an API server restart, an expired "
                    "resource version); a steady rate means the controller cannot watch (RBAC, network).",
    ))

    P.append(row(L, "Process"))
    # The sizing rule of docs/operations.md, from what the caches hold: the
    # Node cache counts every node, a little above the Tenstorrent nodes the
    # rule names, so the line errs high.
    node_cache = f'max(ttdriver_cache_objects{{{SCRAPE},kind="Node"}})'
    pod_cache = f'max(ttdriver_cache_objects{{{SCRAPE},kind="Pod"}})'
    P.append(panel(
        L, "timeseries", "Memory against the sizing rule", 12, 8,
        targets((f"max by (instance) (process_resident_memory_bytes{{{SCRAPE}}})", "{{instance}} resident"),
                (f"16 * 1024 * 1024 + 50 * 1024 * {node_cache} + 512 * {pod_cache}",
                 "sizing rule: 16 MiB + 50 KiB × nodes + 0.5 KiB × pods"),
                (f"2 * (16 * 1024 * 1024 + 50 * 1024 * {node_cache} + 512 * {pod_cache})",
                 "limit at least (2 × the rule)")),
        description="Resident memory of each controller replica (process_resident_memory_bytes) against "
                    "the sizing rule of docs/operations.md, computed from the cached Node and Pod counts "
                    "(ttdriver_cache_objects; every node counts, so the rule errs high). Resident memory "
                    "near the 2 × line at rest: raise controller.resources.limits.memory.",
        unit="bytes",
        defaults={"custom": ts_custom(fill=0), "min": 0},
        overrides=[{"matcher": {"id": "byRegexp", "options": "sizing rule.*"},
                    "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                                   {"id": "color", "value": {"mode": "fixed", "fixedColor": "orange"}}]},
                   {"matcher": {"id": "byRegexp", "options": "limit at least.*"},
                    "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                                   {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}],
        options=ts_options(["lastNotNull", "max"]),
    ))
    P.append(panel(
        L, "timeseries", "CPU", 6, 8,
        targets((f"max by (instance) (rate(process_cpu_seconds_total{{{SCRAPE}}}[$__rate_interval]))",
                 "{{instance}}")),
        description="CPU seconds per second of each controller replica (process_cpu_seconds_total): "
                    "near zero at rest, well under one core during a 1000-node rollout.",
        unit="short",
        defaults={"custom": ts_custom(fill=10), "min": 0},
        options=ts_options(),
    ))
    P.append(panel(
        L, "timeseries", "Open fds and threads", 6, 8,
        targets((f"max by (instance) (process_open_fds{{{SCRAPE}}})", "{{instance}} fds"),
                (f"max by (instance) (process_threads{{{SCRAPE}}})", "{{instance}} threads")),
        unit="short",
        defaults={"custom": ts_custom(fill=0), "decimals": 0, "min": 0},
        options=ts_options(["lastNotNull"]),
        description="Open file descriptors (process_open_fds) and OS threads (process_threads) of each "
                    "replica. A steady climb of fds points at a leak of connections.",
    ))
    P.append(row(L, "Caches"))
    P.append(count_series(
        L, "Cached objects", 24, 8,
        f'max by (kind) (ttdriver_cache_objects{{{SCRAPE}}})', "{{kind}}",
        description="Objects each replica keeps in its watch caches, by kind (ttdriver_cache_objects). "
                    "Pod counts every bound pod of the cluster (its drain facts, ~0.3 KiB); the controller's "
                    "memory follows nodes and pods: see the sizing rule in docs/operations.md.",
    ))
    return dashboard(
        "ttdriver-controller", "Tenstorrent driver manager controller",
        "Health of the tt-kmd driver manager controller: replicas, leader, reconcile rate, errors and "
        "duration, actor restarts and mailbox saturation, watch restarts, memory against the sizing "
        "rule, CPU, fds and threads, cached objects.",
        P, ["controller"],
        links=[dashboard_link("Driver rollout", "ttdriver-rollout")],
    )


DASHBOARDS = {"ttdriver-rollout.json": rollout, "ttdriver-controller.json": controller}


def render(fn):
    return json.dumps(fn(), indent=2, ensure_ascii=False) + "\n"


def main(argv):
    check = "--check" in argv
    stale = []
    for name, fn in DASHBOARDS.items():
        path = HERE / name
        text = render(fn)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale dashboards (run python3 dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
