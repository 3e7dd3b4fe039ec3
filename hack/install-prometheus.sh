#!/usr/bin/env bash
# Installs Debian's `prometheus` package (prometheus and promtool) for the tests
# without letting it start its own service: for the duration of the apt-get
# install, /usr/sbin/policy-rc.d answers 101 ("action forbidden") to every
# service start, and afterwards whatever was there before is put back.
#
# The tests run their own prometheus, on a free port with its own data
# directory (hack/test-prometheus.sh). A prometheus service already running
# from an earlier install is left alone: never stopped, never queried.
#
#   bash hack/install-prometheus.sh     # no-op when prometheus and promtool are on PATH
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  exit 0
fi

log() { printf '[install-prometheus] %s\n' "$*" >&2; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

policy=/usr/sbin/policy-rc.d
saved=$policy.ttdrv-saved
marker="# written by tt-driver-manager hack/install-prometheus.sh for one apt-get install"

exists() { $SUDO test -e "$1" || $SUDO test -L "$1"; }
ours() { $SUDO grep -qxF "$marker" "$1" 2>/dev/null; }

# Put the previous policy back: ours goes, the saved one (if any) returns.
restore() {
  if exists "$policy" && ours "$policy"; then $SUDO rm -f "$policy"; fi
  if exists "$saved"; then $SUDO mv -f "$saved" "$policy"; fi
}

if exists "$saved" && exists "$policy" && ! ours "$policy"; then
  # $saved is left by an interrupted run; the current file is not ours either.
  log "both $policy and $saved exist; keep the one you want as $policy and remove the other"
  exit 1
fi
trap restore EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
if exists "$saved"; then
  # An earlier run was interrupted: $saved is the original (restored at the end).
  log "$saved left by an interrupted run: it goes back to $policy afterwards"
elif exists "$policy"; then
  if ours "$policy"; then
    log "removing our $policy left by an interrupted run"
    $SUDO rm -f "$policy"
  else
    $SUDO mv "$policy" "$saved"
  fi
fi

tmp=$(mktemp)
printf '#!/bin/sh\n%s\nexit 101\n' "$marker" >"$tmp"
$SUDO install -m 0755 "$tmp" "$policy"
rm -f "$tmp"

log "installing the Debian package prometheus (service starts denied by $policy)"
$SUDO apt-get update -qq >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  -o DPkg::Lock::Timeout=300 prometheus >&2
command -v promtool >/dev/null 2>&1 || { log "promtool still missing after installing prometheus"; exit 1; }
command -v prometheus >/dev/null 2>&1 || { log "prometheus still missing after installing prometheus"; exit 1; }
log "installed $(prometheus --version 2>&1 | head -n1)"
