#!/bin/bash
# Run a command of the container image in its own root filesystem (a
# `buildah mount` of the image built from the Dockerfile), as a container
# runtime would: chrooted, with /proc, /dev and the given folders, as the
# given user. No container runtime needed; works on the host and inside the
# e2e rootfs (e2e/image-build-test.sh runs the e2e tests' server this way).
#
#   e2e/in-image.sh IMAGE_ROOT [-u UID:GID] [-b DIR]... [--] CMD [ARG...]
#
#   -u UID:GID  run as this user and group (default: root, 0:0)
#   -b DIR      bind DIR at the same path inside (e.g. the socket's folder)
#
# It ends in an exec of CMD, in a new mount namespace (nothing reaches the
# caller's): the PID the caller started is the command's, so that signals
# reach it. Needs root.
set -euo pipefail
if [ "${1:-}" != --in-namespace ]; then
	[ "$(id -u)" = 0 ] || { echo "in-image: must run as root" >&2; exit 2; }
	# "unchanged": inside the e2e rootfs (a chroot) / is no mount point and
	# its propagation cannot be set; the image root is made private below.
	exec unshare --mount --propagation unchanged -- "$0" --in-namespace "$@"
fi
shift
ROOT=$(readlink -f "${1:?usage: in-image.sh IMAGE_ROOT [-u UID:GID] [-b DIR]... [--] CMD [ARG...]}")
shift
user=0:0 binds=()
while [ $# -gt 0 ]; do
	case "$1" in
	-u) user=$2; shift 2 ;;
	-b) binds+=("$2"); shift 2 ;;
	--) shift; break ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "in-image: no command" >&2; exit 2; }
case "$1" in /*) [ -x "$ROOT$1" ] || { echo "in-image: $1 is not in the image ($ROOT)" >&2; exit 2; } ;; esac

# The image root is a mount point (buildah's overlay, or a bind of it): make
# it and all below private, so that nothing mounted here reaches the caller.
mount --make-rprivate "$ROOT"
mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev"
# The image's /tmp is a folder of the image; a fresh one per run.
mount -t tmpfs -o mode=1777 tmpfs "$ROOT/tmp"
for d in "${binds[@]}"; do
	d=$(readlink -f "$d")
	mkdir -p "$ROOT$d"
	mount --rbind "$d" "$ROOT$d"
done
# resolv.conf and hosts, as a runtime gives them (the monitors may be names).
for f in /etc/resolv.conf /etc/hosts; do
	[ ! -e "$f" ] || { [ -e "$ROOT$f" ] || touch "$ROOT$f"; mount --bind "$f" "$ROOT$f"; }
done
exec chroot --userspec="$user" "$ROOT" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ "$@"
