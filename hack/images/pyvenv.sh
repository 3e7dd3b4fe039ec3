#!/usr/bin/env bash
# mmdebstrap --customize-hook of `make images` (hack/images.sh) for an image
# whose Dockerfile's final stage pip-installs (flasher/Dockerfile: the venv
# /opt/tt of tt-flash and tt-smi):
#
#   pyvenv.sh ROOTFS STAGE_JSON
#
# runs the stage's "pip_run" (hack/images/dockerfile.py: the RUN as written,
# its ARGs substituted) chrooted into ROOTFS with the Dockerfile's SHELL.
# pip reaches the package index the way this machine's pip does: its CA
# bundle (PIP_CERT, else /etc/ssl/certs/ca-certificates.crt) is copied in for
# the run, and the index and proxy settings of the environment (or of pip's
# own config here: global.index-url) are passed on. Nothing of that stays in
# the image.
set -euo pipefail
rootfs=$1 stage=$2
cmd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pip_run"])' "$stage")
ca=/tmp/.make-images-ca.crt
cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$rootfs$ca"
trap 'rm -f "$rootfs$ca"' EXIT
index=${PIP_INDEX_URL:-$( (pip3 config get global.index-url || pip config get global.index-url) 2>/dev/null || true)}
pass=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
  PIP_CERT=$ca PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-180}")
[ -n "$index" ] && pass+=("PIP_INDEX_URL=$index")
for v in PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST HTTPS_PROXY https_proxy HTTP_PROXY http_proxy NO_PROXY no_proxy; do
  [ -n "${!v:-}" ] && pass+=("$v=${!v}")
done
env -i "${pass[@]}" chroot "$rootfs" /bin/bash -o pipefail -c "$cmd"
rm -rf "$rootfs/root/.cache"  # (--no-cache-dir should leave none)
