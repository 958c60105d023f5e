#!/bin/bash
# A throwaway single-node Ceph cluster for tests and demos: 1 mon and 1
# bluestore OSD (on a sparse file), cephx on, 127.0.0.1 only, pool "rbd"
# (initialized, with RBD namespace "ns1"), clone format 2. The daemons run in
# the rootfs of rootfs.sh (RSM_CEPH=reef, the default, or tentacle); all
# state lives in DIR, which `start` wipes.
#
#   e2e/cluster.sh start|stop|kill|status DIR
#
# start   wipes DIR, starts the cluster (~4 s) and writes
#         DIR/env              shell-sourceable CEPH_MON_HOST, CEPH_MON_V1,
#                              CEPH_USER, CEPH_KEY, CEPH_CSI_USER, CEPH_CSI_KEY,
#                              CEPH_CONF, RSM_CLUSTER_DIR, RSM_CLUSTER_CEPH
#                              (reef or tentacle), RSM_CLUSTER_CEPH_VERSION
#         DIR/csi-config.json  Ceph-CSI cluster config (clusterIDs rsm-e2e and
#                              rsm-e2e-ns1, the latter with radosNamespace ns1)
#         A failed start leaves no daemon behind.
# stop    SIGTERM the OSD, then the mon (SIGKILL after 10 s); kill: SIGKILL both.
#         Only the PIDs in DIR/run/*.pid are signalled.
# status  the daemons, their RSS and `ceph health`; exit 1 unless all is up.
#
# Keys: RSM_CEPH_KEY_TYPE=aes gives client.admin and client.csi keys of the
# old type on tentacle, whose tools make aes256k keys that reef's librados
# cannot read (with-cluster.sh sets it for a reef client on tentacle).
#
# Ports: RSM_CEPH_PORT_BASE=N uses N (mon v2), N+1 (mon v1) and N+10..N+99
# (OSD); start refuses if N or N+1 is taken. Unset, the first free block among
# 16500, 16600, ..., 17400 is used, so several clusters can run side by side.
# DIR is bound at its own path inside the rootfs, so paths in DIR/env are valid
# both on the host and inside. RSM_ROOTFS selects the rootfs. Needs root.
#
# From inside the rootfs (a test that needs a second cluster), the inside part
# runs alone: `cluster.sh __start-inside DIR BASE` with DIR/run and DIR/log
# made, the ports checked by the caller, and these optional settings:
#   RSM_CEPH_ADDR     the address everything binds (default 127.0.0.1; ::1 for
#                     an IPv6 cluster)
#   RSM_CEPH_MON_V2, RSM_CEPH_MON_V1   the monitor's ports (default BASE, BASE+1;
#                     3300 and 6789 are Ceph's defaults)
#   RSM_CEPH_NAMESPACE=none   no RBD namespace ns1
#   RSM_CEPH_MONS=3   three monitors, a, b and c, in one quorum (default 1):
#                     a on the monitor ports, b and c on BASE+2/BASE+3
#                     and BASE+4/BASE+5 (v2/v1); mon_host, CEPH_MON_HOST and
#                     the csi-config list all three.
#   RSM_CEPH_OSDS=N   N OSDs (default 1), each on its own sparse file
#   RSM_CEPH_EC_POOL=NAME   also an erasure-coded pool NAME (profile k=2 m=1
#                     crush-failure-domain=osd, allow_ec_overwrites on,
#                     application rbd): a data pool for images whose header
#                     stays in pool rbd, as Ceph-CSI's dataPool makes them.
#                     Needs RSM_CEPH_OSDS=3 or more.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MARKER=.rsm-ceph-cluster   # marks DIR as ours, so that start may wipe it

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
die() { echo "cluster: $*" >&2; exit 1; }

# ---------------------------------------------------------------- host side --

# alive PID: the process exists and is not a zombie (PID 1 here may be slow to
# reap the daemons, which it inherited when they daemonized).
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "${st:0:1}" != Z ]
}

# signal_wait SIG TIMEOUT PIDFILE...: signal the live daemons named by the pid
# files, wait until they are gone, then SIGKILL what is left after TIMEOUT s.
signal_wait() {
  local sig=$1 timeout=$2 f p pids=() alive i
  shift 2
  for f in "$@"; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null || true)
    # only a live ceph daemon: the pid may have been reused after a crash
    if [[ $p =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$p/comm" 2>/dev/null) == ceph-* ]] && alive "$p"; then
      pids+=("$p"); STOPPED+=("$(basename "$f" .pid)[$p]")
    fi
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -"$sig" "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < timeout * 20; i++)); do
    alive=()
    for p in "${pids[@]}"; do ! alive "$p" || alive+=("$p"); done
    [ ${#alive[@]} -gt 0 ] || return 0
    sleep 0.05
  done
  echo "cluster: SIGKILL ${alive[*]} after ${timeout}s" >&2
  kill -KILL "${alive[@]}" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    alive=()
    for p in "${pids[@]}"; do ! alive "$p" || alive+=("$p"); done
    [ ${#alive[@]} -gt 0 ] || return 0
    sleep 0.05
  done
}

# stop_daemons TERM|KILL: the OSD first (it waits ~5 s for a mon that is
# already gone), then the mon.
stop_daemons() {
  STOPPED=()
  if [ "$1" = KILL ]; then
    signal_wait KILL 5 "$DIR"/run/*.pid
  else
    signal_wait TERM 10 "$DIR"/run/ceph-osd.*.pid
    signal_wait TERM 10 "$DIR"/run/*.pid
  fi
  rm -f "$DIR"/run/*.pid
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local t0 base lockdir rc=0
  t0=$(now)
  "$HERE/rootfs.sh"
  [ -d "$DIR" ] && [ -n "$(ls -A "$DIR")" ] && [ ! -f "$DIR/$MARKER" ] &&
    die "$DIR is not empty and not a cluster folder; refusing to wipe it"
  mkdir -p "$DIR"
  stop_daemons TERM
  find "$DIR" -mindepth 1 -delete
  touch "$DIR/$MARKER"
  mkdir -p "$DIR/run" "$DIR/log"

  # Pick the ports under a lock held until the mon listens, so that two
  # concurrent starts do not take the same block.
  lockdir=/run/lock; [ -d $lockdir ] || lockdir=/tmp
  exec 9>"$lockdir/rsm-ceph-ports.lock"
  flock -w 600 9 || die "timed out waiting for $lockdir/rsm-ceph-ports.lock"
  if [ -n "${RSM_CEPH_PORT_BASE:-}" ]; then
    base=$RSM_CEPH_PORT_BASE
    if ! [[ $base =~ ^[0-9]+$ ]] || ((base < 1024 || base + 99 > 65535)); then
      die "bad RSM_CEPH_PORT_BASE=$base"
    fi
    if ! port_free "$base" || ! port_free $((base + 1)); then
      die "127.0.0.1:$base or :$((base + 1)) is in use (RSM_CEPH_PORT_BASE=$base)"
    fi
  else
    for base in $(seq 16500 100 17400) none; do
      [ "$base" = none ] || { port_free "$base" && port_free $((base + 1)) && break; }
    done
    [ "$base" != none ] || die "no free port block among 16500..17400 (set RSM_CEPH_PORT_BASE)"
  fi

  # The inside part releases fd 9 once the mon is up.
  trap 'stop_daemons KILL; exit 130' INT TERM
  timeout -k 5 120 "$HERE/in-rootfs.sh" -b "$DIR" -b "$HERE" \
    bash "$HERE/cluster.sh" __start-inside "$DIR" "$base" </dev/null || rc=$?
  exec 9>&-
  trap - INT TERM
  if [ $rc != 0 ]; then
    stop_daemons KILL
    rm -f "$DIR/env" "$DIR/csi-config.json"
    tail -n 15 "$DIR/log/start.log" >&2 2>/dev/null || true
    die "start failed (rc $rc); logs in $DIR/log"
  fi
  # shellcheck disable=SC1091
  . "$DIR/log/start.times"
  echo "cluster: started $DIR on ${RSM_CEPH_ADDR:-127.0.0.1}:$base (v2)/$((base + 1)) (v1) in $(secs "$t0" "$(now)")s" \
       "(mon up $(secs "$T0" "$T_MON")s, osd in $(secs "$T0" "$T_OSD")s, pool ready $(secs "$T0" "$T_POOL")s)"
}

stop() {
  local t0 what=$1
  t0=$(now)
  [ -d "$DIR/run" ] || { echo "cluster: nothing running in $DIR"; return 0; }
  stop_daemons "$what"
  if [ ${#STOPPED[@]} -eq 0 ]; then
    echo "cluster: nothing running in $DIR"
  else
    echo "cluster: $([ "$what" = KILL ] && echo killed || echo stopped) ${STOPPED[*]} in $DIR in $(secs "$t0" "$(now)")s"
  fi
}

status() {
  local f p n=0 up=0
  for f in "$DIR"/run/*.pid; do
    [ -f "$f" ] || continue
    n=$((n + 1)); p=$(cat "$f")
    if [[ $(cat "/proc/$p/comm" 2>/dev/null) == ceph-* ]] && alive "$p"; then
      up=$((up + 1))
      echo "$(basename "$f" .pid) pid $p rss $(awk '/^VmRSS/ { print $2 $3 }' "/proc/$p/status")"
    else
      echo "$(basename "$f" .pid) pid $p is gone"
    fi
  done
  if [ $n = 0 ] || [ $up != $n ]; then echo "cluster: not running"; return 1; fi
  "$HERE/in-rootfs.sh" -b "$DIR" env CEPH_CONF="$DIR/ceph.conf" \
    ceph --connect-timeout 5 health detail
}

# -------------------------------------------------------------- inside part --

start_inside() {
  local base=$1 v2=${RSM_CEPH_MON_V2:-$1} v1=${RSM_CEPH_MON_V1:-$(($1 + 1))} fsid mon_addr C=$DIR
  local ip=${RSM_CEPH_ADDR:-127.0.0.1} host ipv4=true ipv6=false
  local osds=${RSM_CEPH_OSDS:-1} ec=${RSM_CEPH_EC_POOL:-} i osd_id pool_pid conf=(--conf "$DIR/ceph.conf")
  local osd_uuid=() osd_key=() mkfs_pid=()
  exec >>"$C/log/start.log" 2>&1
  PS4='+ ${EPOCHREALTIME} '; set -x
  T0=$(now)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  host=$ip
  case "$ip" in *:*) host="[$ip]" ipv4=false ipv6=true ;; esac
  mon_addr="[v2:$host:$v2,v1:$host:$v1]"
  local mons=${RSM_CEPH_MONS:-1} mon_ids=(a) mon_addrs=("$mon_addr") mon_v1s=("\"$host:$v1\"") m
  [[ $mons =~ ^[13]$ ]] || { echo "bad RSM_CEPH_MONS=$mons (1 or 3)"; return 1; }
  if ((mons == 3)); then
    mon_ids=(a b c)
    mon_addrs+=("[v2:$host:$((base + 2)),v1:$host:$((base + 3))]" "[v2:$host:$((base + 4)),v1:$host:$((base + 5))]")
    mon_v1s+=("\"$host:$((base + 3))\"" "\"$host:$((base + 5))\"")
    mon_addr=$(IFS=,; echo "${mon_addrs[*]}")
  fi
  cat >"$C/ceph.conf" <<EOF
[global]
fsid = $fsid
mon_host = $mon_addr
public_addr = $ip
cluster_addr = $ip
ms_bind_ipv4 = $ipv4
ms_bind_ipv6 = $ipv6
ms_bind_port_min = $((base + 10))
ms_bind_port_max = $((base + 99))
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
run_dir = $C/run
crash_dir = $C/crash
exporter_sock_dir = $C/run
mon_cluster_log_file = $C/log/ceph.log
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_allow_pool_delete = true
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_osd_initial_require_min_compat_client = mimic
rbd_default_clone_format = 2
# the host disk may be quite full; at the default levels the mon shuts down
mon_data_avail_warn = 2
mon_data_avail_crit = 1
# pool create plus rbd pool init: ~4 s at the default 1 s
paxos_propose_interval = 0.1
$([ "${RSM_CEPH_KEY_TYPE:-}" != aes ] || echo "# tentacle's mon allows only aes256k (CVE-2025-30156); the mon map's
# auth_allowed_ciphers can be changed only once authenticated
mon_auth_emergency_allowed_ciphers = aes, aes256k")

[client]
keyring = $C/keyring

[mon]
mon_data = $C/mon/\$cluster-\$id
keyring = $C/mon/\$cluster-\$id/keyring
pid_file = $C/run/\$cluster-\$name.pid
admin_socket = $C/run/\$cluster-\$name.asok
log_file = $C/log/\$cluster-\$name.log

[osd]
osd_data = $C/osd/\$cluster-\$id
keyring = $C/osd/\$cluster-\$id/keyring
pid_file = $C/run/\$cluster-\$name.pid
admin_socket = $C/run/\$cluster-\$name.asok
log_file = $C/log/\$cluster-\$name.log
osd_objectstore = bluestore
# a sparse file outside the OSD folder (inside it, bluestore hits ELOOP)
bluestore_block_path = $C/osd/\$cluster-\$id.block
bluestore_block_size = 8589934592
bluestore_block_create = true
bluestore_block_db_create = false
bluestore_block_wal_create = false
bluestore_fsck_on_mkfs = false
bluestore_fsck_on_mount = false
# cap memory: the OSD otherwise grows to several GiB under heavy writes
osd_memory_target = 939524096
bluestore_cache_autotune = false
bluestore_cache_size = 134217728
osd_crush_update_on_start = true
# the tests mark the single OSD down after long stops (harness.PauseOSD);
# past osd_max_markdown_count (5) in 10 minutes an OSD shuts itself down
osd_max_markdown_count = 1000
EOF
  mkdir -p "$C/mon/ceph-a" "$C/crash"
  [[ $osds =~ ^[1-9]$ ]] || { echo "bad RSM_CEPH_OSDS=$osds (1 to 9)"; return 1; }
  [ -z "$ec" ] || ((osds >= 3)) || { echo "RSM_CEPH_EC_POOL needs RSM_CEPH_OSDS=3 or more"; return 1; }

  # The OSDs' mkfs (~2 s) needs no mon: run it while the mon comes up.
  for ((i = 0; i < osds; i++)); do
    mkdir -p "$C/osd/ceph-$i"
    osd_uuid[i]=$(cat /proc/sys/kernel/random/uuid)
    osd_key[i]=$(ceph-authtool --gen-print-key)
    ceph-authtool --create-keyring "$C/osd/ceph-$i/keyring" -n "osd.$i" --add-key "${osd_key[i]}"
    ceph-osd "${conf[@]}" -i "$i" --mkfs --osd-uuid "${osd_uuid[i]}" --no-mon-config \
      </dev/null >>"$C/log/osd-mkfs.out" 2>&1 9>&- &
    mkfs_pid[i]=$!
  done

  # Every key in the mon's mkfs keyring is imported: client.admin and the
  # Ceph-CSI style client.csi.
  # tentacle's tools make aes256k keys, which reef's librados cannot use;
  # RSM_CEPH_KEY_TYPE=aes makes the two clients' keys as reef does.
  local keytype=()
  [ -z "${RSM_CEPH_KEY_TYPE:-}" ] || keytype=("--key-type=$RSM_CEPH_KEY_TYPE")
  ceph-authtool --create-keyring "$C/keyring" --gen-key "${keytype[@]}" -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *'
  ceph-authtool --create-keyring "$C/mon.keyring" --gen-key -n mon. --cap mon 'allow *'
  ceph-authtool "$C/mon.keyring" --import-keyring "$C/keyring"
  ceph-authtool "$C/mon.keyring" --gen-key "${keytype[@]}" -n client.csi \
    --cap mon 'profile rbd' --cap osd 'profile rbd' --cap mgr 'profile rbd'
  local addv=()
  for m in "${!mon_ids[@]}"; do addv+=(--addv "${mon_ids[m]}" "${mon_addrs[m]}"); done
  monmaptool --create "${addv[@]}" --fsid "$fsid" "$C/monmap"
  for m in "${mon_ids[@]}"; do
    mkdir -p "$C/mon/ceph-$m"
    ceph-mon "${conf[@]}" --mkfs -i "$m" --monmap "$C/monmap" --keyring "$C/mon.keyring"
    ceph-mon "${conf[@]}" -i "$m" </dev/null >>"$C/log/mon.out" 2>&1 9>&-
  done

  for ((i = 0; i < osds; i++)); do
    osd_id=$(printf '{"cephx_secret": "%s"}' "${osd_key[i]}" |
      ceph "${conf[@]}" --connect-timeout 30 osd new "${osd_uuid[i]}" -i -)
    [ "$osd_id" = "$i" ]
  done
  T_MON=$(now)
  # The mon holds its ports: let other starts pick theirs.
  if { true >&9; } 2>/dev/null; then flock -u 9; exec 9>&-; fi
  {
    ceph "${conf[@]}" osd pool create rbd 8 8
    if [ -n "$ec" ]; then
      ceph "${conf[@]}" osd erasure-code-profile set rsm-k2m1 k=2 m=1 crush-failure-domain=osd
      ceph "${conf[@]}" osd pool create "$ec" 8 8 erasure rsm-k2m1
      ceph "${conf[@]}" osd pool set "$ec" allow_ec_overwrites true
      ceph "${conf[@]}" osd pool application enable "$ec" rbd
    fi
  } &
  pool_pid=$!
  # Each OSD takes seconds to boot before it daemonizes: boot them at once.
  local boot_pid=()
  for ((i = 0; i < osds; i++)); do wait "${mkfs_pid[i]}"; done
  for ((i = 0; i < osds; i++)); do
    ceph-osd "${conf[@]}" -i "$i" </dev/null >>"$C/log/osd.out" 2>&1 9>&- &
    boot_pid[i]=$!
  done
  for ((i = 0; i < osds; i++)); do wait "${boot_pid[i]}"; done
  wait $pool_pid
  T_OSD=$(now)
  # rbd pool init writes to the pool, so it also waits for the OSD to be up.
  rbd "${conf[@]}" --rados-osd-op-timeout 60 pool init rbd
  # (An IPv6-only cluster refuses namespaces with EOPNOTSUPP; the tests that
  # start one need none.)
  [ "${RSM_CEPH_NAMESPACE:-ns1}" = none ] || rbd "${conf[@]}" namespace create rbd/ns1
  T_POOL=$(now)

  cat >"$C/env" <<EOF
CEPH_MON_HOST=$mon_addr
CEPH_MON_V1=$host:$v1
CEPH_USER=admin
CEPH_KEY=$(ceph-authtool -p -n client.admin "$C/keyring")
CEPH_CSI_USER=csi
CEPH_CSI_KEY=$(ceph-authtool -p -n client.csi "$C/mon.keyring")
CEPH_CONF=$C/ceph.conf
RSM_CLUSTER_DIR=$C
RSM_CLUSTER_CEPH=${RSM_CEPH:-reef}
RSM_CLUSTER_CEPH_VERSION=$(ceph-mon --version | awk '{ print $3 }')
EOF
  cat >"$C/csi-config.json" <<EOF
[{"clusterID":"rsm-e2e","monitors":[$(IFS=,; echo "${mon_v1s[*]}")]},{"clusterID":"rsm-e2e-ns1","monitors":[$(IFS=,; echo "${mon_v1s[*]}")],"rbd":{"radosNamespace":"ns1"}}]
EOF
  printf 'T0=%s T_MON=%s T_OSD=%s T_POOL=%s\n' "$T0" "$T_MON" "$T_OSD" "$T_POOL" >"$C/log/start.times"
}

# ------------------------------------------------------------------- main --

[ $# = 2 ] || [ "${1:-}" = __start-inside ] || { echo "usage: $0 start|stop|kill|status DIR" >&2; exit 2; }
DIR=$2
[[ $DIR =~ ^[A-Za-z0-9_./+-]+$ ]] || die "DIR may contain only letters, digits and _ . / + -"
case "$1" in
  __start-inside) start_inside "$3" ;;
  *) [ "$(id -u)" = 0 ] || die "must run as root"
     mkdir -p "$(dirname "$DIR")"; DIR=$(readlink -f "$DIR")
     [ "$DIR" != / ] || die "DIR must not be /"
     case "$1" in
       start) start ;;
       stop) stop TERM ;;
       kill) stop KILL ;;
       status) status ;;
       *) echo "usage: $0 start|stop|kill|status DIR" >&2; exit 2 ;;
     esac ;;
esac
