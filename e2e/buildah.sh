#!/bin/bash
# Build the container image from the unchanged Dockerfile with Debian's
# buildah (no Docker engine, no registry), for CI's image test
# (e2e/image-build-test.sh).
#
#   e2e/buildah.sh build TAG [VERSION]   seed the base images if missing, then
#                                        buildah bud --isolation chroot -t TAG
#   e2e/buildah.sh seed                  only seed the two base images
#
# No registry is reachable, so the Dockerfile's two FROM images are made here
# under its exact names (from its ARGs GO_VERSION and DEBIAN):
# - debian:<DEBIAN>-slim (forky): a debootstrap minbase of that suite, cached
#   as $RSM_IMAGE_CACHE/debian-<DEBIAN>-minbase.tar.zst (3.4 min at load 20,
#   once per machine; then seconds). Debian
#   12's debootstrap has no forky script: sid's is used, as e2e/rootfs.sh does
#   for the tentacle rootfs. apt there ignores Valid-Until, which a mirror
#   snapshot of testing serves expired (the real image fetches a fresh Release
#   from deb.debian.org; signatures are still checked);
# - golang:<GO_VERSION>-trixie: the host's Go toolchain at /usr/local/go (it
#   must be GO_VERSION) with the golang image's GOPATH, PATH and
#   GOTOOLCHAIN=local, and nothing else: the Dockerfile takes only
#   /usr/local/go from it (COPY --from), so no trixie minbase is made.
# The build's RUN steps reach Debian's packages and the Go module proxy, as
# a docker build does; the host's local CAs (/usr/local/share/ca-certificates,
# a build machine behind a TLS proxy) are bound there read-only for RUN steps
# only, so that installing ca-certificates in the build stage trusts them and
# neither base image nor the result holds them (only the empty mount point
# /usr/local/share/ca-certificates stays in the image). buildah keeps its images and
# cache mounts in /var/lib/containers (a warm rebuild reuses the layers and
# the Go module cache mount).
#
# Environment: RSM_IMAGE_BUILT (an image of this tree that build tags
# instead of building, when its tag is build's VERSION), RSM_IMAGE_CACHE
# (default /var/cache/rbd-snapshot-metadata/image),
# RSM_MIRROR (default: the host's apt sources, as rootfs.sh). Needs root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
CACHE=${RSM_IMAGE_CACHE:-/var/cache/rbd-snapshot-metadata/image}
# How long to wait for a build that another run holds the lock of: a cold
# build on a loaded 2-core machine takes over an hour (k8s.io/kubernetes's
# binaries: 66 min at load 20), and a waiter that gave up first failed the
# run. CI's own limit bounds a hung one.
LOCK_WAIT=${RSM_LOCK_WAIT:-7200}
SEED_REV=3 # bump when the seeding below changes

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "buildah: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

arg() { sed -n "s/^ARG $1=//p" "$TOP/Dockerfile" | head -n1; }
GO_VERSION=$(arg GO_VERSION)
DEBIAN=$(arg DEBIAN)
[ -n "$GO_VERSION" ] && [ -n "$DEBIAN" ] || die "no ARG GO_VERSION / DEBIAN in the Dockerfile"
# The golang image's suite, from its FROM line (golang:${GO_VERSION}-trixie).
GO_SUITE=$(sed -n 's/^FROM golang:${GO_VERSION}-\([a-z]*\) AS go$/\1/p' "$TOP/Dockerfile" | head -n1)
[ -n "$GO_SUITE" ] || die "no 'FROM golang:\${GO_VERSION}-<suite> AS go' in the Dockerfile"
DEBIAN_IMAGE=docker.io/library/debian:$DEBIAN-slim
GOLANG_IMAGE=docker.io/library/golang:$GO_VERSION-$GO_SUITE

install_buildah() {
	command -v buildah >/dev/null && command -v debootstrap >/dev/null && command -v zstd >/dev/null && return
	log "installing buildah, debootstrap and zstd"
	local a="apt-get -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends"
	DEBIAN_FRONTEND=noninteractive $a install buildah debootstrap zstd >/dev/null 2>&1 ||
		{ apt-get -q update >/dev/null && DEBIAN_FRONTEND=noninteractive $a install buildah debootstrap zstd >/dev/null; }
}

mirror() {
	local m=${RSM_MIRROR:-}
	[ -n "$m" ] || [ ! -f /etc/apt/sources.list.d/debian.sources ] ||
		m=$(awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
	[ -n "$m" ] || [ ! -f /etc/apt/sources.list ] ||
		m=$(sed -e 's/\[[^]]*\]//' /etc/apt/sources.list | awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }')
	[ -n "$m" ] || die "no Debian mirror in the host's apt sources; set RSM_MIRROR"
	echo "$m"
}

has_image() { buildah inspect --type image "$1" >/dev/null 2>&1 && [ "$(buildah inspect --type image --format '{{index .ImageAnnotations "rsm.seed"}}' "$1" 2>/dev/null)" = "$SEED_REV" ]; }

# debian:<suite>-slim from a debootstrap minbase (cached tarball).
seed_debian() {
	has_image "$DEBIAN_IMAGE" && return
	local t tar=$CACHE/debian-$DEBIAN-minbase.tar.zst tmp ctr mnt m script=
	mkdir -p "$CACHE"
	if [ ! -s "$tar" ]; then
		t=$(now)
		tmp=$(mktemp -d "$CACHE/.debootstrap.XXXXXX")
		m=$(mirror)
		# A suite newer than the host's debootstrap (forky on Debian 12) is
		# made with sid's script.
		[ -f "/usr/share/debootstrap/scripts/$DEBIAN" ] || script=/usr/share/debootstrap/scripts/sid
		debootstrap --variant=minbase "$DEBIAN" "$tmp" "$m" ${script:+"$script"} >"$CACHE/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$CACHE/debootstrap.log" >&2; rm -rf --one-file-system "$tmp"; die "debootstrap $DEBIAN"; }
		# As the real image: its own sources, no apt caches.
		echo "deb $m $DEBIAN main" >"$tmp/etc/apt/sources.list"
		# testing's and unstable's Release files expire within a week, and a
		# mirror snapshot serves them expired.
		case "$DEBIAN" in forky | sid | testing | unstable)
			echo 'Acquire::Check-Valid-Until "false";' >"$tmp/etc/apt/apt.conf.d/90rsm-mirror-snapshot" ;;
		esac
		rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
		tar -C "$tmp" -I 'zstd -T0 -3' -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
		rm -rf --one-file-system "$tmp"
		log "debootstrap --variant=minbase $DEBIAN: $(since "$t"), $(du -h "$tar" | cut -f1)"
	fi
	t=$(now)
	ctr=$(buildah from --pull=never scratch)
	mnt=$(buildah mount "$ctr")
	tar -C "$mnt" --zstd -xf "$tar"
	buildah umount "$ctr" >/dev/null
	buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--cmd bash --annotation rsm.seed=$SEED_REV "$ctr"
	buildah commit --rm -q "$ctr" "$DEBIAN_IMAGE" >/dev/null
	log "seeded $DEBIAN_IMAGE in $(since "$t")"
}

# golang:<version>-<suite>: the host's Go, which is all the Dockerfile takes.
seed_golang() {
	has_image "$GOLANG_IMAGE" && return
	local t ctr mnt goroot hostgo
	goroot=$(go env GOROOT)
	hostgo=$(go env GOVERSION)
	[ "$hostgo" = "go$GO_VERSION" ] || die "the host's Go is $hostgo, the Dockerfile's GO_VERSION $GO_VERSION: seed needs the same"
	t=$(now)
	ctr=$(buildah from --pull=never scratch)
	mnt=$(buildah mount "$ctr")
	mkdir -p "$mnt/usr/local/go" "$mnt/go/bin"
	cp -a "$goroot/." "$mnt/usr/local/go/"
	buildah umount "$ctr" >/dev/null
	buildah config --env GOLANG_VERSION="$GO_VERSION" --env GOTOOLCHAIN=local --env GOPATH=/go \
		--env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--workingdir /go --annotation rsm.seed=$SEED_REV "$ctr"
	buildah commit --rm -q "$ctr" "$GOLANG_IMAGE" >/dev/null
	log "seeded $GOLANG_IMAGE ($hostgo from $goroot, only /usr/local/go) in $(since "$t")"
}

seed() {
	[ "$(id -u)" = 0 ] || die "must run as root"
	install_buildah
	mkdir -p "$CACHE"
	exec 9>"$CACHE/.lock"
	flock -w "$LOCK_WAIT" 9 || die "timed out waiting for $CACHE/.lock"
	seed_debian
	seed_golang
}

build() {
	local tag=${1:?usage: buildah.sh build TAG [VERSION]} version=${2:-dev} t
	# ./dev.sh test builds this tree's image once, beside its unit tests, as
	# localhost/rbd-snapshot-metadata:VERSION, and hands it to the pods and
	# the image's test: a build of the same version is that image.
	if [ -n "${RSM_IMAGE_BUILT:-}" ] && [ "${RSM_IMAGE_BUILT##*:}" = "$version" ]; then
		buildah tag "$RSM_IMAGE_BUILT" "$tag"
		log "$tag: the image ./dev.sh test built from this tree, $RSM_IMAGE_BUILT"
		return
	fi
	seed
	t=$(now)
	# --pull=never: the base images are the seeded ones, never a registry's.
	# --layers: a warm rebuild reuses each step whose inputs are unchanged.
	local cas=()
	! compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null ||
		cas=(-v /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)
	# buildah 1.28's bud leaves the working container of a stage that only
	# COPY --from reads (the Dockerfile's go stage) behind, mounted: one
	# more overlay mount per build. Those this build left (the lock keeps
	# our other builds out) are removed, also when it failed.
	local before rc=0
	before=$(buildah containers --quiet --notruncate | sort)
	buildah bud --isolation chroot --pull=never --layers --build-arg VERSION="$version" "${cas[@]}" \
		-t "$tag" -f "$TOP/Dockerfile" "$TOP" >"$CACHE/bud.log" 2>&1 || rc=$?
	comm -13 <(echo "$before") <(buildah containers --quiet --notruncate | sort) | xargs -r buildah rm >/dev/null
	[ "$rc" = 0 ] || { tail -n 40 "$CACHE/bud.log" >&2; die "buildah bud (log: $CACHE/bud.log)"; }
	log "buildah bud of the Dockerfile as $tag: $(since "$t"), $(grep -c '^--> Using cache' "$CACHE/bud.log" || true) of $(grep -c '^\[[0-9]*/[0-9]*\] STEP' "$CACHE/bud.log" || true) steps from buildah's layer cache"
}

case "${1:-}" in
seed) seed ;;
build) shift; build "$@" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
