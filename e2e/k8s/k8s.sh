#!/bin/bash
# The Kubernetes side of the e2e tests: a real etcd and every binary of
# k8s.io/kubernetes the tests run (kube-apiserver and kubectl, which
# e2e/k8s_test.go runs on 127.0.0.1 in front of our server with no cluster,
# and kubelet, kube-proxy, kube-scheduler, kube-controller-manager for the
# one-node cluster of e2e/k8s/node.sh), CoreDNS, the real
# external-snapshot-metadata sidecar, its snapshot-metadata-lister and our
# backup-client (sidecar/backupclient), built from Go modules pinned in
# etcd/, kubernetes/, coredns/ and sidecar/ (go.mod + go.sum each); and the
# node's container images of those, as OCI archives.
#
#   e2e/k8s/k8s.sh build     build the binaries, or find them in the cache, and
#                            print their folder (also holds crds/*.yaml)
#   e2e/k8s/k8s.sh dir       print that folder if it is built; exit 1 if not
#   e2e/k8s/k8s.sh images    build (buildah, FROM scratch; root) the node's
#                            images from build's binaries and pause/pause.c, or
#                            find them in the cache; print their folder
#                            ($RSM_K8S_CACHE/images-<hash>), which holds one
#                            OCI archive per image, named in it by its fully
#                            qualified reference (ctr -n k8s.io images import
#                            keeps it), and IMAGES: "ARCHIVE REFERENCE" lines
#                              pause.tar                  registry.k8s.io/pause:3.10.1
#                              csi-snapshot-metadata.tar  registry.k8s.io/sig-storage/csi-snapshot-metadata:v1.1.0
#                              coredns.tar                registry.k8s.io/coredns/coredns:v1.12.1
#                              snapshot-metadata-lister.tar  rsm-e2e.local/snapshot-metadata-lister:v1.1.0
#                              backup-client.tar          rsm-e2e.local/backup-client:v1.1.0
#                            and the stand-ins (standin/, not the real images)
#                            for the images of Ceph-CSI v3.13.1's provisioner
#                            pod that cannot be had here:
#                              standin-cephcsi.tar        quay.io/cephcsi/cephcsi:v3.13.1
#                              standin-csi-provisioner.tar  registry.k8s.io/sig-storage/csi-provisioner:v5.0.1
#                              (and csi-snapshotter, csi-attacher, csi-resizer)
#   e2e/k8s/k8s.sh images-dir  print that folder if it is built; exit 1 if not
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
#   e2e/k8s/k8s.sh tools     build (or find) all that e2e/run-e2e.sh looks for:
#                            build, csi-operator and helm, for a run in a
#                            network namespace with no way to the module
#                            proxy; one that fails is said and the others
#                            are still made (its tests then fail there, as on
#                            a failed build); exits 0
#
# The six k8s.io/kubernetes binaries are one go build of upstream's own
# cmd/ mains in the module kubernetes/ (its go.mod's tool directives), so
# that what they share compiles once; CoreDNS, a module of its own, builds
# at the same time. With Go's caches cold, beside the other phases of a
# cold ./dev.sh test on 2 cores, it took 1,746 s (~1.5 GB of modules;
# docs/development.md); its output lives in
# $RSM_K8S_CACHE/<hash of the pins, the files of the four modules and the
# Go version>, so that a warm run only hashes a few files. That folder is
# hard links to two parts, each keyed on what it is built from alone
# (part_key): a change to the sidecar module (our backup-client) rebuilds
# the sidecar's three binaries, not the k8s.io/kubernetes ones. Go's module and
# build caches are the default ones. All binaries are static (CGO_ENABLED=0;
# kubelet too, which upstream's release links with cgo), for the node's
# Debian 13 chroot and the FROM scratch images.
#
# Environment: RSM_K8S_CACHE (default /var/cache/rbd-snapshot-metadata/k8s-bin),
# RSM_K8S_STATE (up/down; default /var/tmp/rsm-k8s-up).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${RSM_K8S_CACHE:-/var/cache/rbd-snapshot-metadata/k8s-bin}
STATE=${RSM_K8S_STATE:-/var/tmp/rsm-k8s-up}
# How long to wait for a build that another run holds the lock of: a cold
# build on a loaded 2-core machine takes over an hour (k8s.io/kubernetes's
# binaries: 66 min at load 20), and a waiter that gave up first failed the
# run. CI's own limit bounds a hung one.
LOCK_WAIT=${RSM_LOCK_WAIT:-7200}

# The pins. The go.mod files hold the same versions; these name what to build.
ETCD=v3.6.5       # go.etcd.io/etcd/server/v3
K8S=v1.34.2       # k8s.io/kubernetes; its staging modules replaced by v0.34.2
COREDNS=v1.12.1   # github.com/coredns/coredns: the CoreDNS kubeadm 1.34 deploys
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
BUILD_REV=2       # bump when the build commands below change
# The binaries of k8s.io/kubernetes, built from its own mains (the tool
# directives of kubernetes/go.mod).
K8S_CMDS=(kube-apiserver kubectl kubelet kube-proxy kube-scheduler kube-controller-manager)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "k8s: $*" >&2; }
die() { log "$*"; exit 1; }

key() {
  {
    go env GOVERSION GOOS GOARCH
    echo "$BUILD_REV $ETCD $K8S $COREDNS $ESM $LISTER_FROM $LISTER_SHA256 $SNAP_CLIENT $ESM_CLIENT ${K8S_CMDS[*]}"
    # Every file of the four modules (go.mod, go.sum, the mains).
    (cd "$HERE" && find etcd kubernetes coredns sidecar -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

moddir() { # MODULE@VERSION (run in a module that requires it, or outside any)
  local j
  j=$(go mod download -json "$1") ||
    die "go mod download $1 failed (no module proxy?): $(sed -n 's/^\t"Error": //p' <<<"$j")"
  sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$j"
}

# src DIR: the four modules in DIR, with the lister's main.go in sidecar/lister.
src() {
  local d=$1 f
  cp -r "$HERE"/{etcd,kubernetes,coredns,sidecar} "$d"/
  f=$(cd / && moddir "$LISTER_FROM")/examples/snapshot-metadata-lister/main.go
  mkdir -p "$d/sidecar/lister"
  install -m 644 "$f" "$d/sidecar/lister/main.go"
  echo "$LISTER_SHA256  $d/sidecar/lister/main.go" | sha256sum -c --quiet - ||
    die "$LISTER_FROM's lister changed: check it against ESM $ESM's tools/snapshot-metadata-lister"
}

# part_key PART: the hash of what a part of the build is made from: kube
# (the six k8s.io/kubernetes binaries, CoreDNS and etcd: about half an
# hour cold) or sidecar (csi-snapshot-metadata, its lister, our backup-client
# and the CRDs: minutes). A change to the backup-client, a test tool,
# rebuilds only the sidecar part.
part_key() {
  local dirs
  case $1 in
  kube) dirs=(etcd kubernetes coredns) ;;
  sidecar) dirs=(sidecar) ;;
  esac
  {
    go env GOVERSION GOOS GOARCH
    echo "$BUILD_REV $1"
    case $1 in
    kube) echo "$ETCD $K8S $COREDNS ${K8S_CMDS[*]}" ;;
    sidecar) echo "$ESM $LISTER_FROM $LISTER_SHA256 $SNAP_CLIENT $ESM_CLIENT" ;;
    esac
    (cd "$HERE" && find "${dirs[@]}" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

# b NAME MODULE-DIR LDFLAGS PACKAGE...: go build in $tmp/src/MODULE-DIR,
# -o $bout/NAME, or into $bout/ for several packages.
b() {
  local name=$1 dir=$2 ldflags=$3 o=$bout/$1 t
  shift 3
  [ $# -gt 1 ] && o=$bout/
  t=$(now)
  (cd "$tmp/src/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$o" "$@") ||
    die "building $name failed (needs the Go module proxy when the module cache is cold)"
  log "built $name in $(since "$t")"
}

# build_kube: the kube part into $bout, with its lines of VERSIONS in
# $bout/.versions.
build_kube() {
  local cpid c v=() p minor=${K8S#v1.} pkgs=()
  log "building etcd $ETCD, ${K8S_CMDS[*]} $K8S and coredns $COREDNS (20-30 min on 2 busy cores when Go's caches are cold)"
  # CoreDNS (a module of its own, so a go build of its own) compiles
  # while k8s.io/kubernetes does: it fills the cores that the big build's
  # serial stretches (its last packages, its links) leave idle.
  # (Its coremain.GitCommit, a commit hash in upstream's builds, stays empty.)
  b coredns coredns "" . &
  cpid=$!
  # As upstream's hack/lib/version.sh: the same variables in both packages.
  minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    v+=("-X $p.gitVersion=$K8S -X $p.gitMajor=1 -X $p.gitMinor=$minor")
  done
  for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (b "${K8S_CMDS[*]}" kubernetes "${v[*]}" "${pkgs[@]}") ||
    { wait "$cpid" || true; exit 1; }
  wait "$cpid" || exit 1
  b etcd etcd "" .
  # says CMD... LINE: CMD prints LINE among its lines. (Not CMD | grep -q:
  # grep quits at the first match, and kubectl, which prints a second line
  # after it, failed the pipe with SIGPIPE.)
  says() {
    local line=${*: -1} out
    out=$("${@:1:$#-1}") || die "$* failed"
    grep -qxF "$line" <<<"$out" || die "${*:1:$#-1} says $out, want $line"
  }
  for c in kube-apiserver kubelet kube-proxy kube-scheduler kube-controller-manager; do
    says "$bout/$c" --version "Kubernetes $K8S"
  done
  says "$bout/kubectl" version --client "Client Version: $K8S"
  says "$bout/coredns" -version "CoreDNS-${COREDNS#v}"
  {
    echo "etcd $ETCD"
    for c in "${K8S_CMDS[@]}"; do echo "$c $K8S (k8s.io/kubernetes/cmd/$c)"; done
    echo "coredns $COREDNS (errors health ready kubernetes prometheus forward cache loop reload loadbalance log)"
  } >"$bout/.versions"
}

# build_sidecar: the sidecar part into $bout, as build_kube.
build_sidecar() {
  local sd ed
  log "building csi-snapshot-metadata $ESM, its lister and backup-client"
  b csi-snapshot-metadata sidecar "-X main.version=$ESM" github.com/kubernetes-csi/external-snapshot-metadata/cmd/csi-snapshot-metadata
  b snapshot-metadata-lister sidecar "" ./lister
  b backup-client sidecar "" ./backupclient
  mkdir "$bout/crds"
  sd=$(cd "$tmp/src/sidecar" && moddir "$SNAP_CLIENT")/config/crd
  ed=$(cd "$tmp/src/sidecar" && moddir "$ESM_CLIENT")/config/crd
  install -m 644 "$sd"/snapshot.storage.k8s.io_volumesnapshot{classes,contents,s}.yaml \
    "$ed"/cbt.storage.k8s.io_snapshotmetadataservices.yaml "$bout/crds/"
  {
    echo "csi-snapshot-metadata $ESM"
    echo "snapshot-metadata-lister $ESM ($LISTER_FROM)"
    echo "backup-client (sidecar/backupclient, on $ESM's pkg/iterator)"
    echo "crds $SNAP_CLIENT $ESM_CLIENT"
  } >"$bout/.versions"
}

# build: every binary in one folder, $CACHE/<key>, made of hard links to
# the two parts' folders ($CACHE/part-<part>-<part_key>), each built only
# when its own key has no folder yet.
build() {
  local k out t0 part d
  k=$(key); out=$CACHE/$k
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.lock"
  flock -w "$LOCK_WAIT" 8 || die "timed out waiting for $CACHE/.lock"
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  t0=$(now)
  tmp=$(mktemp -d "$CACHE/.tmp.XXXXXX")   # global: the EXIT trap needs it
  trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/src" "$tmp/bin"
  src "$tmp/src"
  for part in kube sidecar; do
    d=$CACHE/part-$part-$(part_key "$part")
    if [ ! -f "$d/.complete" ]; then
      bout=$tmp/$part
      mkdir "$bout"
      "build_$part"
      touch "$bout/.complete"
      rm -rf "$d"
      mv "$bout" "$d"
    else
      log "$part: reused $d"
    fi
    cp -al "$d"/* "$tmp/bin/"
    cat "$d/.versions" >>"$tmp/bin/VERSIONS"
  done
  go env GOVERSION >>"$tmp/bin/VERSIONS"
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
  for d in etcd kubernetes coredns sidecar; do
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
      [ "$(basename "$d")" != "helm-$(helm_key)" ] && [ "$(basename "$d")" != "images-$(images_key)" ] &&
      [ "$(basename "$d")" != "part-kube-$(part_key kube)" ] && [ "$(basename "$d")" != "part-sidecar-$(part_key sidecar)" ] &&
      { rm -rf "$d"; log "removed $d"; }
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
  flock -w "$LOCK_WAIT" 7 || die "timed out waiting for $CACHE/.lock-csi-operator"
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  t0=$(now)
  tmp=$(mktemp -d "$CACHE/.tmp.XXXXXX")   # global: the EXIT trap needs it
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src" "$tmp/bin/csi-operator" "$tmp/bin/rook"
  cp "$HERE"/operator/go.{mod,sum} "$tmp/src/"
  log "building ceph-csi-operator $CSIOP's manager into $out (~5 min when Go's caches are cold)"
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
  flock -w "$LOCK_WAIT" 7 || die "timed out waiting for $CACHE/.helm.lock"
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  t0=$(now)
  htmp=$(mktemp -d "$CACHE/.tmp-helm.XXXXXX")   # global: the EXIT trap needs it
  trap 'rm -rf "$htmp"' EXIT
  cp -r "$HERE/helm" "$htmp/src"
  log "building helm $HELM into $out (~10 min on 2 busy cores when Go's caches are cold)"
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

# ---- images: the node's container images (e2e/k8s/node.sh imports them
# into containerd), built with Debian's buildah from scratch (no registry
# is reachable) out of build's static binaries, and pushed as OCI archives
# under their fully qualified names. Each image is as upstream's where there
# is one: pause and coredns FROM scratch (pause as its own user 65535, as
# upstream's; coredns as root, where upstream's runs as nonroot with a file
# capability: the add-on's pod adds NET_BIND_SERVICE), the sidecar FROM
# distroless/static, so here FROM scratch with its empty /tmp (mode 1777).
# The lister and the backup client are ours: static, /tmp, their binary as
# the entrypoint. pause is pause/pause.c, gcc -static -Os (libc6-dev's
# static glibc). The commits are stamped at time 0, so that the same inputs
# make the same image IDs.
#
# The stand-ins: one static binary (standin/, a module of its own with no
# dependencies) under the names of the images of Ceph-CSI v3.13.1's
# csi-rbdplugin-provisioner that cannot be had here: Ceph-CSI's own (the
# module proxy refuses ceph-csi) and its sig-storage sidecars (not needed by
# any check). It only creates or dials the sockets its arguments name and
# waits for SIGTERM (standin/main.go); the env STANDIN_FOR names the image,
# and every line it logs says "stand-in".
PAUSE=3.10.1      # the sandbox image kubelet/containerd 1.34 expect
IMAGES_REV=2      # bump when images_build's commands change
STANDINS="cephcsi quay.io/cephcsi/cephcsi:v3.13.1
csi-provisioner registry.k8s.io/sig-storage/csi-provisioner:v5.0.1
csi-snapshotter registry.k8s.io/sig-storage/csi-snapshotter:v8.2.0
csi-attacher registry.k8s.io/sig-storage/csi-attacher:v4.6.1
csi-resizer registry.k8s.io/sig-storage/csi-resizer:v1.11.1"
RSM_IMAGES="pause.tar registry.k8s.io/pause:$PAUSE
csi-snapshot-metadata.tar registry.k8s.io/sig-storage/csi-snapshot-metadata:$ESM
coredns.tar registry.k8s.io/coredns/coredns:$COREDNS
snapshot-metadata-lister.tar rsm-e2e.local/snapshot-metadata-lister:$ESM
backup-client.tar rsm-e2e.local/backup-client:$ESM
$(sed 's/^/standin-/; s/ /.tar /' <<<"$STANDINS")"

images_key() {
  {
    key
    echo "$IMAGES_REV $PAUSE $RSM_IMAGES"
    sha256sum "$HERE/pause/pause.c" | cut -d' ' -f1
    (cd "$HERE" && find standin -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    go env GOVERSION
    gcc -dumpfullversion 2>/dev/null || echo "no gcc"
    dpkg-query -W libc6-dev 2>/dev/null || echo "no libc6-dev"
    buildah --version 2>/dev/null || echo "no buildah"
  } | sha256sum | cut -c1-16
}

# static FILE: die unless FILE is an ELF without an interpreter (a FROM
# scratch image has no ld.so).
static() {
  readelf -l "$1" >/dev/null 2>&1 || die "$1 is not an ELF binary"
  ! readelf -l "$1" | grep -q 'program interpreter' || die "$1 is not static: a FROM scratch image cannot run it"
}

# image REF ARCHIVE ROOT CONFIG...: an image of the files in the folder ROOT,
# with buildah config's CONFIG options, pushed to $itmp/out/ARCHIVE as REF.
image() {
  local ref=$1 tar=$2 root=$3 t ctr mnt
  shift 3
  t=$(now)
  ctr=$(buildah from --pull=never scratch)
  mnt=$(buildah mount "$ctr")
  cp -a "$root/." "$mnt/"
  buildah umount "$ctr" >/dev/null
  buildah config --os linux --arch "$(go env GOARCH)" "$@" "$ctr"
  buildah commit --rm -q --timestamp 0 "$ctr" "$ref" >/dev/null
  buildah push -q "$ref" "oci-archive:$itmp/out/$tar:$ref"
  # The archive is the product: no name left behind in /var/lib/containers
  # for a later build to orphan.
  buildah rmi "$ref" >/dev/null
  log "built $ref ($tar, $(du -h "$itmp/out/$tar" | cut -f1)) in $(since "$t")"
}

images_build() {
  local bin out t0 r f
  bin=$(build) || exit 1
  out=$CACHE/images-$(images_key)
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  [ "$(id -u)" = 0 ] || die "images: buildah needs root"
  command -v buildah >/dev/null || die "images: no buildah (apt-get install buildah)"
  exec 6>"$CACHE/.images.lock"
  flock -w "$LOCK_WAIT" 6 || die "timed out waiting for $CACHE/.images.lock"
  [ -f "$out/.complete" ] && { echo "$out"; return; }
  t0=$(now)
  itmp=$(mktemp -d "$CACHE/.tmp-images.XXXXXX")   # global: the EXIT trap needs it
  trap 'rm -rf "$itmp"' EXIT
  mkdir "$itmp/out"
  gcc -static -Os -s -Wall -o "$itmp/pause.bin" "$HERE/pause/pause.c" ||
    die "gcc -static pause.c failed (the static libc is libc6-dev's libc.a)"
  (cd "$HERE/standin" && CGO_ENABLED=0 go build -trimpath -ldflags=-s -o "$itmp/standin.bin" .) ||
    die "go build of standin/ failed"
  for f in "$itmp/pause.bin" "$itmp/standin.bin" "$bin"/{csi-snapshot-metadata,coredns,snapshot-metadata-lister,backup-client}; do static "$f"; done
  # The root of each image: its binary, and an empty /tmp where it has one.
  for r in pause csi-snapshot-metadata coredns snapshot-metadata-lister backup-client; do
    mkdir "$itmp/$r"
    case $r in pause) install -m 755 "$itmp/pause.bin" "$itmp/$r/pause" ;; *) install -m 755 "$bin/$r" "$itmp/$r/" ;; esac
    case $r in csi-snapshot-metadata | snapshot-metadata-lister | backup-client) install -d -m 1777 "$itmp/$r/tmp" ;; esac
  done
  log "building the node's images into $out"
  imgref() { awk -v t="$1.tar" '$1 == t { print $2 }' <<<"$RSM_IMAGES"; }
  image "$(imgref pause)" pause.tar "$itmp/pause" --entrypoint '["/pause"]' --user 65535:65535
  image "$(imgref csi-snapshot-metadata)" csi-snapshot-metadata.tar "$itmp/csi-snapshot-metadata" \
    --entrypoint '["/csi-snapshot-metadata"]' --label description="CSI External Snapshot Metadata Sidecar"
  image "$(imgref coredns)" coredns.tar "$itmp/coredns" --entrypoint '["/coredns"]' --port 53 --port 53/udp
  image "$(imgref snapshot-metadata-lister)" snapshot-metadata-lister.tar "$itmp/snapshot-metadata-lister" \
    --entrypoint '["/snapshot-metadata-lister"]'
  image "$(imgref backup-client)" backup-client.tar "$itmp/backup-client" --entrypoint '["/backup-client"]'
  mkdir "$itmp/standin"
  install -m 755 "$itmp/standin.bin" "$itmp/standin/standin"
  while read -r r ref; do
    image "$ref" "standin-$r.tar" "$itmp/standin" --entrypoint '["/standin"]' --env STANDIN_FOR="$ref" \
      --label description="stand-in for $ref: not the real image (e2e/k8s/standin)"
  done <<<"$STANDINS"
  echo "$RSM_IMAGES" >"$itmp/out/IMAGES"
  touch "$itmp/out/.complete"
  rm -rf "$out"
  mv "$itmp/out" "$out"
  log "built the images into $out in $(since "$t0")"
  echo "$out"
}

# tools: see the usage above.
tools() {
  local what
  for what in build csi-operator helm; do
    "$0" "$what" >/dev/null || log "e2e/k8s/k8s.sh $what failed: the tests that need it will say so"
  done
}

case "${1:-}" in
build) build ;;
tools) tools ;;
dir) d=$CACHE/$(key); [ -f "$d/.complete" ] || die "not built: $d"; echo "$d" ;;
images) images_build ;;
images-dir) d=$CACHE/images-$(images_key); [ -f "$d/.complete" ] || die "not built: $d"; echo "$d" ;;
up | down | tidy | clean) "$1" ;;
csi-operator) csiop_build ;;
csi-operator-dir) d=$CACHE/csi-operator-$(csiop_key); [ -f "$d/.complete" ] || die "not built: $d"; echo "$d" ;;
helm) helm_build ;;
helm-tidy) helm_tidy ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
