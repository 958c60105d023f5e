#!/bin/bash
# e2e/netns.sh CMD [ARGS...]: CMD in a network namespace of its own, with
# only its loopback, up. ./dev.sh test runs the matrix's legs this way
# beside the reef suite: each leg's cluster, servers and tests bind
# 127.0.0.1 ports that nothing outside sees, and a leg's faults (an OSD
# stopped, a connection cut) touch only its own cluster.
#
# The namespace has no way out: what CMD needs from the network (Go
# modules, the Kubernetes tools, the root filesystems) must be there
# before. The mount namespace, /var/tmp and the ports' lock are shared.
# Needs root (unshare --net).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: e2e/netns.sh CMD [ARGS...]" >&2; exit 2; }
# shellcheck disable=SC2016 # $@ is the inner shell's
exec unshare --net -- bash -c 'ip link set lo up && exec "$@"' netns "$@"
