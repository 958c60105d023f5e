#!/bin/bash
# The Kubernetes side of the e2e test e2e/k8s_test.go: a real etcd and
# kube-apiserver, and the real external-snapshot-metadata sidecar and its
# snapshot-metadata-lister, built from Go modules pinned in etcd/,
# kube-apiserver/ and sidecar/ (go.mod + go.sum each). No Docker, no cluster:
# the test runs them on 127.0.0.1 in front of our server.
#
#   e2e/k8s/k8s.sh build     build the binaries, or find them in the cache, and
#                            print their folder (also holds crds/*.yaml)
#   e2e/k8s/k8s.sh dir       print that folder if it is built; exit 1 if not
#   e2e/k8s/k8s.sh up        run the e2e flow (./dev.sh e2e -run TestK8sSidecar)
#                            and keep everything up: Ceph, our server, etcd,
#                            kube-apiserver, sidecar; prints a sourceable env
#   e2e/k8s/k8s.sh down      let a held run end (it stops what it started)
#   e2e/k8s/k8s.sh tidy      regenerate the go.mod/go.sum files (module proxy)
#   e2e/k8s/k8s.sh clean     remove cached builds of other pins
#   e2e/k8s/k8s.sh csi-operator      build ceph-csi-operator's manager (pinned in
#                            operator/) or find it in the cache; print its folder,
#                            which also holds the manifests a user applies
#                            csi-operator/install.yaml and rook/*.yaml
#   e2e/k8s/k8s.sh csi-operator-dir  print that folder if it is built; exit 1 if not
#   e2e/k8s/k8s.sh helm      build helm (helm/go.mod, for deploy/helm's chart in
#                            k8s_deploy_test.go) or find it in the cache; print
#                            its folder ($RSM_K8S_CACHE/helm-<hash>)
#   e2e/k8s/k8s.sh helm-tidy regenerate helm/go.mod and go.sum
#
# The build takes ~5 min with cold Go caches on 2 cores (~1 GB of modules);
# its output lives in $RSM_K8S_CACHE/<hash of the pins, go.sum files and Go
# version>, so that a warm run only hashes a few files. Go's module and build
# caches are the default ones.
#
# Environment: RSM_K8S_CACHE (default /var/cache/rbd-snapshot-metadata/k8s-bin),
# RSM_K8S_STATE (up/down; default /var/tmp/rsm-k8s-up).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${RSM_K8S_CACHE:-/var/cache/rbd-snapshot-metadata/k8s-bin}
STATE=${RSM_K8S_STATE:-/var/tmp/rsm-k8s-up}

# The pins. The go.mod files hold the same versions; these name what to build.
ETCD=v3.6.5       # go.etcd.io/etcd/server/v3
K8S=v1.34.2       # k8s.io/kubernetes; its staging modules replaced by v0.34.2
ESM=v1.1.0        # external-snapshot-metadata; client replaced by client@v1.0.0
# The lister of ESM v1.1.0 (tools/snapshot-metadata-lister, unchanged since
# v1.0.0) is a nested module that pins ESM v0.2.0, whose
# SnapshotMetadataService API is v1alpha1: it would not find the v1beta1 CR
# the v1.1.0 sidecar reads. Its main.go is byte-identical to v0.2.0's
# examples/snapshot-metadata-lister/main.go, which is in the v0.2.0 module
# zip: build that file against ESM v1.1.0.
LISTER_FROM=github.com/kubernetes-csi/external-snapshot-metadata@v0.2.0
LISTER_SHA256=42da2a518846b11b498830d3ed88abbf7995d7861fa3afc191d3be96f711a55c
# CRDs: VolumeSnapshot* from the external-snapshotter client ESM v1.1.0 uses,
# SnapshotMetadataService (v1beta1) from ESM's client (its v1.1.0 tag's
# client/ is identical to client@v1.0.0, which the proxy serves).
SNAP_CLIENT=github.com/kubernetes-csi/external-snapshotter/client/v8@v8.6.0
ESM_CLIENT=github.com/kubernetes-csi/external-snapshot-metadata/client@v1.0.0
BUILD_REV=1       # bump when the build commands below change

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "k8s: $*" >&2; }
die() { log "$*"; exit 1; }

key() {
  {
    go env GOVERSION GOOS GOARCH
    echo "$BUILD_REV $ETCD $K8S $ESM $LISTER_FROM $LISTER_SHA256 $SNAP_CLIENT $ESM_CLIENT"
    (cd "$HERE" && sha256sum etcd/* kube-apiserver/* kubectl/* sidecar/*)
  } | sha256sum | cut -c1-16
}

moddir() { # MODULE@VERSION (run in a module that requires it, or outside any)
  local j
  j=$(go mod download -json "$1") ||
    die "go mod download $1 failed (no module proxy?): $(sed -n 's/^\t"Error": //p' <<<"$j")"
  sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$j"
}

# src DIR: the three modules in DIR, with the lister's main.go in sidecar/lister.
src() {
  local d=$1 f
  cp -r "$HERE"/{etcd,kube-apiserver,kubectl,sidecar} "$d"/
  f=$(cd / && moddir "$LISTER_FROM")/examples/snapshot-metadata-lister/main.go
  mkdir -p "$d/sidecar/lister"
  install -m 644 "$f" "$d/sidecar/lister/main.go"
  echo "$LISTER_SHA256  $d/sidecar/lister/main.go" | sha256sum -c --quiet - ||
    die "$LISTER_FROM's lister changed: check it against ESM $ESM's tools/snapshot-metadata-lister"
}

build() {
  local k out t0 t
  k=$(key); out=$CACHE/$k
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.lock"
  flock -w 1800 8 || die "timed out waiting for $CACHE/.lock"
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  t0=$(now)
  tmp=$(mktemp -d "$CACHE/.tmp.XXXXXX")   # global: the EXIT trap needs it
  trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/src" "$tmp/bin"
  src "$tmp/src"
  b() { # NAME MODULE-DIR PACKAGE LDFLAGS
    t=$(now)
    (cd "$tmp/src/$2" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $4" -o "$tmp/bin/$1" "$3") ||
      die "building $1 failed (needs the Go module proxy when the module cache is cold)"
    log "built $1 in $(since "$t")"
  }
  log "building etcd $ETCD, kube-apiserver and kubectl $K8S, csi-snapshot-metadata $ESM and its lister into $out (~5 min when Go's caches are cold)"
  b etcd etcd . ""
  b kube-apiserver kube-apiserver . "-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34"
  b kubectl kubectl . "-X k8s.io/client-go/pkg/version.gitVersion=$K8S -X k8s.io/component-base/version.gitVersion=$K8S"
  b csi-snapshot-metadata sidecar github.com/kubernetes-csi/external-snapshot-metadata/cmd/csi-snapshot-metadata "-X main.version=$ESM"
  b snapshot-metadata-lister sidecar ./lister ""
  mkdir "$tmp/bin/crds"
  local sd ed
  sd=$(cd "$tmp/src/sidecar" && moddir "$SNAP_CLIENT")/config/crd
  ed=$(cd "$tmp/src/sidecar" && moddir "$ESM_CLIENT")/config/crd
  install -m 644 "$sd"/snapshot.storage.k8s.io_volumesnapshot{classes,contents,s}.yaml \
    "$ed"/cbt.storage.k8s.io_snapshotmetadataservices.yaml "$tmp/bin/crds/"
  printf 'etcd %s\nkube-apiserver %s\nkubectl %s\ncsi-snapshot-metadata %s\nsnapshot-metadata-lister %s (%s)\ncrds %s %s\n%s\n' \
    "$ETCD" "$K8S" "$K8S" "$ESM" "$ESM" "$LISTER_FROM" "$SNAP_CLIENT" "$ESM_CLIENT" "$(go env GOVERSION)" >"$tmp/bin/VERSIONS"
  touch "$tmp/bin/.complete"
  rm -rf "$out"
  mv "$tmp/bin" "$out"
  log "built into $out in $(since "$t0")"
  echo "$out"
}

tidy() {
  local d
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  src "$tmp"
  for d in etcd kube-apiserver kubectl sidecar; do
    (cd "$tmp/$d" && go mod tidy) || die "go mod tidy in $d failed"
    cp "$tmp/$d"/go.{mod,sum} "$HERE/$d/"
  done
  log "go.mod/go.sum updated; the next build gets a new cache key"
}

clean() {
  local k d
  k=$(key)
  for d in "$CACHE"/*/; do
    [ -d "$d" ] && [ "$(basename "$d")" != "$k" ] && [ "$(basename "$d")" != "csi-operator-$(csiop_key)" ] &&
      [ "$(basename "$d")" != "helm-$(helm_key)" ] && { rm -rf "$d"; log "removed $d"; }
  done
  return 0
}

# ------------------------------------------------------- ceph-csi-operator --
# The real ceph-csi-operator for e2e/k8s_operator_test.go: its manager built
# from the module proxy at CSIOP (pinned in operator/go.mod; its hash in
# operator/go.sum, since the checksum database does not list the module),
# its own all-in-one manifest at that tag, and Rook's manifests at ROOK, the
# ones Rook's quick start creates (crds, common, csi-operator, operator).
# The manager runs as a process against the test's kube-apiserver.
CSIOP=v1.0.4      # github.com/ceph/ceph-csi-operator
CSIOP_INSTALL_SHA256=be46f9e4119b09a2fce558942acd4f88307f91a70e098d8354474f3165e7224e
ROOK_FROM=github.com/rook/rook@v1.20.6   # only its deploy/examples manifests
ROOK_SHA256="7fa7462d44b35d636703a03a88120030692a06a05ac91ec253200cb4ae8c37cf crds.yaml
2d59b3093446dcf7dd69c73ebaef2d41e8cdfd14af564c2e885d49ab8d190457 common.yaml
de0bf9160c8370220353d7140a4b60ee6d4b8eda5e260f395fd00cbdc1059ffb csi-operator.yaml
c69bb7309b6dfc34a1eeab658a1f9c825c7d156fb26dc1a6a824f6a9735761a4 operator.yaml"
CSIOP_BUILD_REV=1 # bump when csiop_build's commands change
export GONOSUMDB=${GONOSUMDB:+$GONOSUMDB,}github.com/ceph/ceph-csi-operator

csiop_key() {
  {
    go env GOVERSION GOOS GOARCH
    echo "$CSIOP_BUILD_REV $CSIOP $CSIOP_INSTALL_SHA256 $ROOK_FROM $ROOK_SHA256"
    (cd "$HERE" && sha256sum operator/*)
  } | sha256sum | cut -c1-16
}

csiop_build() {
  local out t0 od rd f
  out=$CACHE/csi-operator-$(csiop_key)
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  mkdir -p "$CACHE"
  exec 7>"$CACHE/.lock-csi-operator"
  flock -w 1800 7 || die "timed out waiting for $CACHE/.lock-csi-operator"
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  t0=$(now)
  tmp=$(mktemp -d "$CACHE/.tmp.XXXXXX")   # global: the EXIT trap needs it
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src" "$tmp/bin/csi-operator" "$tmp/bin/rook"
  cp "$HERE"/operator/go.{mod,sum} "$tmp/src/"
  log "building ceph-csi-operator $CSIOP's manager into $out (~4 min on 2 idle cores, 24 min at load 20, when Go's caches are cold)"
  (cd "$tmp/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/bin/manager" github.com/ceph/ceph-csi-operator/cmd) ||
    die "building ceph-csi-operator $CSIOP failed (needs the Go module proxy when the module cache is cold)"
  log "built the manager in $(since "$t0")"
  od=$(cd "$tmp/src" && moddir "github.com/ceph/ceph-csi-operator@$CSIOP")
  install -m 644 "$od/deploy/all-in-one/install.yaml" "$tmp/bin/csi-operator/"
  echo "$CSIOP_INSTALL_SHA256  $tmp/bin/csi-operator/install.yaml" | sha256sum -c --quiet - ||
    die "ceph-csi-operator $CSIOP's deploy/all-in-one/install.yaml is not the one pinned"
  rd=$(cd / && moddir "$ROOK_FROM")/deploy/examples
  while read -r sum f; do
    install -m 644 "$rd/$f" "$tmp/bin/rook/"
    echo "$sum  $tmp/bin/rook/$f" | sha256sum -c --quiet - || die "$ROOK_FROM's $f is not the one pinned"
  done <<<"$ROOK_SHA256"
  printf 'ceph-csi-operator %s (manager, deploy/all-in-one/install.yaml)\nrook %s (deploy/examples)\n%s\n' \
    "$CSIOP" "$ROOK_FROM" "$(go env GOVERSION)" >"$tmp/bin/VERSIONS"
  touch "$tmp/bin/.complete"
  rm -rf "$out"
  mv "$tmp/bin" "$out"
  log "ceph-csi-operator built into $out in $(since "$t0")"
  echo "$out"
}

alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]; }

# up: the test's hold mode. It uses $STATE as its folder (bound into the
# rootfs at the same path), writes $STATE/env once the flow passed, and waits
# while $STATE/hold exists; then its cleanups stop everything, and
# run-e2e.sh the Ceph cluster.
up() {
  [ -f "$STATE/run.pid" ] && alive "$(cat "$STATE/run.pid")" && die "already up ($STATE): run down first"
  rm -rf "$STATE"; mkdir -p "$STATE"; touch "$STATE/hold"
  RSM_K8S_HOLD=$STATE RSM_BIND="$STATE${RSM_BIND:+ $RSM_BIND}" setsid \
    "$HERE/../../dev.sh" e2e -run '^TestK8sSidecar$' -v -timeout 3h </dev/null >"$STATE/run.log" 2>&1 &
  echo $! >"$STATE/run.pid"
  log "starting (log: $STATE/run.log) ..."
  until [ -f "$STATE/env" ]; do
    alive "$(cat "$STATE/run.pid")" || { tail -n 40 "$STATE/run.log" >&2; die "the run ended before it was up"; }
    sleep 1
  done
  cat "$STATE/env"
}

down() {
  [ -f "$STATE/run.pid" ] || die "nothing up in $STATE"
  local pid i
  pid=$(cat "$STATE/run.pid")
  rm -f "$STATE/hold"
  for ((i = 0; i < 1200; i++)); do alive "$pid" || break; sleep 0.1; done
  alive "$pid" && die "run $pid still going after 120 s; see $STATE/run.log"
  rm -f "$STATE/run.pid"
  tail -n 5 "$STATE/run.log" >&2
}

# ---- helm: a build of its own (its own cache key and folder), for the
# chart in deploy/helm, which k8s_deploy_test.go renders, installs and
# upgrades with it. Built from helm.sh/helm/v3's cmd/helm as helm's Makefile
# builds a release (CGO off, -trimpath, the version and Kubernetes version
# ldflags); helm/go.mod pins it and everything it needs.
HELM=v3.22.0      # helm.sh/helm/v3
HELM_K8S_MINOR=37 # its k8s.io/client-go v0.37.x: helm's default capabilities
HELM_BUILD_REV=1  # bump when helm_build's commands change

helm_key() {
  {
    go env GOVERSION GOOS GOARCH
    echo "$HELM_BUILD_REV $HELM $HELM_K8S_MINOR"
    (cd "$HERE" && sha256sum helm/*)
  } | sha256sum | cut -c1-16
}

helm_build() {
  local out t0 x=helm.sh/helm/v3
  out=$CACHE/helm-$(helm_key)
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  mkdir -p "$CACHE"
  exec 7>"$CACHE/.helm.lock"
  flock -w 1800 7 || die "timed out waiting for $CACHE/.helm.lock"
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  t0=$(now)
  htmp=$(mktemp -d "$CACHE/.tmp-helm.XXXXXX")   # global: the EXIT trap needs it
  trap 'rm -rf "$htmp"' EXIT
  cp -r "$HERE/helm" "$htmp/src"
  log "building helm $HELM into $out (a few minutes when Go's caches are cold)"
  (cd "$htmp/src" && CGO_ENABLED=0 go build -trimpath -o "$htmp/bin/helm" -ldflags "-s -w \
    -X $x/internal/version.version=$HELM -X $x/internal/version.metadata= -X $x/internal/version.gitTreeState=clean \
    -X $x/pkg/lint/rules.k8sVersionMajor=1 -X $x/pkg/lint/rules.k8sVersionMinor=$HELM_K8S_MINOR \
    -X $x/pkg/chartutil.k8sVersionMajor=1 -X $x/pkg/chartutil.k8sVersionMinor=$HELM_K8S_MINOR" $x/cmd/helm) ||
    die "building helm failed (needs the Go module proxy when the module cache is cold)"
  "$htmp/bin/helm" version --short | grep -qx "$HELM" || die "the helm built says $("$htmp/bin/helm" version --short), want $HELM"
  printf 'helm %s\n%s\n' "$HELM" "$(go env GOVERSION)" >"$htmp/bin/VERSIONS"
  touch "$htmp/bin/.complete"
  rm -rf "$out"
  mv "$htmp/bin" "$out"
  log "built helm into $out in $(since "$t0")"
  echo "$out"
}

helm_tidy() {
  htmp=$(mktemp -d); trap 'rm -rf "$htmp"' EXIT
  cp "$HERE"/helm/go.mod "$htmp/"
  (cd "$htmp" && go mod tidy) || die "go mod tidy in helm failed"
  cp "$htmp"/go.{mod,sum} "$HERE/helm/"
}

case "${1:-}" in
build) build ;;
dir) d=$CACHE/$(key); [ -f "$d/.complete" ] || die "not built: $d"; echo "$d" ;;
up | down | tidy | clean) "$1" ;;
csi-operator) csiop_build ;;
csi-operator-dir) d=$CACHE/csi-operator-$(csiop_key); [ -f "$d/.complete" ] || die "not built: $d"; echo "$d" ;;
helm) helm_build ;;
helm-tidy) helm_tidy ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
