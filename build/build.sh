#!/bin/bash
# Build the release binaries as the container image does: the Dockerfile's
# build stage runs this script (CI builds that Dockerfile with buildah,
# e2e/image-build-test.sh).
#
#   build/build.sh OUTDIR
#   build/build.sh --install-deps    apt-get install the Debian build packages
#                                    (the Dockerfile's first step)
#
# OUTDIR/rbd-snapshot-metadata  cgo, against the system's librbd/librados
#                               headers (reef or later), no build tags (not
#                               -tags pacific)
# OUTDIR/snapmeta               pure Go (CGO_ENABLED=0)
#
# First it checks the Ceph it builds against: the headers declare
# rbd_diff_iterate3 (reef and later), and librados reads aes256k cephx keys
# (the default of clusters made by squid 19.2.6+ and tentacle 20.2.4+; reef's
# and older librados cannot decode them, and fail every request). Then what
# the image's runtime stage relies on: the server binary needs no shared
# library outside libc6, librbd1, librados2 and the packages these depend on
# (the runtime stage installs exactly librbd1 and librados2, from the same
# suite).
#
# Environment: VERSION (default "dev"), stamped with -X main.version.
# Needs: Go (go.mod's version), gcc, g++, librbd-dev, librados-dev, libradospp-dev, dpkg, ldd.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Debian packages the build needs besides Go (the Dockerfile copies the
# golang image's): the build below refuses to start when one is missing.
# ca-certificates: go mod download fetches over TLS.
BUILD_DEPS="librbd-dev librados-dev libradospp-dev gcc g++ libc6-dev ca-certificates"
if [ "${1:-}" = --install-deps ]; then
	apt-get update
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $BUILD_DEPS
	rm -rf /var/lib/apt/lists/*
	exit 0
fi
OUT=${1:?usage: build/build.sh OUTDIR | --install-deps}
VERSION=${VERSION:-dev}
log() { echo "build: $*" >&2; }
die() { log "$*"; exit 1; }

for p in $BUILD_DEPS; do
	dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
		die "package $p is not installed (build/build.sh --install-deps)"
done
grep -q 'rbd_diff_iterate3' /usr/include/rbd/librbd.h ||
	die "/usr/include/rbd/librbd.h lacks rbd_diff_iterate3: need Ceph reef (18.2) or later headers (librbd-dev)"
# aes256k keys (type 2) are read from tentacle 20.2.4 and squid 19.2.6 on.
# (The upstream version, without a Debian epoch.)
rados=$(dpkg-query -W -f '${Version}' librados2)
upstream=${rados#*:}
if ! dpkg --compare-versions "$upstream" ge 20.2.4 &&
	! { dpkg --compare-versions "$upstream" ge 19.2.6 && dpkg --compare-versions "$upstream" lt 20; }; then
	die "librados2 $rados cannot read aes256k cephx keys, the default of new clusters: build on a suite with Ceph tentacle 20.2.4+ (or squid 19.2.6+), e.g. the Dockerfile's DEBIAN=forky"
fi

mkdir -p "$OUT"
export CGO_ENABLED=1 GOFLAGS="${GOFLAGS:-} -trimpath -buildvcs=false"
log "$(go version); librbd-dev $(dpkg-query -W -f '${Version}' librbd-dev), librados2 $rados"
go build -ldflags "-s -w -X main.version=$VERSION" -o "$OUT/rbd-snapshot-metadata" ./cmd/rbd-snapshot-metadata
CGO_ENABLED=0 go build -ldflags "-s -w" -o "$OUT/snapmeta" ./cmd/snapmeta

# The packages the runtime stage gets: librbd1, librados2, libc6 and,
# recursively, what they Depend or Pre-Depend on (every installed alternative).
closure() {
	local -A seen=()
	local queue=("$@") p deps d
	while [ ${#queue[@]} -gt 0 ]; do
		p=${queue[0]} queue=("${queue[@]:1}")
		[ -z "${seen[$p]:-}" ] || continue
		deps=$(dpkg-query -W -f '${Depends}, ${Pre-Depends}' "$p" 2>/dev/null) || continue
		seen[$p]=1
		for d in $(sed -e 's/([^)]*)//g' -e 's/[,|]/ /g' <<<"$deps"); do
			queue+=("${d%%:*}")
		done
	done
	printf '%s\n' "${!seen[@]}"
}
allowed=" $(closure librbd1 librados2 libc6 | tr '\n' ' ') "

bad=()
while read -r lib path; do
	[ -n "$path" ] || continue
	[ "$path" != "not" ] || die "$lib not found (ldd)"
	real=$(readlink -f "$path")
	# dpkg knows the path under /usr or /lib (merged /usr), under the name
	# ldd prints or the symlink's target.
	pkg=
	for f in "$path" "$real" "${path#/usr}" "/usr$path" "${real#/usr}" "/usr$real"; do
		pkg=$(dpkg-query -S "$f" 2>/dev/null | grep -v '^diversion ' | head -n1 | cut -d: -f1) || true
		[ -z "$pkg" ] || break
	done
	case "$allowed" in
	*" ${pkg:-?} "*) ;;
	*) bad+=("$lib ($path, package ${pkg:-unknown})") ;;
	esac
done < <(ldd "$OUT/rbd-snapshot-metadata" | awk '$2 == "=>" { print $1, $3 } $1 ~ /^\// { print $1, $1 }')
[ ${#bad[@]} -eq 0 ] || die "$OUT/rbd-snapshot-metadata needs libraries the runtime image lacks: ${bad[*]}"
needed=$(ldd "$OUT/rbd-snapshot-metadata" | awk '$2 == "=>" { print $1 }' | grep -E '^lib(rbd|rados)\.so' | sort | tr '\n' ' ')
[ "$needed" = "librados.so.2 librbd.so.1 " ] || die "expected librbd.so.1 and librados.so.2 among the libraries, got: $needed"
log "built $OUT/rbd-snapshot-metadata ($VERSION) and $OUT/snapmeta; shared libraries all from: librbd1 librados2 libc6 and their dependencies"
