//go:build e2e

// Package e2e holds the end-to-end tests: the server, its client, the
// sidecar and the charts against a real Ceph cluster and real Kubernetes
// components, nothing mocked.
//
// # How the suite runs
//
// ./dev.sh e2e [go test args] (e2e/run-e2e.sh) builds the server
// (bin/rbd-snapshot-metadata) and finds or builds the Kubernetes binaries
// (e2e/k8s/k8s.sh), then e2e/with-cluster.sh starts a throwaway cluster
// (e2e/cluster.sh: one monitor, one OSD, the pool rbd with namespace ns1,
// the users client.admin and client.csi, csi-config.json), exports its env
// file, runs go test on ./e2e/ and removes the cluster. The test binary is
// built on the host against Debian 12's pacific headers (-tags pacific,e2e)
// and run by e2e/exec.sh inside the Ceph release's root filesystem
// (e2e/rootfs.sh: reef 18.2.7, or tentacle 20.2.4 with RSM_CEPH=tentacle),
// whose librbd has rbd_diff_iterate3; the folders it needs are bound at
// their own paths (RSM_BIND). By hand:
//
//	e2e/cluster.sh start /var/tmp/rsm-c && set -a && . /var/tmp/rsm-c/env && set +a
//	./dev.sh build    # the server tests run bin/rbd-snapshot-metadata
//	RSM_SERVER_BIN=$PWD/bin/rbd-snapshot-metadata RSM_BIND="/var/tmp/rsm-c $PWD/bin" \
//	  go test -tags pacific,e2e -count=1 -exec "$PWD/e2e/exec.sh" ./e2e/
//
// run-e2e.sh runs go test -json, whose events go through
// e2e/testreport, which prints go test's usual output (every line with
// -v; else the failed tests' whole output and the package lines) and, at
// the end, the ten slowest tests and subtests with their seconds, so that
// every run's log says where its time went; the exit code stays go
// test's.
//
// Knobs: RSM_E2E_SEED=n replays one seed of the oracle tests,
// RSM_E2E_SEEDS=n runs n fresh random seeds instead of the fixed ones
// (the soak's); RSM_E2E_PARALLEL=n runs n of a test's oracle histories
// at once (default 2, one per core: oracle.Parallel; 1 for the tables'
// times of a query alone); RSM_E2E_BIG=1 adds the slow variants
// (TestManyWrites with 2^20 writes); RSM_BENCH=1 runs the benchmark (e2e/run-bench.sh);
// RSM_CLIENT_CEPH picks the librbd the tests and the server run with,
// RSM_CEPH the cluster's release (./dev.sh matrix).
//
// What CI runs (.ci/run: ./dev.sh test, then ./dev.sh bench): every test
// of the index below on reef, the benchmark's skipped (in three runs,
// each with a cluster of its own: the soak list's oracle tests, the k8s
// list's Kubernetes tests, and the rest; the pods tests in a fourth,
// ./dev.sh pods); the tests of
// e2e/matrix.txt's matrix list on tentacle, and of its cross list with
// reef's librbd on a tentacle cluster and tentacle's on a reef one
// (./dev.sh matrix); the tests of the server with the image's entrypoint
// on tentacle (./dev.sh image); then the benchmark's tests (./dev.sh
// bench). RSM_E2E_BIG's variants run in no CI. The oracle tests, those of
// e2e/matrix.txt's soak list (TestPreciseOracle,
// TestPreciseOracleLayering, TestPreciseOracleECDataPool,
// TestPreciseVolumeKinds), run in CI on a fixed, recorded set of seeds
// (e2e/oracle/seeds.go: every seed that ever failed, oracle.Failed, and
// a sample, oracle.Sample), the same on every run. Fresh random seeds
// run only in the soak, ./dev.sh soak [N] (N per test on a throwaway
// reef cluster), which prints each seed that fails as the line to add to
// oracle.Failed, so that CI replays it from then on. matrix_test.go at
// the repository's root checks e2e/matrix.txt's names.
//
// # What the harness offers
//
// The package e2e/harness holds what more than one test file uses, with
// the e2e tag too; its doc lists it by file. In short: ClusterEnv reads the
// cluster's env file (a missing variable fails the test: an e2e run
// without a cluster is an error); ConnectAdmin, CreateImage, Snapshot and
// RbdCLI make images and snapshots; NewCSICluster lays out volumes and
// snapshots as Ceph-CSI does; StartServer runs the released binary on a
// socket and Server.Get calls its RPCs with the raw CSI client, with
// CheckStream for the spec's stream invariants; RbdDiffOf and
// ChangedBytes are the references; StartInProc, StartProc, PauseOSD,
// PauseDaemon, KillOSD and SlowReader make the faults. Every helper takes
// the test first, fails it on its own errors, and undoes what it made when
// the test ends. A helper that one file uses stays in that file.
//
// The package e2e/harness/kube is the Kubernetes side, for the k8s_*_test.go
// files and pods_test.go: kube.StartControlPlane runs etcd and
// kube-apiserver on 127.0.0.1 (kube.Start adds TestK8sSidecar's objects),
// kube.Attach speaks to the pods' node; Env.Kubectl, Env.Helm and Env.Do
// act as admin, Env.StartSidecar and Env.Lister run the sidecar and its
// client, and every process is the test's child (Env.StartProcess). Its doc
// lists it by file.
//
// The package e2e/oracle is precise mode's byte oracle, built on the
// harness: random histories on real images made of named scenarios
// (oracle.Shapes, the kinds a seed picks; oracle.Steps, the steps of its
// random histories), every snapshot read back, and every mode's answer
// judged against those bytes, with the table TestPreciseOracle prints.
// The precise_*_test.go files and concurrent_removal_test.go use it.
//
// # Index
//
// Theme, then file, then the tests in it, in the file's order (go test
// runs them in that order, files by name: reliability_test.go's faults
// run after the other reliability tests, and only revocation_test.go's
// after them). layout_test.go at the repository's root checks that this
// index names every Test function of every file, and nothing else.
//
// The test binary's main: the tests, then the removal of what they
// shared (harness.SharedManyWrites, harness.EndSuite):
//
//   - main_test.go: TestMain
//
// The harness's own tests, of the references the other tests trust:
//
//   - harness_test.go: TestHarnessDiffTrashSnapshotsByID,
//     TestHarnessCSIUserAndNamespace
//
// Answers: every RPC against references (rbd diff, the bytes of the
// snapshots, librbd's own diff), every ID form, paging and resuming:
//
//   - compare_test.go: TestServerMatchesRbdDiff
//   - csi_snapshots_test.go: TestCSISnapshotHandles
//   - paging_test.go: TestStartingOffsetAndMaxResults, TestResume,
//     TestClientResumesBrokenStreams
//   - conformance_test.go: TestConformance
//   - fastdiff_test.go: TestLibrbdFastDiffShrinkRegrow
//   - librbd_race_test.go: TestLibrbdOpenCloseRace (runs only with
//     RSM_LIBRBD_RACE set: it crashes librbd)
//   - large_test.go: TestMillionExtents, TestManyWrites
//
// Precise mode (--precision=precise) against the byte oracle, and the
// hazards of object maps it must survive:
//
//   - precise_test.go: TestPreciseOracle, TestPreciseOracleLayering,
//     TestPreciseFallsBackAndStops, TestPreciseCost
//   - precise_ec_test.go: TestPreciseOracleECDataPool
//   - precise_kinds_test.go: TestPreciseVolumeKinds
//   - precise_listing_test.go: TestPreciseListing
//   - precise_hazards_test.go: TestPreciseRollback, TestPreciseCopyOnRead,
//     TestPreciseFormat1, TestPreciseMigration,
//     TestPreciseFallbackReported, TestPreciseInvalidObjectMap,
//     TestPreciseDeepClone
//
// Requests that cannot be served: statuses, keys and users, monitors,
// the server's own flags:
//
//   - errors_test.go: TestErrors, TestWrongKey, TestKeyOfAnotherType
//   - permissions_test.go: TestUserWithoutPoolRights
//   - revocation_test.go: TestRevokedKey
//   - monitors_test.go: TestMonitorForms
//   - lifecycle_test.go: TestServerIdentity, TestServerRejectsBadFlags
//   - crash_test.go: TestCSICrashReport
//
// Snapshots removed while a stream reads them:
//
//   - concurrent_removal_test.go: TestSnapshotRemovedMidStream,
//     TestCSIDeleteSnapshotMidStream
//
// Reliability: cancels, panics, limits, load, memory, secrets in logs,
// shutdown, and faults of the cluster that streams resume past:
//
//   - reliability_cancel_test.go: TestReliabilityCancelLeaks,
//     TestReliabilityPanic
//   - reliability_limits_test.go: TestReliabilityLimits
//   - reliability_load_test.go: TestReliabilityLoad
//   - reliability_memory_test.go: TestReliabilityMemory
//   - reliability_resume_test.go: TestReliabilityResume,
//     TestReliabilityMonitorLeader, TestReliabilityResumeOSDKilled,
//     TestReliabilityResumeNoHole
//   - reliability_secrets_test.go: TestReliabilitySecrets
//   - reliability_shutdown_test.go: TestReliabilityShutdown
//   - reliability_snapremoved_test.go: TestReliabilityResumeSnapRemoved
//   - reliability_test.go: TestReliabilityFaults
//
// Kubernetes, with the real components built by e2e/k8s/k8s.sh (the
// sidecar and its lister, kube-apiserver, kubectl, helm, ceph-csi-operator):
//
//   - k8s_test.go: TestK8sSidecar, TestK8sSidecarWaitsForNotReadyServer
//   - k8s_resume_test.go: TestK8sSidecarResume
//   - k8s_deploy_test.go: TestK8sDeploy
//   - k8s_helm_test.go: TestK8sHelm
//   - k8s_operator_test.go: TestK8sCSIOperator
//
// Our pods on a real kubelet: a one-node Kubernetes (e2e/k8s/node.sh) and
// a reef cluster in a network namespace of their own, our image and the
// sidecar's installed by each route of deploy/README.md (the Helm chart and
// the Rook kustomize example in TestPods; Ceph-CSI v3.13.1's provisioner
// pod patched with ours in TestPodsCephCSI, its Ceph-CSI and sig-storage
// images stand-ins from e2e/k8s/standin), backup clients as pods. Only
// e2e/run-pods.sh (./dev.sh pods, CI's pods phase) runs them; elsewhere
// they skip. TestPodsHold is ./dev.sh node:
//
//   - pods_test.go: TestPods, TestPodsHold
//   - pods_restart_test.go: (the pods test's server killed and restarted in
//     place beside its old socket)
//   - pods_memory_test.go: (the memory subtests of the pods test: stalled readers
//     beside a precise stream; the containers' memory cgroups)
//   - pods_cert_test.go: (the pods test's certificate renewed by helm
//     upgrade, seen by the running sidecars)
//   - pods_cephcsi_test.go: TestPodsCephCSI
//
// The benchmark, skipped unless RSM_BENCH=1 (e2e/run-bench.sh, ./dev.sh
// bench):
//
//   - bench_test.go: TestBench, TestBenchNoFastDiff, TestBenchBigFastDiff
//
// Outside go test: e2e/image-build-test.sh (./dev.sh image) builds the
// Dockerfile and runs e2e tests with the image's server.
package e2e
