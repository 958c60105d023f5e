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
# under its exact names (the Dockerfile's ARGs GO_VERSION and DEBIAN):
# - debian:trixie-slim: a debootstrap minbase of trixie, cached as
#   $RSM_IMAGE_CACHE/debian-trixie-minbase.tar.zst;
# - golang:<GO_VERSION>-trixie: that, plus the host's Go toolchain at
#   /usr/local/go (it must be GO_VERSION), gcc and libc6-dev, with the golang
#   image's GOPATH, PATH and GOTOOLCHAIN=local, and the host's local CAs
#   (/usr/local/share/ca-certificates), as a build machine behind a TLS proxy
#   needs for `go mod download`.
# The build's RUN steps reach Debian's packages and the Go module proxy, as
# a docker build does. buildah keeps its images and cache mounts in
# /var/lib/containers (a warm rebuild reuses the Go module cache mount).
#
# Environment: RSM_IMAGE_CACHE (default /var/cache/rbd-snapshot-metadata/image),
# RSM_MIRROR (default: the host's apt sources, as rootfs.sh). Needs root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
CACHE=${RSM_IMAGE_CACHE:-/var/cache/rbd-snapshot-metadata/image}
SEED_REV=2 # bump when the seeding below changes

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "buildah: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

arg() { sed -n "s/^ARG $1=//p" "$TOP/Dockerfile" | head -n1; }
GO_VERSION=$(arg GO_VERSION)
DEBIAN=$(arg DEBIAN)
[ -n "$GO_VERSION" ] && [ -n "$DEBIAN" ] || die "no ARG GO_VERSION / DEBIAN in the Dockerfile"
DEBIAN_IMAGE=docker.io/library/debian:$DEBIAN-slim
GOLANG_IMAGE=docker.io/library/golang:$GO_VERSION-$DEBIAN

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
	local t tar=$CACHE/debian-$DEBIAN-minbase.tar.zst tmp ctr mnt m
	mkdir -p "$CACHE"
	if [ ! -s "$tar" ]; then
		t=$(now)
		tmp=$(mktemp -d "$CACHE/.debootstrap.XXXXXX")
		m=$(mirror)
		debootstrap --variant=minbase "$DEBIAN" "$tmp" "$m" >"$CACHE/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$CACHE/debootstrap.log" >&2; rm -rf --one-file-system "$tmp"; die "debootstrap $DEBIAN"; }
		# As the real image: its own sources, no apt caches.
		echo "deb $m $DEBIAN main" >"$tmp/etc/apt/sources.list"
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

# golang:<version>-<suite>: the Debian image, gcc and the host's Go.
seed_golang() {
	has_image "$GOLANG_IMAGE" && return
	local t ctr mnt goroot hostgo
	goroot=$(go env GOROOT)
	hostgo=$(go env GOVERSION)
	[ "$hostgo" = "go$GO_VERSION" ] || die "the host's Go is $hostgo, the Dockerfile's GO_VERSION $GO_VERSION: seed needs the same"
	t=$(now)
	ctr=$(buildah from --pull=never "$DEBIAN_IMAGE")
	buildah run --isolation chroot "$ctr" -- sh -ec 'apt-get update -q >/dev/null
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gcc libc6-dev ca-certificates >/dev/null
		rm -rf /var/lib/apt/lists/*'
	mnt=$(buildah mount "$ctr")
	mkdir -p "$mnt/usr/local/go" "$mnt/go/bin"
	cp -a "$goroot/." "$mnt/usr/local/go/"
	! compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null ||
		cp /usr/local/share/ca-certificates/*.crt "$mnt/usr/local/share/ca-certificates/"
	buildah umount "$ctr" >/dev/null
	buildah run --isolation chroot "$ctr" -- update-ca-certificates >/dev/null
	buildah config --env GOLANG_VERSION="$GO_VERSION" --env GOTOOLCHAIN=local --env GOPATH=/go \
		--env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--workingdir /go --annotation rsm.seed=$SEED_REV "$ctr"
	buildah commit --rm -q "$ctr" "$GOLANG_IMAGE" >/dev/null
	log "seeded $GOLANG_IMAGE ($hostgo from $goroot) in $(since "$t")"
}

seed() {
	[ "$(id -u)" = 0 ] || die "must run as root"
	install_buildah
	mkdir -p "$CACHE"
	exec 9>"$CACHE/.lock"
	flock -w 1800 9 || die "timed out waiting for $CACHE/.lock"
	seed_debian
	seed_golang
}

build() {
	local tag=${1:?usage: buildah.sh build TAG [VERSION]} version=${2:-dev} t
	seed
	t=$(now)
	# --pull=never: the base images are the seeded ones, never a registry's.
	# --layers: a warm rebuild reuses each step whose inputs are unchanged.
	buildah bud --isolation chroot --pull=never --layers --build-arg VERSION="$version" \
		-t "$tag" -f "$TOP/Dockerfile" "$TOP" >"$CACHE/bud.log" 2>&1 ||
		{ tail -n 40 "$CACHE/bud.log" >&2; die "buildah bud (log: $CACHE/bud.log)"; }
	log "buildah bud of the Dockerfile as $tag: $(since "$t")"
}

case "${1:-}" in
seed) seed ;;
build) shift; build "$@" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
