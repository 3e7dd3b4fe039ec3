#!/usr/bin/env bash
# Checks the shipped observability artifacts; exits non-zero on the first failure.
#
#   bash hack/test-alerts.sh
#
#  1. promtool check rules  dashboards/alerts/ttdriver.rules.yaml
#  2. promtool test rules   dashboards/alerts/ttdriver.rules.test.yaml
#     (installs the Debian package `prometheus` when promtool is missing, without
#     letting it start a service: hack/install-prometheus.sh)
#  3. dashboards/*.json are what dashboards/generate.py produces
#  4. tests/repo_files.rs: the chart's copies of the rules and dashboards are
#     byte-identical; every dashboard has its stable uid, a recent
#     schemaVersion, the datasource/cr/cluster/job variables and only
#     non-Angular panels querying through ${datasource}; every alert has
#     severity, summary, description, `for:`, a runbook_url anchor of
#     docs/runbook.md and a firing and a non-firing promtool case; every
#     ttdriver_* metric is documented in docs/metrics.md
# What the chart renders of them is checked by hack/test-chart.sh (tests/chart.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=test-alerts
# shellcheck source=lib.sh
source hack/lib.sh

rules=dashboards/alerts/ttdriver.rules.yaml
tests=dashboards/alerts/ttdriver.rules.test.yaml

if ! command -v promtool >/dev/null 2>&1; then
  log "promtool not found; installing the Debian package prometheus"
  bash hack/install-prometheus.sh || die "installing the Debian package prometheus"
fi
log "$(promtool --version 2>&1 | head -n1)"
promtool check rules "$rules" || die "promtool check rules $rules"
(cd "$(dirname "$tests")" && promtool test rules "$(basename "$tests")") || die "promtool test rules $tests"
python3 dashboards/generate.py --check || die "dashboards/*.json are stale: run python3 dashboards/generate.py"
cargo test -q --test repo_files >&2 || die "tests/repo_files.rs"
log "all checks passed"
