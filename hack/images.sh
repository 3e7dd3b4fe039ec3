#!/usr/bin/env bash
# `make images`: the controller, agent, vfio, flasher and pause images as image archives
# (`docker save` layout, read by `ctr images import` and `docker load`), built
# without a registry or a container engine:
#
#   base layer   the Debian packages of hack/images/packages.txt for the
#                Dockerfile's base image, bootstrapped with mmdebstrap from the
#                Debian mirror this machine's apt uses (agent, vfio, flasher:
#                minbase + packages, like debian:bookworm-slim + apt-get install;
#                flasher: + the final stage's pip RUN, hack/images/pyvenv.sh;
#                controller: the packages distroless/static-debian12 is made of,
#                unpacked, plus its passwd/group, /home/nonroot, /tmp, CA bundle)
#   app layer    the files the Dockerfile's final stage copies from its build
#                stages: the project's static (musl) binaries, and for the agent
#                the real tt-smi (/opt/tt-smi/tt-smi): the PyInstaller one-file
#                build of agent/Dockerfile's tt-smi stage, its pip RUN run as
#                written in a Debian bookworm root (hack/images/tt-smi.sh)
#   config       the Dockerfile's ENTRYPOINT, CMD, ENV, USER and EXPOSE over the
#                base image's own (hack/images/dockerfile.py), and the OCI
#                annotation keys as labels (org.opencontainers.image.*: title,
#                description, version, revision, created = the commit's time,
#                source, licenses, vendor, base.name)
#   pause        a static sandbox ("pause") binary (hack/images/pause), the
#                real test node's sandbox image
#
# Outputs are cached outside the repository, keyed by their inputs:
#   ${TTDRV_IMAGES_CACHE:-~/.cache/ttdrv-images}/base/<image>-<key>.tar
#   ${TTDRV_IMAGES_CACHE:-~/.cache/ttdrv-images}/archives/<image>-<key>.tar
#   ${TTDRV_IMAGES_CACHE:-~/.cache/ttdrv-images}/tt-smi/tt-smi-<key>
#     (key: the tt-smi stage's pins and recipe; 45 to 70 s cold, see
#     hack/images/tt-smi.sh)
# and an unchanged input rebuilds nothing. Prints one line per image on stdout:
#   <image> <ref> <archive>
# (refs are localhost/ttdrv/<image>:dev-<key>); timings go to stderr.
#
# Env: IMAGES_PROFILE=debug|release (cargo profile of the binaries, default
# debug: the test builds share it with hack/test-vm.sh), CARGO_TARGET_DIR.
# Needs mmdebstrap (hack/deps.sh installs it) and the Rust target
# x86_64-unknown-linux-musl (added here with rustup when missing).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache=${TTDRV_IMAGES_CACHE:-$HOME/.cache/ttdrv-images}
profile=${IMAGES_PROFILE:-debug}
musl=x86_64-unknown-linux-musl
target_dir=${CARGO_TARGET_DIR:-$root/target}
df=hack/images/dockerfile.py
# Bump when the way a base layer is made changes (its cache key).
recipe=3

LIB_NAME=images
# shellcheck source=lib.sh
source hack/lib.sh

command -v mmdebstrap >/dev/null || die "mmdebstrap not found (bash hack/deps.sh installs it)"
mkdir -p "$cache/base" "$cache/archives" "$cache/work"

# --- binaries -----------------------------------------------------------------
if ! rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
  log "adding Rust target $musl"
  rustup target add "$musl" >&2 || die "rustup target add $musl failed"
fi
t0=$(date +%s.%N)
cargo_profile=()
[ "$profile" = release ] && cargo_profile=(--release)
CARGO_TARGET_DIR="$target_dir" cargo build -q --locked "${cargo_profile[@]}" --target "$musl" \
  -p ttdrv-controller --bin ttdrv-controller -p ttdrv-agent --bin ttdrv-agent \
  -p ttdrv-vfio --bin ttdrv-vfio-manage -p ttdrv-flasher --bin ttdrv-flash >&2
bindir="$target_dir/$musl/$profile"
for b in ttdrv-controller ttdrv-agent ttdrv-vfio-manage ttdrv-flash; do
  if readelf -d "$bindir/$b" 2>/dev/null | grep -q '(NEEDED)'; then die "$bindir/$b is not statically linked"; fi
done
pause_bin="$cache/work/pause"
(cd hack/images/pause && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-trimpath go build -ldflags '-s -w' -o "$pause_bin.part.$$" . && mv "$pause_bin.part.$$" "$pause_bin")
log "binaries ($profile, $musl) in $(since "$t0")s"
# The agent image's tt-smi (cached; built from agent/Dockerfile's tt-smi stage)
tt_smi=$(bash hack/images/tt-smi.sh) || die "building tt-smi failed"

# --- base layers --------------------------------------------------------------
# The Debian sources this machine's apt uses (the mirror is not named here).
sources=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
  [ -s "$f" ] && grep -qE '^(deb |Types:)' "$f" && { sources=$f; break; }
done
[ -n "$sources" ] || die "no Debian apt sources on this machine"

# base_layer IMAGE STAGE_JSON -> path of the cached rootfs tar
base_layer() {
  local image=$1 stage=$2 suite variant pkgs key out pip
  suite=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["base"]["suite"])' "$stage")
  variant=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["base"]["variant"])' "$stage")
  pkgs=$(python3 "$df" packages "$image" | paste -sd, -)
  # the final stage's pip RUN (pinned versions), for the images that have one
  pip=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])).get("pip_run"); print(f" pip={r}" if r else "")' "$stage")
  [ -z "$pip" ] || pip="$pip hook=$(sha256sum <hack/images/pyvenv.sh | cut -c1-16)"
  key=$( { echo "recipe=$recipe suite=$suite variant=$variant packages=$pkgs$pip"; cat "$sources"; mmdebstrap --version; } \
    | sha256sum | cut -c1-16)
  out="$cache/base/$image-$key.tar"
  if [ -s "$out" ]; then log "base $image: cached ($out)"; echo "$out"; return; fi
  local t0; t0=$(date +%s.%N)
  local -a args=(--mode=root --quiet --include="$pkgs"
    # like the -slim images: no manuals, docs (but copyrights) or translations
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/apt/* "$1"/var/log/dpkg.log')
  [ -z "$pip" ] || args+=(--customize-hook="bash $root/hack/images/pyvenv.sh \"\$1\" $stage")
  case $variant in
    minbase) args+=(--variant=minbase) ;;
    extract)
      # distroless/static: the listed packages' files only, and its users,
      # home, /tmp and CA bundle (hack/images/distroless.sh)
      args+=(--variant=extract --extract-hook="bash $root/hack/images/distroless.sh \"\$1\" ${pkgs//,/ }") ;;
    *) die "unknown variant $variant" ;;
  esac
  log "base $image: mmdebstrap --variant=$variant $suite ($pkgs)"
  # (mmdebstrap picks the output format from the name's extension)
  local part="$cache/base/.$image-$key.part.tar"
  mmdebstrap "${args[@]}" "$suite" "$part" "$sources" >&2 || { rm -rf "$part"; die "mmdebstrap for $image failed"; }
  mv "$part" "$out"
  log "base $image: built in $(since "$t0")s, $(du -h "$out" | cut -f1)"
  # keep the two newest base layers of each image
  ls -1t "$cache/base/$image-"*.tar 2>/dev/null | tail -n +3 | xargs -r rm -f
  echo "$out"
}

# --- images -------------------------------------------------------------------
work=$(mktemp -d "$cache/work/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The OCI labels of every image say which commit and version it was built
# from (created is the commit's time, so a rebuild is byte-identical).
version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || revision="$revision-dirty"
created=$(git log -1 --format=%cI 2>/dev/null || echo 1970-01-01T00:00:00Z)

# image NAME DOCKERFILE: builds (or finds) the archive, prints "<image> <ref> <archive>"
image() {
  local image=$1 dockerfile=$2 stage="$work/$1.stage.json" base layer="$work/$1.layer"
  python3 "$df" final-stage "$dockerfile" >"$stage"
  python3 hack/images/stage.py labels "$image" "$stage" "$version" "$revision" "$created"
  base=$(base_layer "$image" "$stage")
  mkdir -p "$layer"
  # The files the final stage copies from its build stages.
  python3 hack/images/stage.py layer "$stage" "$layer" "$bindir" "$tt_smi"
  local key
  key=$( { basename "$base"; cat "$stage"; (cd "$layer" && find . -type f -print0 | sort -z | xargs -0 sha256sum); } \
    | sha256sum | cut -c1-12)
  local ref="localhost/ttdrv/$image:dev-$key" out="$cache/archives/$image-$key.tar"
  if [ -s "$out" ]; then
    log "image $image: cached ($ref)"
  else
    local t0; t0=$(date +%s.%N)
    python3 hack/images/archive.py --ref "$ref" --stage "$stage" --layer-tar "$base" --layer-dir "$layer" "$out" >&2
    log "image $image: archive written in $(since "$t0")s, $(du -h "$out" | cut -f1)"
    ls -1t "$cache/archives/$image-"*.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  fi
  echo "$image $ref $out"
}

pause_image() {
  local stage="$work/pause.stage.json" layer="$work/pause.layer"
  printf '{"from": "scratch", "env": [], "entrypoint": ["/pause"], "cmd": null, "user": "65535:65535", "workdir": null, "expose": [], "base": {"env": [], "user": "", "workdir": ""}}\n' >"$stage"
  mkdir -p "$layer"
  install -m 0755 "$pause_bin" "$layer/pause"
  local key; key=$(cat "$stage" "$layer/pause" | sha256sum | cut -c1-12)
  local ref="localhost/ttdrv/pause:dev-$key" out="$cache/archives/pause-$key.tar"
  if [ ! -s "$out" ]; then
    python3 hack/images/archive.py --ref "$ref" --stage "$stage" --layer-dir "$layer" "$out" >&2
    ls -1t "$cache/archives/pause-"*.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  fi
  echo "pause $ref $out"
}

image controller Dockerfile
image agent agent/Dockerfile
image vfio vfio/Dockerfile
image flasher flasher/Dockerfile
pause_image
log "done"
