#!/usr/bin/env bash
# `make release`: the artefacts of a release, in dist/<version>/:
#
#   tt-k8s-driver-manager-<version>.tgz      the Helm chart, packaged, version and
#                                            appVersion = the workspace version
#   ttdrv-controller-<version>-linux-amd64.tar  the images as archives (docker save
#   ttdrv-agent-<version>-linux-amd64.tar       layout: `docker load`, `ctr images
#   ttdrv-vfio-<version>-linux-amd64.tar        import`, `skopeo copy docker-archive:`),
#   ttdrv-flasher-<version>-linux-amd64.tar
#                                            tagged ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/<image>:<version>,
#                                            with OCI labels (hack/images.sh)
#   kubectl-tt-driver-<version>-linux-amd64.tar.gz  the plugin (static binary) and
#                                            its kubectl completion shims
#   kubectl-tt.yaml                          the krew manifest of plugin `tt`
#   SHA256SUMS                               sha256 of every file above
#
# Then it checks what it wrote: the checksums, the packaged chart (lint,
# render, schema), the image labels and tags, the krew manifest's sha256.
#
# Env: RELEASE_PROFILE=release|debug (cargo profile, default release; debug
# for a quick try), RELEASE_DIR (default dist/<version>), CARGO_TARGET_DIR.
# Publishing (helm push to oci://ghcr.io/..., the images, a GitHub release
# with these files) is not done here: docs/install.md shows the commands.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[release] %s\n' "$*" >&2; }
die() { printf '[release] FAIL: %s\n' "$*" >&2; exit 1; }

# shellcheck source=versions.env
source hack/versions.env
repo=https://github.com/tenstorrent/tt-k8s-driver-manager-rs
registry=ghcr.io/tenstorrent/tt-k8s-driver-manager-rs
musl=x86_64-unknown-linux-musl
profile=${RELEASE_PROFILE:-release}
target_dir=${CARGO_TARGET_DIR:-$root/target}

version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
read -r chart_version app_version < <(python3 -c '
import re
t = open("chart/Chart.yaml").read()
g = lambda k: re.search(rf"(?m)^{k}:\s*\"?([^\"\s]+)", t).group(1)
print(g("version"), g("appVersion"))')
[ "$chart_version" = "$version" ] && [ "$app_version" = "$version" ] \
  || die "chart/Chart.yaml version $chart_version / appVersion $app_version differ from the workspace version $version: bump them together"
out=${RELEASE_DIR:-dist/$version}
rm -rf "$out"
mkdir -p "$out"
log "version $version into $out (cargo profile $profile)"

helm_bin=$(command -v helm 2>/dev/null || true)
if [ -z "$helm_bin" ]; then
  bash hack/build-testbin.sh helm >/dev/null 2>&1 || die "no helm (hack/build-testbin.sh helm)"
  helm_bin="${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}/helm-$HELM_VERSION/helm"
fi

# --- the chart ----------------------------------------------------------------------
"$helm_bin" package chart --version "$version" --app-version "$version" -d "$out" >/dev/null
chart_tgz="$out/tt-k8s-driver-manager-$version.tgz"
[ -s "$chart_tgz" ] || die "helm package wrote no $chart_tgz"
log "chart: $(basename "$chart_tgz")"

# --- the images ---------------------------------------------------------------------
images=$(IMAGES_PROFILE=$profile CARGO_TARGET_DIR=$target_dir bash hack/images.sh)
for image in controller agent vfio flasher; do
  archive=$(awk -v i="$image" '$1 == i { print $3 }' <<<"$images")
  [ -s "$archive" ] || die "hack/images.sh built no $image archive"
  # The same image under its release name: only manifest.json's RepoTags change.
  python3 - "$archive" "$out/ttdrv-$image-$version-linux-amd64.tar" "$registry/$image:$version" <<'PY'
import io, json, sys, tarfile
src, dst, ref = sys.argv[1:4]
with tarfile.open(src) as i, tarfile.open(dst, "w") as o:
    for m in i.getmembers():
        data = i.extractfile(m).read() if m.isreg() else None
        if m.name == "manifest.json":
            man = json.loads(data)
            man[0]["RepoTags"] = [ref]
            data = json.dumps(man).encode()
            m.size = len(data)
        o.addfile(m, io.BytesIO(data) if data is not None else None)
PY
  log "image $image: ttdrv-$image-$version-linux-amd64.tar ($registry/$image:$version)"
done

# --- the plugin -----------------------------------------------------------------------
cargo_profile=()
[ "$profile" = release ] && cargo_profile=(--release)
CARGO_TARGET_DIR="$target_dir" cargo build -q --locked "${cargo_profile[@]}" --target "$musl" -p kubectl-tt-driver >&2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$target_dir/$musl/$profile/kubectl-tt-driver" "$stage/kubectl-tt-driver"
strip --strip-debug "$stage/kubectl-tt-driver"
install -m 0755 plugin/kubectl_complete-tt-driver "$stage/kubectl_complete-tt-driver"
# krew installs the plugin as kubectl-tt: the shim under that name too.
install -m 0755 plugin/kubectl_complete-tt-driver "$stage/kubectl_complete-tt"
plugin_tgz="kubectl-tt-driver-$version-linux-amd64.tar.gz"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -cf - . | gzip -n >"$out/$plugin_tgz"
plugin_sha=$(sha256sum "$out/$plugin_tgz" | cut -d' ' -f1)
log "plugin: $plugin_tgz"

# --- the krew manifest ----------------------------------------------------------------
cat >"$out/kubectl-tt.yaml" <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  # Plugin "tt": krew installs it as kubectl-tt, which kubectl runs for
  # "kubectl tt driver" (a plugin "tt-driver" would be "kubectl tt-driver").
  name: tt
spec:
  version: v$version
  homepage: $repo
  shortDescription: Show and steer tt-kmd driver rollouts on Tenstorrent nodes
  description: |
    kubectl tt driver shows the rollouts of Tenstorrent's tt-kmd kernel driver
    that TenstorrentDriverPolicy (ttdp) objects drive: status, a live watch
    with progress and ETA, a dry-run plan of a version bump, pause, resume,
    retry of a failed node, and the installer pods' logs.
  caveats: |
    Run it as: kubectl tt driver --help
    Shell completion (kubectl 1.26+): put kubectl_complete-tt from the
    plugin's directory (kubectl krew info tt) on your PATH.
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: amd64
      uri: $repo/releases/download/v$version/$plugin_tgz
      sha256: $plugin_sha
      files:
        - from: kubectl-tt-driver
          to: .
        - from: kubectl_complete-tt
          to: .
      bin: kubectl-tt-driver
YAML
log "krew manifest: kubectl-tt.yaml"

(cd "$out" && sha256sum -- * >SHA256SUMS)

# --- checks -----------------------------------------------------------------------------
(cd "$out" && sha256sum --quiet -c SHA256SUMS) || die "SHA256SUMS does not verify"
kv=(--kube-version "${K8S_VERSION#v}")
"$helm_bin" lint --strict "$chart_tgz" "${kv[@]}" >/dev/null || die "helm lint of the packaged chart"
rendered=$("$helm_bin" template tt-k8s-driver-manager "$chart_tgz" -n tt-k8s-driver-manager-system "${kv[@]}")
grep -q "image: \"$registry/controller:$version\"" <<<"$rendered" || die "the packaged chart does not run controller $version"
grep -q "value: \"$registry/agent:$version\"" <<<"$rendered" || die "the packaged chart does not install agent $version"
# (a listing first: grep -q closing the pipe early would fail tar under pipefail)
listing=$(tar -tzf "$chart_tgz")
grep -qx 'tt-k8s-driver-manager/values.schema.json' <<<"$listing" || die "values.schema.json missing from the package"
grep -qx 'tt-k8s-driver-manager/templates/tests/test-controller.yaml' <<<"$listing" || die "helm test missing from the package"
! grep -q '^tt-k8s-driver-manager/tests/' <<<"$listing" || die "chart/tests/ (goldens) packaged"
python3 - "$out" "$version" "$registry" "$plugin_sha" <<'PY' || die "artefact checks"
import json, sys, tarfile
out, version, registry, sha = sys.argv[1:5]
for image in ("controller", "agent", "vfio", "flasher"):
    with tarfile.open(f"{out}/ttdrv-{image}-{version}-linux-amd64.tar") as t:
        man = json.load(t.extractfile("manifest.json"))
        cfg = json.load(t.extractfile(man[0]["Config"]))
    assert man[0]["RepoTags"] == [f"{registry}/{image}:{version}"], man
    labels = cfg["config"].get("Labels") or {}
    assert labels.get("org.opencontainers.image.version") == version, labels
    assert labels.get("org.opencontainers.image.revision"), labels
krew = open(f"{out}/kubectl-tt.yaml").read()
assert f"sha256: {sha}" in krew and "name: tt\n" in krew, krew
PY
log "checked: checksums, packaged chart, image tags and labels, krew manifest"
ls -l "$out" >&2
echo "$out"
