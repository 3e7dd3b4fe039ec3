#!/usr/bin/env bash
# Installs the Debian packages the node agent's tests need.
#
#   hack/agent-deps.sh          packages for the agent's host-root tests
#                               (real git + make build of the stub module
#                               against Debian's kernel headers; openssl
#                               makes the key pair it is signed with)
#   hack/agent-deps.sh --vm     additionally the packages for hack/test-vm.sh
#                               (QEMU, a Debian kernel, busybox, cpio, and
#                               libc6-dev for the static map-hold helper)
#
# Idempotent: packages already installed are not reinstalled, and apt-get
# update runs only when something is missing. Needs root (or sudo).
set -euo pipefail

want=(git make gcc kmod linux-headers-amd64 gpg openssl)
if [[ "${1:-}" == "--vm" ]]; then
    want+=(qemu-system-x86 linux-image-amd64 busybox-static cpio musl-tools libc6-dev)
fi

missing=()
for p in "${want[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "agent-deps: all present: ${want[*]}"
    exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

echo "agent-deps: installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "agent-deps: installed: ${missing[*]}"
