#!/bin/bash
# A one-node Kubernetes that runs real pods, for e2e/pods_test.go and for a
# developer (./dev.sh node): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kube-proxy v1.34.2 (e2e/k8s/k8s.sh build),
# Debian's containerd and runc with the CNI bridge, host-local, portmap and
# loopback plugins (the reef rootfs has them), and CoreDNS deployed from
# Kubernetes' own add-on manifest. Every process is started here and
# stopped by its PID; nothing is installed on the machine.
#
#   e2e/k8s/node.sh up DIR     start it all with DIR as its folder (logs in
#                              DIR/logs, PIDs in DIR/pids, the admin
#                              kubeconfig DIR/kubeconfig); prints DIR/env
#   e2e/k8s/node.sh down DIR   stop what up started (pods first), unmount,
#                              remove its cgroups and restore the sysctls
#                              the kubelet changed
#
# It runs inside the reef rootfs (e2e/in-rootfs.sh) and inside a network
# namespace of its own (e2e/run-pods.sh makes one), never in the machine's:
# the kubelet and kube-proxy rewrite iptables. The node's address is the
# namespace's address RSM_NODE_IP; pods reach it, so a Ceph cluster bound
# there (RSM_CEPH_ADDR) serves them.
#
# Environment: RSM_K8S_BIN (the binaries; default: e2e/k8s/k8s.sh dir),
# RSM_NODE_IMAGES (folders of OCI archives to import, *.tar, space separated),
# RSM_NODE_IP (required), RSM_NODE_NAME (default rsm-node).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

K8S_VERSION=v1.34.2
COREDNS_IMAGE=registry.k8s.io/coredns/coredns:v1.12.1
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC=10.96.0.1
DNS_SVC=10.96.0.10
POD_CIDR=10.244.0.0/24
NODE=${RSM_NODE_NAME:-rsm-node}
# The host-global sysctls the kubelet sets (protectKernelDefaults: false);
# down puts the values back.
KUBELET_SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "node: $*" >&2; }
die() { log "$*"; exit 1; }
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]; }

# wait_for WHAT SECONDS CMD...: poll CMD every 0.2 s.
wait_for() {
  local what=$1 secs=$2 t0
  shift 2
  t0=$(now)
  until "$@" >/dev/null 2>&1; do
    awk -v a="$t0" -v b="$(now)" -v s="$secs" 'BEGIN { exit !(b - a > s) }' &&
      die "$what: not ready after ${secs}s (logs in $D/logs)"
    sleep 0.2
  done
  log "$what ready in $(since "$t0")"
}

# start NAME BIN ARGS...: a process of the node, its output in logs/NAME.log.
start() {
  local name=$1 bin=$2
  shift 2
  setsid "$bin" "$@" </dev/null >"$D/logs/$name.log" 2>&1 &
  echo $! >"$D/pids/$name"
  echo "$name" >>"$D/pids/order"
}

# ---------------------------------------------------------------- PKI --

# cert NAME SUBJECT [SANS]: DIR/pki/NAME.{crt,key} signed by the node's CA;
# a server certificate when SANS (an openssl subjectAltName) is given.
cert() {
  local name=$1 subj=$2 sans=${3:-} p=$D/pki ext
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$subj" \
    -keyout "$p/$name.key" -out "$p/$name.csr" 2>/dev/null
  if [ -n "$sans" ]; then
    ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans"
  else
    ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  fi
  openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -days 2 -extfile <(echo "$ext") -out "$p/$name.crt" 2>/dev/null
  rm -f "$p/$name.csr"
}

# kubeconfig NAME: DIR/NAME.kubeconfig for the user of pki/NAME.crt.
kubeconfig() {
  cat >"$D/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rsm-node
  cluster: {server: "https://$IP:6443", certificate-authority: "$D/pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$D/pki/$1.crt", client-key: "$D/pki/$1.key"}
contexts:
- name: $1
  context: {cluster: rsm-node, user: $1}
current-context: $1
EOF
}

pki() {
  local p=$D/pki
  mkdir -p "$p"
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=rsm-node-ca -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  cert apiserver /CN=kube-apiserver \
    "IP:$IP,IP:$KUBERNETES_SVC,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert kubelet-serving "/CN=system:node:$NODE/O=system:nodes" "IP:$IP,DNS:$NODE"
  cert admin /CN=rsm-node-admin/O=system:masters
  cert apiserver-kubelet-client /CN=kube-apiserver-kubelet-client/O=system:masters
  cert controller-manager /CN=system:kube-controller-manager
  cert scheduler /CN=system:kube-scheduler
  cert node "/CN=system:node:$NODE/O=system:nodes"
  cert kube-proxy /CN=system:kube-proxy
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  for u in admin controller-manager scheduler node kube-proxy; do kubeconfig "$u"; done
  cp "$D/admin.kubeconfig" "$D/kubeconfig"
}

# -------------------------------------------------------- the network --

netns_ok() {
  [ "$(readlink /proc/self/ns/net)" != "$(readlink /proc/1/ns/net)" ] ||
    die "refusing to run in the machine's network namespace (the kubelet and kube-proxy rewrite iptables): use e2e/run-pods.sh or ./dev.sh node"
  IP=${RSM_NODE_IP:-}
  [ -n "$IP" ] || die "RSM_NODE_IP is not set: the node's address in this network namespace"
  grep -q . /proc/net/route || die "no route in this network namespace"
  echo 1 >/proc/sys/net/ipv4/ip_forward
  [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
}

# sysctl_path NAME: its file under /proc/sys (no procps in the rootfs).
sysctl_path() { echo "/proc/sys/${1//.//}"; }

cni() {
  mkdir -p "$D/cni/net.d"
  cat >"$D/cni/net.d/10-rsm-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "rsm-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$D/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# ----------------------------------------------------------- containerd --

containerd_up() {
  local c=$D/containerd
  mkdir -p "$c/root" "$c/state"
  cat >"$c/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$c/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  tolerate_missing_hugepages_controller = true
  disable_hugetlb_controller = true
  # Root here lacks CAP_SYS_RESOURCE, so no process may lower its
  # oom_score_adj (the kubelet gives sandboxes -998): keep pods at or
  # above containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "${RSM_NODE_RUNC:-/usr/sbin/runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni/net.d"
EOF
  start containerd containerd --config "$c/config.toml"
  wait_for containerd 60 ctr --address "$c/containerd.sock" version
  local f t d
  for d in ${RSM_NODE_IMAGES:-}; do for f in "$d"/*.tar; do
    [ -f "$f" ] || continue
    t=$(now)
    ctr --address "$c/containerd.sock" -n k8s.io images import --snapshotter overlayfs "$f" >>"$D/logs/images.log" 2>&1 ||
      die "importing $f failed: $(tail -n 3 "$D/logs/images.log")"
    log "imported $(basename "$f") in $(since "$t")"
  done; done
  ctr --address "$c/containerd.sock" -n k8s.io images ls -q | sed 's/^/node: image /' >&2
}

# ------------------------------------------------------- control plane --

control_plane() {
  local b=$BIN
  start etcd "$b/etcd" --name rsm-node --data-dir "$D/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster rsm-node=http://127.0.0.1:2380 --listen-metrics-urls= --unsafe-no-fsync
  wait_for etcd 60 bash -c 'exec 3<>/dev/tcp/127.0.0.1/2379'
  start kube-apiserver "$b/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$IP" \
    --tls-cert-file="$D/pki/apiserver.crt" --tls-private-key-file="$D/pki/apiserver.key" \
    --client-ca-file="$D/pki/ca.crt" \
    --kubelet-client-certificate="$D/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$D/pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$D/pki/sa.pub" --service-account-signing-key-file="$D/pki/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-cluster-ip-range=$SERVICE_CIDR --allow-privileged=true
  wait_for kube-apiserver 180 kubectl get --raw /readyz
  start kube-controller-manager "$b/kube-controller-manager" --kubeconfig="$D/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$D/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$D/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$D/pki/sa.key" --root-ca-file="$D/pki/ca.crt" \
    --cluster-signing-cert-file="$D/pki/ca.crt" --cluster-signing-key-file="$D/pki/ca.key" \
    --service-cluster-ip-range=$SERVICE_CIDR --controllers='*,-nodeipam'
  start kube-scheduler "$b/kube-scheduler" --kubeconfig="$D/scheduler.kubeconfig" \
    --authentication-kubeconfig="$D/scheduler.kubeconfig" \
    --authorization-kubeconfig="$D/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false
  kubectl apply -f "$b/crds/" >/dev/null
}

# ----------------------------------------------------------------- node --

kubelet_up() {
  local k=$D/kubelet s
  mkdir -p "$k/root"
  # Pods must not inherit the machine's resolver (unreachable from here);
  # CoreDNS (dnsPolicy: Default) forwards to this one, which answers
  # nothing: only the cluster's names resolve.
  echo "nameserver $IP" >"$D/resolv.conf"
  for s in $KUBELET_SYSCTLS; do echo "$s $(cat "$(sysctl_path "$s")")"; done >"$D/sysctls"
  # The kubelet wants its cgroupRoot to exist in every hierarchy; a new
  # cpuset cgroup starts with no CPUs and no memory nodes.
  for c in /sys/fs/cgroup/*/; do
    [ "$c" != /sys/fs/cgroup/unified/ ] || continue
    mkdir -p "$c$CGROUP"
  done
  cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$CGROUP/cpuset.cpus"
  cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$CGROUP/cpuset.mems"
  cat >"$k/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$D/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$D/pki/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$D/pki/kubelet-serving.crt"
tlsPrivateKeyFile: "$D/pki/kubelet-serving.key"
clusterDNS: [$DNS_SVC]
clusterDomain: cluster.local
resolvConf: "$D/resolv.conf"
imageGCHighThresholdPercent: 100
evictionHard: {nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
serializeImagePulls: false
podLogsDir: "$D/pod-logs"
EOF
  start kubelet "$BIN/kubelet" --config="$k/config.yaml" --kubeconfig="$D/node.kubeconfig" \
    --hostname-override="$NODE" --node-ip="$IP" --root-dir="$k/root" --v=2
  cat >"$D/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: "$D/kube-proxy.kubeconfig"}
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$BIN/kube-proxy" --config="$D/kube-proxy.yaml"
  wait_for "node $NODE Ready" 180 sh -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
}

# CoreDNS, as Kubernetes ships the add-on (cluster/addons/dns/coredns in
# the k8s.io/kubernetes module), with its placeholders filled in.
coredns() {
  local base
  base=$(cd "$HERE/kubernetes" 2>/dev/null && go list -m -f '{{.Dir}}' k8s.io/kubernetes 2>/dev/null || true)
  [ -n "$base" ] || base=/root/go/pkg/mod/k8s.io/kubernetes@$K8S_VERSION
  base=$base/cluster/addons/dns/coredns/coredns.yaml.base
  [ -f "$base" ] || die "no CoreDNS add-on manifest at $base"
  sed -e "s/__DNS__DOMAIN__/cluster.local/g" -e "s/__DNS__SERVER__/$DNS_SVC/g" \
    -e "s/__DNS__MEMORY__LIMIT__/170Mi/g" -e "s#image: registry.k8s.io/coredns/coredns:.*#image: $COREDNS_IMAGE#" \
    -e "s/imagePullPolicy: IfNotPresent/imagePullPolicy: Never/" "$base" >"$D/coredns.yaml"
  kubectl apply -f "$D/coredns.yaml" >/dev/null
  wait_for CoreDNS 180 kubectl -n kube-system rollout status deploy/coredns --timeout=2s
}

up() {
  local t0
  t0=$(now)
  [ ! -s "$D/pids/order" ] || die "$D is in use: run down first"
  mkdir -p "$D/logs" "$D/pids"
  BIN=${RSM_K8S_BIN:-$("$HERE/k8s.sh" dir)}
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    [ -x "$BIN/$b" ] || die "no $b in $BIN (e2e/k8s/k8s.sh build)"
  done
  for b in containerd runc ctr iptables openssl /usr/lib/cni/bridge; do
    command -v "$b" >/dev/null || die "no $b: run inside the reef rootfs (e2e/rootfs.sh installs it)"
  done
  netns_ok
  CGROUP=rsm-node-$$
  echo "$CGROUP" >"$D/cgroup"
  export PATH="$BIN:$PATH" KUBECONFIG=$D/admin.kubeconfig
  pki
  cni
  control_plane
  containerd_up
  kubelet_up
  coredns
  cat >"$D/env" <<EOF
KUBECONFIG=$D/kubeconfig
RSM_NODE_DIR=$D
RSM_NODE_IP=$IP
RSM_NODE_NAME=$NODE
RSM_NODE_CONTAINERD=$D/containerd/containerd.sock
EOF
  log "up in $(since "$t0"): node $NODE at $IP, logs in $D/logs, kubeconfig $D/kubeconfig"
  cat "$D/env"
}

# ----------------------------------------------------------------- down --

stop_pid() { # NAME SIGNAL-WAIT-SECONDS
  local f=$D/pids/$1 pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < $2 * 10; i++)); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && { log "$1 (pid $pid) still running after ${2}s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  fi
  rm -f "$f"
}

down() {
  [ -d "$D/pids" ] || die "nothing up in $D"
  local sock=$D/containerd/containerd.sock c p cg
  export PATH="${RSM_K8S_BIN:-/nonexistent}:$PATH"
  # The kubelet first, so that it restarts nothing; then every container
  # and sandbox, so that no shim outlives containerd.
  stop_pid kube-proxy 10
  stop_pid kubelet 20
  if [ -S "$sock" ] && [ -f "$D/pids/containerd" ] && alive "$(cat "$D/pids/containerd")"; then
    for c in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
    done
    sleep 1
    for c in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true
    done
  fi
  stop_pid containerd 20
  # Shims (their own session) and anything left in the node's cgroups.
  cg=$(cat "$D/cgroup" 2>/dev/null || true)
  for p in /proc/[0-9]*; do
    { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q "^containerd-shim-runc-v2 .*-address $sock " &&
      kill -KILL "${p#/proc/}" 2>/dev/null || true
  done
  if [ -n "$cg" ]; then
    for p in $(cat /sys/fs/cgroup/pids/"$cg"/cgroup.procs /sys/fs/cgroup/pids/"$cg"/*/cgroup.procs \
      /sys/fs/cgroup/pids/"$cg"/*/*/cgroup.procs /sys/fs/cgroup/pids/"$cg"/*/*/*/cgroup.procs 2>/dev/null); do
      kill -KILL "$p" 2>/dev/null || true
    done
  fi
  stop_pid kube-scheduler 10
  stop_pid kube-controller-manager 10
  stop_pid kube-apiserver 20
  stop_pid etcd 10
  # Mounts under DIR (overlay rootfs, pod volumes, netns), deepest first.
  awk -v d="$D/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  # The node's cgroups in every hierarchy, deepest first.
  if [ -n "$cg" ]; then
    find /sys/fs/cgroup/*/"$cg" -depth -type d 2>/dev/null | while read -r c; do rmdir "$c" 2>/dev/null || true; done
  fi
  # What the kubelet changed in the machine's sysctls.
  if [ -f "$D/sysctls" ]; then
    while read -r s v; do echo "$v" >"$(sysctl_path "$s")" 2>/dev/null || log "could not restore $s=$v"; done <"$D/sysctls"
  fi
  rm -f "$D/pids/order"
  log "down ($D)"
}

cmd=${1:-}
D=${2:-}
case "$cmd" in
up | down)
  [ -n "$D" ] || die "usage: $0 $cmd DIR"
  mkdir -p "$D"
  D=$(cd "$D" && pwd)
  "$cmd"
  ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
