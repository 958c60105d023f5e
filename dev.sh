#!/bin/bash
# The project's one entry point: it installs what is missing, builds, tests
# and runs the demo, on Debian 12 as root with only Go and gcc to start with.
#
#   ./dev.sh demo     a throwaway Ceph cluster, the server, and real changed blocks
#   ./dev.sh test     unit tests and, side by side (RSM_JOBS at a time, default
#                     3), each with a fresh real cluster: the e2e suite on reef
#                     (in three parts), the matrix (tentacle and cross-version),
#                     the image, and its pods on a real kubelet; ends with the
#                     table of its phases' times
#   ./dev.sh unit     gofmt, go vet, unit tests (the driver also without cgo), -race
#   ./dev.sh e2e [go test args]   e2e tests only (RSM_CEPH=tentacle: on Ceph tentacle)
#   ./dev.sh matrix   the tests of e2e/matrix.txt's matrix list on tentacle, and
#                     of its cross list across versions (reef's librbd on a
#                     tentacle cluster, tentacle's on reef), side by side
#   ./dev.sh soak [N] the oracle tests (e2e/matrix.txt's soak list) with N fresh
#                     random seeds each (default 12) on a throwaway reef cluster
#                     (RSM_CEPH for another); prints each failing seed as the
#                     line to add to e2e/oracle/seeds.go, which CI runs forever
#   ./dev.sh bench [go test args]   the benchmark; RSM_BENCH_SCALE=full for 2^20 extents, 1 TiB and 10 TiB
#   ./dev.sh pods [go test args]    our image's pods on a one-node Kubernetes
#                     (kubelet, containerd, CoreDNS) in a network namespace of
#                     its own, with a throwaway reef cluster: e2e/run-pods.sh
#   ./dev.sh node     that node with our image, held up until Ctrl-C; prints
#                     its kubeconfig, its logs' folder and how to enter it
#   ./dev.sh image [go test args]   build the Dockerfile with buildah, run its server
#                     against tentacle (aes256k key) and reef (aes key), then
#                     e2e tests on tentacle with the image's entrypoint
#   ./dev.sh build    bin/rbd-snapshot-metadata (cgo, librbd) and bin/snapmeta (pure Go)
#   ./dev.sh deps     the host packages the build needs
#   ./dev.sh phases SECONDS RC   print the phase table of RSM_PHASES and the total
#
# RSM_TAGS holds the build tags for go-ceph: "pacific" for Debian 12's librbd
# headers (the default); empty when building against reef's. The binary built
# against pacific headers finds reef's rbd_diff_iterate3 at run time.
#
# test, matrix, soak and bench time their steps and end with a table of them
# (name, seconds, CPU-seconds, result) and the total, also when a step fails. The rows go
# to the file RSM_PHASES names: set by a caller that runs several of them
# and prints the table itself (.ci/run, with ./dev.sh phases), else a temp
# file of the call's own.
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

# phase NAME CMD...: runs CMD (a function too, with errexit, in a
# subshell) as one row of the phase table: "NAME SECONDS RC CPU" appended
# to $RSM_PHASES when set, CPU being the CPU-seconds that CMD and every
# process it started used (a cpuacct cgroup of the phase's own, under the
# caller's, so that an outer phase counts its inner ones; a pod's
# containers are in the kubelet's cgroups and are not counted; "-" where
# cgroup v1's cpuacct is not writable). CMD sees RSM_PHASE=NAME, so that
# e2e/run-e2e.sh names the rows of the Kubernetes builds it times NAME/k8s
# and so on. Returns CMD's exit code. Call it as a statement of its own,
# not in an if or a || list, where bash ignores errexit inside CMD's
# functions.
phase() {
	local name=$1 start=$SECONDS rc took errexit=$- cg cpu=-
	shift
	[ -z "${RSM_PHASES:-}" ] || [ -s "$RSM_PHASES" ] || echo "#busy $(busy_ticks)" >>"$RSM_PHASES"
	cg=$(phase_cgroup "$name")
	set +e
	(
		set -e
		[ -z "$cg" ] || echo "$BASHPID" >"$cg/cgroup.procs"
		export RSM_PHASE=$name
		"$@"
	)
	rc=$?
	took=$((SECONDS - start))
	[[ $errexit != *e* ]] || set -e
	if [ -n "$cg" ]; then
		cpu=$(($(cat "$cg/cpuacct.usage") / 1000000000))
		rmdir "$cg" 2>/dev/null || left_behind "$name" "$cg"
	fi
	[ -z "${RSM_PHASES:-}" ] || echo "$name $took $rc $cpu" >>"$RSM_PHASES"
	return "$rc"
}

# phase_cgroup NAME: a new cpuacct cgroup for phase NAME under this
# shell's own, its path printed; nothing when there is none to make.
phase_cgroup() {
	local own dir
	own=$(awk -F: '$2 ~ /(^|,)cpuacct(,|$)/ { print $3 }' /proc/$BASHPID/cgroup 2>/dev/null)
	[ -n "$own" ] && [ -d "/sys/fs/cgroup/cpuacct$own" ] || return 0
	dir=/sys/fs/cgroup/cpuacct${own%/}/rsm-phase-$BASHPID-${1//\//-}
	if mkdir "$dir" 2>/dev/null; then echo "$dir"; fi
}

# left_behind NAME CGROUP: phase NAME ended with processes still in its
# cgroup: gives them 10 s to end (a daemon stopped but not yet gone), then
# says which remain, and leaves the cgroup to them.
left_behind() {
	local i pids
	for i in $(seq 10); do
		sleep 1
		if rmdir "$2" 2>/dev/null; then
			echo "dev: $1 left processes that ended ${i}s after it" >&2
			return
		fi
	done
	pids=$(paste -sd, "$2/cgroup.procs")
	echo "dev: $1 left processes in $2:" >&2
	[ -z "$pids" ] || ps -o pid=,etimes=,args= -p "$pids" | cut -c1-200 >&2
}

# busy_ticks: the machine's busy CPU time since boot, in USER_HZ ticks
# (/proc/stat: all but idle and iowait).
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# own_phases: a temp RSM_PHASES for this call, printed as the table when
# it exits, however it exits, unless a caller has set RSM_PHASES (and
# prints it).
own_phases() {
	[ -z "${RSM_PHASES:-}" ] || return 0
	RSM_PHASES=$(mktemp -t rsm-phases.XXXXXX)
	export RSM_PHASES
	trap 'rc=$?; phases_table "$SECONDS" "$rc" || true; rm -f "$RSM_PHASES"; exit "$rc"' EXIT
}

# phases_table SECONDS RC: the rows of $RSM_PHASES in the order they
# ended (a step's own steps before it), then the total: its wall time and
# the machine's busy CPU-seconds since the first phase began, with that as
# a share of all its cores.
phases_table() {
	local total=${1:?phases SECONDS RC} rc=${2:?phases SECONDS RC}
	[ -n "${RSM_PHASES:-}" ] || { echo "dev: phases: RSM_PHASES is not set" >&2; return 2; }
	awk -v total="$total" -v rc="$rc" -v now="$(busy_ticks)" -v hz="$(getconf CLK_TCK)" -v cores="$(nproc)" '
		function row(name, s, r, c) { printf "dev: %-40s %7s %7s  %s\n", name, s, c, r == 0 ? "ok" : "FAILED (exit " r ")" }
		BEGIN { printf "dev: %-40s %7s %7s  %s\n", "phase", "seconds", "cpu-s", "result" }
		$1 == "#busy" { if (busy0 == "") busy0 = $2; next }
		NF >= 3 { row($1, $2, $3, NF >= 4 ? $4 : "-") }
		END {
			cpu = busy0 == "" ? "-" : int((now - busy0) / hz)
			row("total", total, rc, cpu)
			if (cpu != "-" && total > 0)
				printf "dev: the machine was %d%% busy (%d cores, all processes, pods too)\n", 100 * cpu / (cores * total), cores
		}' "$RSM_PHASES" >&2
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
# Each leg is a background phase, matrix-CLUSTER-LIBRBD, in a network
# namespace of its own (e2e/netns.sh), so the three run side by side (bg:
# RSM_JOBS at a time), and beside whatever the caller runs before join
# collects them.
legs() {
	local matrix cross m cluster client tests
	matrix=$(tests_of matrix)
	cross=$(tests_of cross)
	for m in tentacle/tentacle/"$matrix" tentacle/reef/"$cross" reef/tentacle/"$cross"; do
		IFS=/ read -r cluster client tests <<<"$m"
		bg "matrix-$cluster-$client" env RSM_CEPH="$cluster" RSM_CLIENT_CEPH="$client" RSM_K8S=0 \
			e2e/netns.sh e2e/run-e2e.sh -run "$tests"
	done
}

# bg NAME CMD...: phase NAME CMD started in the background, its output
# into a log of its own that join prints when it ends (several at once
# would interleave). At most RSM_JOBS (default 3) run at once: past that,
# bg first waits for one to end (reap). BG holds "PID NAME LOG" of the
# ones not reaped yet, BG_RC the first non-zero exit code among those
# reaped.
#
# Why 3 on CI's two cores: a phase's own tests keep about a core busy, and
# more phases at once make each costlier, not only slower. With all seven
# at once (load 20-25), one oracle history took 2.2 times the CPU it takes
# on an idle machine (docs/development.md#ci).
BG=() BG_RC=0
bg() {
	local name=$1 log
	shift
	while [ ${#BG[@]} -ge "${RSM_JOBS:-3}" ]; do reap; done
	log=$(mktemp -t "rsm-${name//\//-}.XXXXXX.log")
	echo "dev: $name: started beside the others; its output when it ends (log: $log)" >&2
	phase "$name" "$@" >"$log" 2>&1 </dev/null &
	BG+=("$! $name $log")
}

# reap: waits for one bg phase to end and prints its output.
reap() {
	local r=0 pid e name log left=()
	wait -n -p pid $(printf '%s\n' "${BG[@]}" | cut -d' ' -f1) || r=$?
	for e in "${BG[@]}"; do
		read -r _ name log <<<"$e"
		if [ "${e%% *}" = "$pid" ]; then
			echo "dev: ---- $name ended (exit $r); its output:" >&2
			cat "$log" >&2
			echo "dev: ---- end of $name's output" >&2
			rm -f "$log"
		else
			left+=("$e")
		fi
	done
	BG=("${left[@]}")
	[ "$BG_RC" != 0 ] || BG_RC=$r
}

# join: waits for every bg phase, printing each one's output as it ends,
# and returns the first non-zero exit code among all (0 when all passed).
join() {
	while [ ${#BG[@]} -gt 0 ]; do reap; done
	return "$BG_RC"
}

# rootfs RELEASE: the release's root filesystem, built or restored now as
# a phase of its own rather than inside the first e2e run that needs it.
rootfs() { phase "rootfs-$1" env RSM_CEPH="$1" e2e/rootfs.sh; }

matrix() {
	phase build build
	rootfs tentacle
	rootfs reef
	legs
	join
}

# prefetch: what the later phases need and nothing before them does,
# made in the background while those run: the Kubernetes tools (CPU) and
# the node's images, helm beside them (the pods need both, and helm fills
# what the big build's serial stretches leave idle), then the root
# filesystems and the image's base images (mostly downloads, so they
# overlap the CPU work well), and last the csi-operator (only the k8s
# phase needs it). Each is cached and locked by its own script, so the
# phase that needs it later finds it ready or waits for it, and still
# fails as it always did when it cannot be made: a failure here only
# costs the overlap. Its rows are prefetch/NAME.
prefetch() {
	[ "${RSM_PREFETCH:-1}" = 1 ] || return 0
	local log=/var/tmp/rsm-prefetch-$$.log
	echo "dev: prefetching the Kubernetes tools, root filesystems and base images in the background (log: $log)" >&2
	{
		{ phase prefetch/k8s e2e/k8s/k8s.sh build >/dev/null &&
			phase prefetch/images e2e/k8s/k8s.sh images >/dev/null; } &
		phase prefetch/helm e2e/k8s/k8s.sh helm >/dev/null &
		phase prefetch/rootfs-reef env RSM_CEPH=reef e2e/rootfs.sh &&
			phase prefetch/rootfs-tentacle env RSM_CEPH=tentacle e2e/rootfs.sh &&
			phase prefetch/image-base e2e/buildah.sh seed
		wait
		phase prefetch/csi-operator e2e/k8s/k8s.sh csi-operator >/dev/null
	} >"$log" 2>&1 </dev/null &
}

# k8s_apart REGEX: the e2e tests of REGEX (e2e/matrix.txt's k8s list) in a
# network namespace of their own, which has no way to the module proxy:
# the Kubernetes tools are built (or found) before, outside it, as the
# image's test does; a failed build fails those tests there, as in
# run-e2e.sh, not this phase before them.
k8s_apart() {
	e2e/k8s/k8s.sh tools
	e2e/netns.sh e2e/run-e2e.sh -run "$1"
}

# ./dev.sh test: what e2e and matrix do, with one build, then the image and its pods;
# what later phases need is made during the unit tests (prefetch). The
# suite on reef runs in three parts, each with a cluster of its own: the
# oracle tests (e2e/matrix.txt's soak list, e2e-reef-oracle), the
# Kubernetes tests (its k8s list, e2e-reef-k8s) and the rest (e2e-reef,
# the longest phase, which mostly waits on timeouts and the OSDs). With
# them run the matrix's legs, the pods and the image, RSM_JOBS at a time,
# the longest first (bg); all but e2e-reef and the image's build in a
# network namespace of their own (e2e/netns.sh, run-pods.sh), so that none
# meets another's ports or faults. The unit tests run in one of those
# slots, beside the reef suite and the pods, so that no phase waits for
# them; a failure there still fails the run. The image is built once, at
# the start (image-build), for the pods and the image's test
# (RSM_IMAGE_BUILT).
test_all() {
	local rc=0 oracle k8s v image ib iblog
	deps
	prefetch
	# The image, built once for the image's test and the pods, beside the
	# first phases.
	v=$(version)
	image=localhost/rbd-snapshot-metadata:$v
	iblog=$(mktemp -t rsm-image-build.XXXXXX.log)
	phase image-build e2e/buildah.sh build "$image" "$v" >"$iblog" 2>&1 </dev/null &
	ib=$!
	phase build build
	rootfs reef
	rootfs tentacle
	oracle=$(tests_of soak)
	k8s=$(tests_of k8s)
	# The longest first, RSM_JOBS at a time (bg); the unit tests take one
	# of the slots, not the whole machine ahead of the others.
	# RSM_K8S=0: the rest needs no Kubernetes tool, so it does not wait
	# for their builds; on a cold machine it waited 823 s for k8s.sh
	# build, then for csi-operator and helm, holding a slot.
	bg "e2e-${RSM_CEPH:-reef}" env RSM_K8S=0 e2e/run-e2e.sh -skip "$oracle|$k8s"
	bg unit unit
	# Without the image (its build failed), each builds its own and says why.
	wait "$ib" || { image=; echo "dev: image-build failed; the pods and the image's test build their own:" >&2; }
	cat "$iblog" >&2
	rm -f "$iblog"
	bg pods env ${image:+RSM_IMAGE_BUILT="$image"} e2e/run-pods.sh
	bg "e2e-${RSM_CEPH:-reef}-oracle" env RSM_K8S=0 e2e/netns.sh e2e/run-e2e.sh -run "$oracle"
	bg "e2e-${RSM_CEPH:-reef}-k8s" k8s_apart "$k8s"
	legs
	bg image env ${image:+RSM_IMAGE_BUILT="$image"} e2e/image-build-test.sh
	join || rc=$?
	return "$rc"
}

# soak [N]: the tests of e2e/matrix.txt's soak list, with N fresh random
# seeds each (RSM_E2E_SEEDS: consecutive from a random start), on a
# throwaway cluster of RSM_CEPH (default reef). go test's output (-v) goes
# to a log under /var/tmp too; then the number of seeds run, and each that
# failed as the line to append to Failed in e2e/oracle/seeds.go. The
# oracle logs "oracle: seed=N test=T" per seed run and "oracle: FAILED
# seed=N test=T" per failed one (e2e/oracle/seeds.go, watchSeed).
soak() {
	local n=${1:-12} ceph=${RSM_CEPH:-reef} tests log rc
	[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "dev: soak N: want a positive number of seeds, not '$n'" >&2; return 2; }
	tests=$(tests_of soak)
	own_phases
	log=/var/tmp/rsm-soak-$(date +%Y%m%d-%H%M%S)-$$.log
	phase build build
	rootfs "$ceph"
	echo "dev: soak: $n random seeds each for $tests on $ceph; go test's output in $log" >&2
	# go test's default in run-e2e.sh is 60 min; about 1.5 min per seed
	# of each test on a loaded machine, twice that here.
	set +e
	phase soak soak_run "$n" "$ceph" "$tests" "$log" "$((20 + 3 * n > 60 ? 20 + 3 * n : 60))m"
	rc=$?
	set -e
	soak_report "$log" "$ceph" "$rc"
	return "$rc"
}

# soak_run N RELEASE REGEX LOG TIMEOUT: the soak's go test, into LOG too.
soak_run() {
	RSM_CEPH=$2 RSM_E2E_SEEDS=$1 e2e/run-e2e.sh -run "$3" -v -timeout "$5" 2>&1 | tee "$4"
}

# soak_report LOG RELEASE RC: the soak's summary from the oracle's lines.
soak_report() {
	local log=$1 ceph=$2 rc=$3 ran failed nfailed
	ran=$({ grep -oE 'oracle: seed=[0-9]+ test=[A-Za-z0-9_]+' "$log" || true; } | sort -u | wc -l)
	failed=$({ grep -oE 'oracle: FAILED seed=[0-9]+ test=[A-Za-z0-9_]+' "$log" || true; } | sort -u)
	nfailed=0
	[ -z "$failed" ] || nfailed=$(wc -l <<<"$failed")
	echo "dev: soak: $ran seeds run, $nfailed failed (go test exit $rc); log $log" >&2
	if [ "$nfailed" -gt 0 ]; then
		echo "dev: soak: append to Failed in e2e/oracle/seeds.go, and say in Why what each found:" >&2
		sed -E 's/^oracle: FAILED seed=([0-9]+) test=([A-Za-z0-9_]+)$/\t{Seed: \1, Test: "\2", Why: ".\/dev.sh soak on '"$ceph, $(date +%F)"'"},/' <<<"$failed"
	elif [ "$rc" -ne 0 ]; then
		echo "dev: soak: go test failed, but in no seed (a test's own check, a timeout, the cluster): see $log" >&2
	fi
}

case "${1:-}" in
deps | build | unit | lint) "$1" ;;
matrix) own_phases; matrix ;;
e2e) shift; e2e "$@" ;;
soak) shift; soak "$@" ;;
image) shift; e2e/image-build-test.sh "$@" ;;
pods) shift; own_phases; phase build build; phase pods e2e/run-pods.sh "$@" ;;
node) build; e2e/run-pods.sh --hold ;;
bench) shift; own_phases; phase build build; phase bench e2e/run-bench.sh "$@" ;;
test) own_phases; test_all ;;
phases) shift; phases_table "$@" ;;
demo) build; e2e/demo.sh ;;
*) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
