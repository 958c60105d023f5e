#!/bin/bash
# The project's one entry point: it installs what is missing, builds, tests
# and runs the demo, on Debian 12 as root with only Go and gcc to start with.
#
#   ./dev.sh demo     a throwaway Ceph cluster, the server, and real changed blocks
#   ./dev.sh test     unit tests, then e2e tests against a fresh real cluster
#                     (reef), then the matrix (tentacle and cross-version)
#   ./dev.sh unit     gofmt, go vet, unit tests (the driver also without cgo), -race
#   ./dev.sh e2e [go test args]   e2e tests only (RSM_CEPH=tentacle: on Ceph tentacle)
#   ./dev.sh matrix   the tests of e2e/matrix.txt's matrix list on tentacle, and
#                     of its cross list across versions (reef's librbd on a
#                     tentacle cluster, tentacle's on reef)
#   ./dev.sh bench [go test args]   the benchmark; RSM_BENCH_SCALE=full for 2^20 extents, 1 TiB and 10 TiB
#   ./dev.sh image [go test args]   build the Dockerfile with buildah, run its server
#                     against tentacle (aes256k key) and reef (aes key), then
#                     e2e tests on tentacle with the image's entrypoint
#   ./dev.sh build    bin/rbd-snapshot-metadata (cgo, librbd) and bin/snapmeta (pure Go)
#   ./dev.sh deps     the host packages the build needs
#
# RSM_TAGS holds the build tags for go-ceph: "pacific" for Debian 12's librbd
# headers (the default); empty when building against reef's. The binary built
# against pacific headers finds reef's rbd_diff_iterate3 at run time.
set -euo pipefail
cd "$(dirname "$0")"
TAGS=${RSM_TAGS-pacific}
export CGO_ENABLED=1

deps() {
	local need=() p
	for p in librbd-dev librados-dev libradospp-dev debootstrap zstd openssl; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
	done
	[ ${#need[@]} -eq 0 ] && return
	echo "dev: installing ${need[*]}"
	local apt=(apt-get -o DPkg::Lock::Timeout=600 -y -q --no-install-recommends)
	DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${need[@]}" >/dev/null 2>&1 || {
		apt-get -q update >/dev/null
		DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${need[@]}" >/dev/null
	}
}

version() { git describe --tags --always --dirty 2>/dev/null || echo dev; }

build() {
	deps
	go build -tags "$TAGS" -ldflags "-X main.version=$(version)" -o bin/rbd-snapshot-metadata ./cmd/rbd-snapshot-metadata
	CGO_ENABLED=0 go build -o bin/snapmeta ./cmd/snapmeta
}

lint() {
	local bad
	bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
	[ -z "$bad" ] || { echo "dev: gofmt would change: $bad" >&2; return 1; }
	go vet -tags "$TAGS" ./...
	go vet -tags "$TAGS,e2e" ./e2e/...
}

unit() {
	deps
	lint
	# driver, server and client must build and pass without cgo.
	CGO_ENABLED=0 go test -count=1 ./driver/... ./server/... ./client/... ./metrics/... ./internal/clip/ ./cmd/snapmeta/
	go test -count=1 -race -tags "$TAGS" ./...
	# The Kubernetes manifests, in a module of their own (k8s.io deps).
	(cd deploy && go vet ./... && go test -count=1 ./...)
}

e2e() {
	build
	e2e/run-e2e.sh "$@"
}

# tests_of LIST: the anchored go test -run regex of the tests that
# e2e/matrix.txt puts in LIST (matrix_test.go checks its names).
tests_of() {
	local names
	names=$(awk -v list="$1" '!/^#/ { for (i = 2; i <= NF; i++) if ($i == list) print $1 }' e2e/matrix.txt | paste -sd'|')
	[ -n "$names" ] || { echo "dev: e2e/matrix.txt lists no test in $1" >&2; return 1; }
	echo "^($names)\$"
}

# The tests that check answers (byte oracle, rbd diff, Ceph-CSI handles,
# paging, errors, librbd's own fast-diff), run against the releases that
# ./dev.sh e2e (reef only) does not cover: e2e/matrix.txt's matrix list on
# tentacle, its cross list across versions. RSM_CEPH is the cluster's
# release, RSM_CLIENT_CEPH the one whose librbd the server and tests use.
matrix() {
	build
	local matrix cross t m cluster client tests
	matrix=$(tests_of matrix)
	cross=$(tests_of cross)
	for m in tentacle/tentacle/"$matrix" tentacle/reef/"$cross" reef/tentacle/"$cross"; do
		IFS=/ read -r cluster client tests <<<"$m"
		t=$(date +%s)
		echo "dev: e2e, $cluster cluster, $client librbd" >&2
		RSM_CEPH=$cluster RSM_CLIENT_CEPH=$client e2e/run-e2e.sh -run "$tests"
		echo "dev: e2e, $cluster cluster, $client librbd: passed in $(($(date +%s) - t)) s" >&2
	done
}

case "${1:-}" in
deps | build | unit | lint | matrix) "$1" ;;
e2e) shift; e2e "$@" ;;
image) shift; e2e/image-build-test.sh "$@" ;;
bench) shift; build; e2e/run-bench.sh "$@" ;;
test) unit; e2e; matrix; e2e/image-build-test.sh ;;
demo) build; e2e/demo.sh ;;
*) sed -n '2,22s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
