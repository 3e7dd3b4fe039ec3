#!/usr/bin/env bash
# Everything `make test` needs from outside the repository, installed when
# missing (the first step of `make test`, so the README's two commands are the
# whole set-up; .ci/run only calls `make test`):
#
#   Debian packages  the agent's real build (git, make, gcc, kmod, kernel
#                    headers) and the QEMU test (hack/agent-deps.sh --vm); the
#                    real node (containerd, runc, CNI plugins, iptables,
#                    conntrack, iproute2, openssl) and its images (mmdebstrap;
#                    binutils: objdump, for hack/test-images.sh's look into
#                    the agent image's tt-smi);
#                    the VM node's disk (e2fsprogs: mkfs.ext4);
#                    prometheus and promtool (hack/install-prometheus.sh, which
#                    keeps the package from starting its service)
#   Rust target      x86_64-unknown-linux-musl (static agent and controller)
#
# Idempotent and quiet when all is there: apt-get update runs only when a
# package is missing, and nothing installed is reinstalled. Needs root (or sudo).
# The Go-built test binaries come from hack/build-testbin.sh (cached), called by
# the Makefile and the test scripts themselves.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
log() { printf '[deps] %s\n' "$*" >&2; }

bash "$here/agent-deps.sh" --vm >&2

want=(containerd runc containernetworking-plugins iptables conntrack iproute2 openssl curl mmdebstrap util-linux e2fsprogs binutils)
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  # No init system starts anything here: containerd's package ships only a
  # systemd unit; the real node starts its own containerd (hack/realnode.sh).
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  log "installed: ${missing[*]}"
fi

bash "$here/install-prometheus.sh"

musl=x86_64-unknown-linux-musl
if ! rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
  log "adding Rust target $musl"
  rustup target add "$musl" >&2
fi
log "all present ($(( $(date +%s) - start ))s)"
