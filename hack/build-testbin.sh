#!/usr/bin/env bash
# Builds the binaries of the local test cluster from the Go module proxy, at the
# versions pinned in hack/versions.env, into a cache outside the repository:
#   ${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}/<component>-<version>/
# A component whose directory is complete is never rebuilt. Prints the bin dir.
# Downloads and `go build`s print nothing for minutes when cold: each says
# what it builds, and a heartbeat line (hack/lib.sh) follows every 20 s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
# shellcheck source=versions.env
source "$here/versions.env"
cache=${TTDRV_TESTBIN_CACHE:-$HOME/.cache/ttdrv-testbin}
mkdir -p "$cache"
# One builder at a time per cache: two that build the same component at once
# (a test lane and a benchmark, two clones) each move their half-built
# directory over the other's. The second waits, then finds it built.
exec 9>"$cache/.lock"
if ! flock -n 9; then
  printf '[build-testbin %s] waiting for another build into %s\n' "$(date +%H:%M:%S)" "$cache" >&2
  flock 9
fi
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -mod=mod"
export GOPROXY=${GOPROXY:-https://proxy.golang.org,direct}

log() { printf '[build-testbin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# done_marker DIR: a directory counts as built only once this file exists, so an
# interrupted build is redone rather than trusted.
built() { [ -f "$1/.complete" ]; }

# build_k8s_cmds DIR CMD...: go build of k8s.io/kubernetes/cmd/<CMD> at
# $K8S_VERSION into DIR, through a wrapper module (see below).
build_k8s_cmds() {
  local dir=$1; shift
  local work; work=$(mktemp -d)
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local staging="v0.${K8S_VERSION#v1.}"
  (
    cd "$work"
    go mod init ttdrv.local/k8sbuild >/dev/null 2>&1
    # k8s.io/kubernetes replaces its staging modules with local paths; mirror that
    # list with the published v0.Y.Z modules so the main module resolves.
    log "kubernetes: downloading k8s.io/kubernetes@$K8S_VERSION"
    heartbeat_start "downloading k8s.io/kubernetes@$K8S_VERSION"
    local gomod; gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    heartbeat_stop
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk '{print $1}' | sort -u | while read -r m; do
      go mod edit -replace "$m=$m@$staging"
    done
    { printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for c in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
      printf ')\n'; } > tools.go
    log "kubernetes: resolving modules"
    heartbeat_start "resolving and downloading the Kubernetes modules"
    go mod tidy -e >/dev/null 2>&1 || true
    go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
    heartbeat_stop
    local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
    mkdir -p "$dir.tmp"
    for c in "$@"; do
      log "kubernetes: go build $c"
      with_heartbeat "go build $c" go build -ldflags "$ld" -o "$dir.tmp/$c" "k8s.io/kubernetes/cmd/$c"
    done
  )
  rm -rf "$work" "$dir"; mv "$dir.tmp" "$dir"; touch "$dir/.complete"
}

build_k8s() {
  local dir="$cache/kubernetes-$K8S_VERSION"
  if built "$dir"; then log "kubernetes $K8S_VERSION: cached in $dir"; return; fi
  log "kubernetes $K8S_VERSION: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (cold: tens of minutes)"
  build_k8s_cmds "$dir" kube-apiserver kube-controller-manager kube-scheduler kubectl
  log "kubernetes $K8S_VERSION: done"
}

# The node components of the real test node (hack/realnode.sh): same module
# versions as the control plane, a cache directory of their own.
build_k8s_node() {
  local dir="$cache/kubernetes-node-$K8S_VERSION"
  if built "$dir"; then log "kubernetes node $K8S_VERSION: cached in $dir"; return; fi
  log "kubernetes node $K8S_VERSION: building kubelet, kube-proxy (cold Go cache: ~6 min)"
  build_k8s_cmds "$dir" kubelet kube-proxy
  log "kubernetes node $K8S_VERSION: done"
}

build_etcd() {
  local dir="$cache/etcd-$ETCD_VERSION"
  if built "$dir"; then log "etcd $ETCD_VERSION: cached in $dir"; return; fi
  log "etcd $ETCD_VERSION: building"
  local work; work=$(mktemp -d)
  (
    cd "$work"
    go mod init ttdrv.local/etcdbuild >/dev/null 2>&1
    heartbeat_start "resolving and downloading the etcd modules"
    local gomod; gomod=$(go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    go mod edit -require "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    # server/v3 replaces its sibling modules with ../ paths; use the published ones.
    grep -oE '^\s*go\.etcd\.io/etcd/[a-z0-9/]+ => \.\./' "$gomod" | awk '{print $1}' | sort -u | while read -r m; do
      go mod edit -replace "$m=$m@$ETCD_VERSION"
    done
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
    go mod tidy -e >/dev/null 2>&1 || true
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    heartbeat_stop
    mkdir -p "$dir.tmp"
    log "etcd: go build etcd"
    with_heartbeat "go build etcd" go build -ldflags "-s -w" -o "$dir.tmp/etcd" go.etcd.io/etcd/server/v3
  )
  rm -rf "$work" "$dir"; mv "$dir.tmp" "$dir"; touch "$dir/.complete"
  log "etcd $ETCD_VERSION: done"
}

build_goinstall() { # name version pkg...
  local name=$1 ver=$2; shift 2
  local dir="$cache/$name-$ver"
  if built "$dir"; then log "$name $ver: cached in $dir"; return; fi
  log "$name $ver: go install $*"
  mkdir -p "$dir.tmp"
  for p in "$@"; do with_heartbeat "go install $p@$ver (download and build)" env GOBIN="$dir.tmp" go install -ldflags "-s -w" "$p@$ver"; done
  rm -rf "$dir"; mv "$dir.tmp" "$dir"; touch "$dir/.complete"
  log "$name $ver: done"
}

want=${*:-all}
start=$(date +%s)
for w in $want; do
  case $w in
    all) build_etcd; build_goinstall kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl; build_k8s
         build_k8s_node; build_goinstall helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
    etcd) build_etcd ;;
    kwok) build_goinstall kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl ;;
    kubernetes) build_k8s ;;
    node) build_k8s_node ;;
    helm) build_goinstall helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
    *) echo "unknown component $w" >&2; exit 2 ;;
  esac
done
# One flat bin dir of symlinks, so callers need a single PATH entry.
bin="$cache/bin-$K8S_VERSION-$ETCD_VERSION-$KWOK_VERSION-$HELM_VERSION"
mkdir -p "$bin"
for d in "$cache/kubernetes-$K8S_VERSION" "$cache/kubernetes-node-$K8S_VERSION" "$cache/etcd-$ETCD_VERSION" "$cache/kwok-$KWOK_VERSION" "$cache/helm-$HELM_VERSION"; do
  [ -d "$d" ] || continue
  for f in "$d"/*; do ln -sf "$f" "$bin/$(basename "$f")"; done
done
log "finished in $(( $(date +%s) - start ))s; cache size $(du -sh "$cache" | cut -f1)"
echo "$bin"
