#!/usr/bin/env python3
"""Runs every PromQL query of the Grafana dashboards against a real Prometheus.

    hack/check-dashboard-queries.py http://127.0.0.1:9090 [options]

For each dashboard in dashboards/*.json (or the files given with --dashboard):
  - resolves the template variables the way Grafana would: `label_values(metric, label)`
    through /api/v1/label/<label>/values, in order (a variable's query may use
    the ones before it); a variable with "All" (includeAll and allValue) is
    used as Grafana's default selection, All: `=~"$v"` becomes its allValue;
    otherwise a multi-value variable used as `=~"$v"` becomes the alternation
    of all its values, `="$v"` its first value. Every variable needs values;
  - substitutes Grafana's built-ins: $__rate_interval, $__interval, $__range,
    $__range_s, $__range_ms, ${datasource} (see --rate-interval, --range);
  - sends every target's `expr` to /api/v1/query and requires status "success"
    (the query parses and evaluates) and a non-empty result.

Every panel needs data, and 0 is data: the counters of rare events (errors,
actor restarts, full mailboxes) are created at 0, so no panel is excused.
--allow-empty "<dashboard uid>/<panel title>" excuses one when investigating.

--expect-alert NAME[:label=value,...] also fetches alert rule NAME from
/api/v1/rules (so Prometheus must have loaded dashboards/alerts/ttdriver.rules.yaml),
runs its expression and requires a result (with those labels, if given). The
cluster test uses it to prove that a Failed node makes TTDriverNodeFailed's
expression return that node.

Prints a table; exits 1 on any failure, 2 on a usage or connection error.
Standard library only.
"""
import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (dashboard uid, panel title) -> why an empty result is legitimate. None: the
# controller creates its counters at 0 (docs/metrics.md, "Counters start at zero").
ALLOW_EMPTY = {}


class PromError(Exception):
    pass


class Prometheus:
    def __init__(self, base, timeout, at=None):
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.at = at

    def get(self, path, params):
        url = f"{self.base}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            try:
                body = json.load(e)
            except (ValueError, OSError):
                raise PromError(f"HTTP {e.code} from {path}") from e
        if body.get("status") != "success":
            raise PromError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr):
        params = {"query": expr}
        if self.at is not None:
            params["time"] = self.at
        data = self.get("/api/v1/query", params)
        if data["resultType"] in ("vector", "matrix"):
            return data["result"]
        # scalar / string: a single value, never "empty"
        return [{"metric": {}, "value": data["result"]}]

    def label_values(self, label, match=None):
        params = {}
        if match:
            params["match[]"] = match
        return self.get(f"/api/v1/label/{urllib.parse.quote(label)}/values", params)

    def rules(self):
        return self.get("/api/v1/rules", {"type": "alert"})


def walk_panels(panels):
    for p in panels or []:
        yield p
        yield from walk_panels(p.get("panels"))


def resolve_variables(dash, prom, args):
    """name -> (query, values, allValue or None), for the query variables of the dashboard."""
    values = {}
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        q = q or v.get("definition", "")
        m = re.fullmatch(r"\s*label_values\(\s*(?:(.+?)\s*,\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q)
        if not m:
            raise PromError(f"variable {v['name']}: unsupported query {q!r}")
        metric, label = m.group(1), m.group(2)
        if metric:
            metric = substitute(metric, values, args)
        vals = prom.label_values(label, metric)
        if v.get("regex"):
            vals = [x for x in vals if re.search(v["regex"], x)]
        all_value = v.get("allValue") if v.get("includeAll") else None
        values[v["name"]] = (q, vals, all_value)
    return values


def substitute(expr, variables, args):
    builtins = {
        "__rate_interval": args.rate_interval,
        "__interval": args.interval,
        "__range": args.range,
        "__range_s": str(duration_seconds(args.range)),
        "__range_ms": str(duration_seconds(args.range) * 1000),
        "datasource": "prometheus",
    }

    def value_of(name, in_regex):
        if name in builtins:
            return builtins[name]
        if name in variables:
            _, vals, all_value = variables[name]
            if in_regex and all_value:
                return all_value
            if not vals:
                return "__no_value__"
            if in_regex:
                return "(" + "|".join(map(promql_regex_escape, vals)) + ")"
            return vals[0]
        raise PromError(f"unknown variable ${name}")

    pattern = re.compile(r"(=~?)?(\"?)\$(?:\{([A-Za-z0-9_]+)(?::[a-z]+)?\}|([A-Za-z0-9_]+))|\[\[([A-Za-z0-9_]+)\]\]")

    def repl(m):
        op, quote = m.group(1) or "", m.group(2) or ""
        name = m.group(3) or m.group(4) or m.group(5)
        return op + quote + value_of(name, op == "=~")

    return pattern.sub(repl, expr)


def promql_regex_escape(s):
    """Escapes regex metacharacters, written inside a double-quoted PromQL string."""
    return re.sub(r"([.+*?()|\[\]{}^$\\])", r"\\\\\1", s)


def duration_seconds(d):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total = 0.0
    for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", d):
        total += int(n) * units[u]
    return int(total)


def table(rows, headers):
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(str(c))) for w, c in zip(widths, r)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*["-" * w for w in widths])]
    out += [line.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(out)


def one_line(s, n=90):
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def run_checks(args, prom, allow, files):
    """One pass over every dashboard query (and --expect-alert); returns (rows, failures)."""
    rows, failures = [], []
    for f in files:
        dash = json.loads(Path(f).read_text())
        uid = dash.get("uid", Path(f).stem)
        try:
            variables = resolve_variables(dash, prom, args)
        except (PromError, OSError) as e:
            rows.append((uid, "(variables)", "-", "ERROR", "-", str(e)))
            failures.append(f"{uid}: variables: {e}")
            continue
        for name, (q, vals, _) in variables.items():
            status = "ok" if vals else "EMPTY"
            rows.append((uid, f"${name}", "-", status, len(vals), one_line(q)))
            if not vals:
                failures.append(f"{uid}: variable ${name} ({q}) has no values")
        for p in walk_panels(dash.get("panels")):
            for t in p.get("targets") or []:
                expr = t.get("expr")
                if not expr:
                    continue
                title = p.get("title", "")
                key = (uid, title)
                try:
                    q = substitute(expr, variables, args)
                    if args.verbose:
                        print(f"--- {uid} / {title} / {t.get('refId')}\n{q}")
                    result = prom.query(q)
                except (PromError, OSError) as e:
                    rows.append((uid, title, t.get("refId", "?"), "ERROR", "-", one_line(str(e))))
                    failures.append(f"{uid} / {title} / {t.get('refId')}: {e}\n    {one_line(expr, 400)}")
                    continue
                if result:
                    status = "ok"
                elif key in allow:
                    status = "empty (allowed)"
                else:
                    status = "EMPTY"
                    failures.append(f"{uid} / {title} / {t.get('refId')}: no data\n    {one_line(q, 400)}")
                rows.append((uid, title, t.get("refId", "?"), status, len(result), one_line(expr)))

    if args.expect_alert:
        try:
            groups = prom.rules().get("groups", [])
        except (PromError, OSError) as e:
            groups = []
            failures.append(f"/api/v1/rules: {e}")
        by_name = {r["name"]: r for g in groups for r in g.get("rules", []) if r.get("type") == "alerting"}
        for spec in args.expect_alert:
            name, _, sel = spec.partition(":")
            want = dict(kv.split("=", 1) for kv in sel.split(",") if kv)
            rule = by_name.get(name)
            if rule is None:
                rows.append(("alert", name, "-", "ERROR", "-", "rule not loaded in Prometheus"))
                failures.append(f"alert {name}: not among the rules Prometheus loaded")
                continue
            try:
                result = prom.query(rule["query"])
            except (PromError, OSError) as e:
                rows.append(("alert", name, "-", "ERROR", "-", one_line(str(e))))
                failures.append(f"alert {name}: {e}")
                continue
            hits = [r for r in result if all(r["metric"].get(k) == v for k, v in want.items())]
            status = "ok" if hits else "EMPTY"
            detail = f"state={rule.get('state')} " + ", ".join(
                "{" + ",".join(f'{k}="{v}"' for k, v in sorted(r["metric"].items())) + "}" for r in hits[:3])
            rows.append(("alert", name, "-", status, len(hits), one_line(detail)))
            if not hits:
                failures.append(f"alert {name}: expression returned no series matching {want or '{}'}: "
                                f"{one_line(rule['query'], 300)}")

    return rows, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prometheus", help="base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("--dashboard", action="append", type=Path,
                    help="dashboard JSON file (repeatable); default dashboards/*.json")
    ap.add_argument("--rate-interval", default="1m", help="value of $__rate_interval (default 1m)")
    ap.add_argument("--interval", default="30s", help="value of $__interval (default 30s)")
    ap.add_argument("--range", default="1h", help="value of $__range (default 1h)")
    ap.add_argument("--time", help="evaluation time (RFC3339 or Unix seconds); default now")
    ap.add_argument("--allow-empty", action="append", default=[], metavar="UID/PANEL TITLE",
                    help="also accept an empty result for this panel")
    ap.add_argument("--expect-alert", action="append", default=[], metavar="NAME[:l=v,...]",
                    help="run alert rule NAME's expression (from /api/v1/rules) and require a result")
    ap.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout per request (seconds)")
    ap.add_argument("--wait", type=float, default=0.0,
                    help="keep retrying the whole check for up to this many seconds until it passes "
                         "(data appears as the rollout proceeds); default: one pass")
    ap.add_argument("--wait-interval", type=float, default=5.0, help="seconds between retries with --wait")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every substituted query")
    args = ap.parse_args()

    prom = Prometheus(args.prometheus, args.timeout, args.time)
    allow = dict(ALLOW_EMPTY)
    for a in args.allow_empty:
        uid, _, title = a.partition("/")
        allow[(uid, title)] = "--allow-empty"

    files = args.dashboard or sorted((ROOT / "dashboards").glob("*.json"))
    if not files:
        print("no dashboards found", file=sys.stderr)
        return 2
    reach_deadline = time.monotonic() + args.wait
    while True:
        try:
            prom.get("/api/v1/status/buildinfo", {})
            break
        except (PromError, OSError) as e:
            if time.monotonic() >= reach_deadline:
                print(f"cannot reach Prometheus at {args.prometheus}: {e}", file=sys.stderr)
                return 2
            time.sleep(min(args.wait_interval, 2.0))

    deadline = time.monotonic() + args.wait
    while True:
        rows, failures = run_checks(args, prom, allow, files)
        if not failures or time.monotonic() >= deadline:
            break
        print(f"{len(failures)} failure(s); retrying for another {int(deadline - time.monotonic())}s", file=sys.stderr)
        time.sleep(args.wait_interval)

    print(table(rows, ["dashboard", "panel / variable", "ref", "status", "series", "query"]))
    if failures:
        print(f"\n{len(failures)} failure(s):", file=sys.stderr)
        for x in failures:
            print(f"  - {x}", file=sys.stderr)
        return 1
    print(f"\nall {len(rows)} queries ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
