#!/usr/bin/env bash
# The agent image's tt-smi for `make images` (hack/images.sh) and the VM test
# (hack/test-vm.sh real): the PyInstaller one-file build of agent/Dockerfile's
# `tt-smi` stage, made the way that stage makes it, without a container engine.
#
#   tt-smi.sh            prints the path of the (cached) binary on stdout
#
# How: a Debian bookworm root (mmdebstrap --variant=minbase, from the Debian
# mirror this machine's apt uses) with python3 3.11, python3-venv,
# libpython3.11 (PyInstaller bundles the shared libpython) and the packages
# the stage's apt-get RUN installs (binutils, libatomic1); in it, a venv
# first on PATH and the stage's pip RUN as the Dockerfile writes it (read by
# `stage.py build-stage`: the pins tt-smi==${TT_SMI_VERSION} and
# pyinstaller==..., the --collect-all list, the --version check), run by
# hack/images/pyvenv.sh through this machine's pip index. The stage's base is python:3.11-slim-
# bookworm; this is Debian's Python 3.11 on the same bookworm glibc (2.36),
# so the binary's glibc floor is the one agent/Dockerfile documents.
#
# Cached outside the repository, keyed by its inputs (the stage's FROM and
# RUNs with the pins, this script, pyvenv.sh, the Debian sources, mmdebstrap's
# version):
#   ${TTDRV_IMAGES_CACHE:-~/.cache/ttdrv-images}/tt-smi/tt-smi-<key>
# A cold build takes minutes (bootstrap, pip, PyInstaller); its output goes to
# <cache>/tt-smi/build.log and a line of progress reaches stderr every 30 s.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cache=${TTDRV_IMAGES_CACHE:-$HOME/.cache/ttdrv-images}
LIB_NAME=images
# shellcheck source=../lib.sh
source hack/lib.sh
command -v mmdebstrap >/dev/null || die "mmdebstrap not found (bash hack/deps.sh installs it)"
mkdir -p "$cache/tt-smi"

stage=$(python3 hack/images/stage.py build-stage agent/Dockerfile tt-smi)
from=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["from"])' <<<"$stage")
case $from in
  python:3.11-slim-bookworm) suite=bookworm py=3.11 ;;
  *) die "agent/Dockerfile's tt-smi stage is FROM $from; hack/images/tt-smi.sh knows python:3.11-slim-bookworm only" ;;
esac
run=$(python3 -c 'import json,sys; r=[x for x in json.load(sys.stdin)["run"] if "pip install" in x]; assert len(r)==1, r; print(r[0])' <<<"$stage") \
  || die "agent/Dockerfile's tt-smi stage must have exactly one RUN with pip install"
workdir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["workdir"] or "/build")' <<<"$stage")
# What the python image brings (Python with its shared libpython, a venv for
# pip, the CA bundle), and the packages the stage's apt-get RUN installs.
apt=$(python3 -c '
import json, re, sys
r = [x for x in json.load(sys.stdin)["run"] if "apt-get install" in x]
assert len(r) == 1, r
words = r[0].split("--no-install-recommends", 1)[1].split("&&")[0].split()
assert words and all(re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", w) for w in words), words
print(",".join(words))' <<<"$stage") || die "agent/Dockerfile's tt-smi stage must have one apt-get install --no-install-recommends RUN naming its packages"
pkgs=python3,python3-venv,libpython$py,ca-certificates,$apt

sources=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
  [ -s "$f" ] && grep -qE '^(deb |Types:)' "$f" && { sources=$f; break; }
done
[ -n "$sources" ] || die "no Debian apt sources on this machine"

key=$( { echo "suite=$suite packages=$pkgs"; echo "$stage"; cat hack/images/tt-smi.sh hack/images/pyvenv.sh "$sources"; mmdebstrap --version; } \
  | sha256sum | cut -c1-16)
out="$cache/tt-smi/tt-smi-$key"
if [ -s "$out" ]; then log "tt-smi: cached ($out)"; echo "$out"; exit 0; fi

t0=$(date +%s.%N)
work=$(mktemp -d "$cache/tt-smi/.build.XXXXXX")
buildlog="$cache/tt-smi/build.log"
ticker=""
trap 'rm -rf "$work"; [ -z "$ticker" ] || kill "$ticker" 2>/dev/null || true' EXIT
# The RUN as written, in a venv first on PATH (Debian's python3 refuses a
# system-wide pip install); its WORKDIR made first, as Docker does.
python3 -c 'import json,sys; json.dump({"pip_run": sys.argv[1]}, sys.stdout)' \
  "python3 -m venv /opt/venv && export PATH=/opt/venv/bin:\$PATH && python3 -c \"import sys; assert '%d.%d' % sys.version_info[:2] == '$py', sys.version\" \
   && mkdir -p $workdir && cd $workdir && echo '[tt-smi.sh] pip install and pyinstaller' && $run" >"$work/stage.json"
log "tt-smi: building (mmdebstrap $suite + $pkgs, then: ${run%%&&*}; PyInstaller one-file); log in $buildlog"
(
  while sleep 30; do
    log "tt-smi: still building ($(since "$t0")s): $(grep -v '^\s*$' "$buildlog" 2>/dev/null | tail -n1 | cut -c1-120)"
  done
) &
ticker=$!
if ! mmdebstrap --mode=root --variant=minbase --include="$pkgs" \
    --customize-hook="bash $root/hack/images/pyvenv.sh \"\$1\" $work/stage.json" \
    --customize-hook="copy-out /out/tt-smi $work" \
    "$suite" /dev/null "$sources" >"$buildlog" 2>&1; then
  tail -n 40 "$buildlog" >&2
  die "building tt-smi failed (log: $buildlog)"
fi
kill "$ticker" 2>/dev/null || true; ticker=""
[ -s "$work/tt-smi" ] || die "the build left no /out/tt-smi (log: $buildlog)"
mv "$work/tt-smi" "$out"
chmod 0755 "$out"
log "tt-smi: built in $(since "$t0")s, $(du -h "$out" | cut -f1)"
# keep the two newest builds
ls -1t "$cache/tt-smi/tt-smi-"* 2>/dev/null | tail -n +3 | xargs -r rm -f
echo "$out"
