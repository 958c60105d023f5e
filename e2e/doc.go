//go:build e2e

// Package e2e holds the end-to-end tests that run against a real Ceph reef
// cluster (e2e/cluster.sh) inside the reef root filesystem (e2e/rootfs.sh).
// Run them with e2e/run-e2e.sh (make e2e), or by hand:
//
//	e2e/cluster.sh start /var/tmp/rsm-c && set -a && . /var/tmp/rsm-c/env && set +a
//	./dev.sh build    # the server tests run bin/rbd-snapshot-metadata
//	RSM_SERVER_BIN=$PWD/bin/rbd-snapshot-metadata RSM_BIND="/var/tmp/rsm-c $PWD/bin" \
//	  go test -tags pacific,e2e -count=1 -exec "$PWD/e2e/exec.sh" ./e2e/
//
// RSM_E2E_BIG=1 adds the slow variants (TestManyWrites with 2^20 writes).
//
// The test binary is built on the host against Debian 12's pacific headers
// and runs in the rootfs against reef's librbd, which has rbd_diff_iterate3.
//
// # Index
//
// Theme, then file, then the tests in it, in the file's order (go test
// runs them in that order, files by name: reliability_test.go's faults
// run after the other reliability tests, and only revocation_test.go's
// after them). layout_test.go at the repository's root checks that this
// index names every Test function of every file, and nothing else.
//
// The harness: the package e2e/harness holds what more than one test file
// uses (its doc lists it by file: the cluster and its images, Ceph-CSI's
// layout, the server as a subprocess or in process, the references, the
// faults); a helper that one file uses stays in that file. Its own tests
// check the references the other tests trust:
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
//   - precise_scenarios_test.go: (helpers: TestPreciseOracle's
//     scenarios by name: the shapes a seed picks, preciseShapes, and the
//     steps of its random histories, preciseSteps)
//   - precise_hazards_test.go: TestPreciseRollback, TestPreciseCopyOnRead,
//     TestPreciseFormat1, TestPreciseMigration,
//     TestPreciseFallbackReported, TestPreciseInvalidObjectMap
//
// Requests that cannot be served: statuses, keys and users, monitors,
// the server's own flags:
//
//   - errors_test.go: TestErrors, TestWrongKey, TestKeyOfAnotherType
//   - permissions_test.go: TestUserWithoutPoolRights
//   - revocation_test.go: TestRevokedKey
//   - monitors_test.go: TestMonitorForms
//   - lifecycle_test.go: TestServerIdentity, TestServerRejectsBadFlags
//
// Snapshots removed while a stream reads them:
//
//   - concurrent_removal_test.go: TestSnapshotRemovedMidStream,
//     TestCSIDeleteSnapshotMidStream
//   - precise_removal_test.go: (helpers: TestPreciseOracle's "concurrent
//     removal" histories)
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
//     TestReliabilityMonitorLeader, TestReliabilityResumeOSDKilled
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
// The benchmark, skipped unless RSM_BENCH=1 (e2e/run-bench.sh, ./dev.sh
// bench):
//
//   - bench_test.go: TestBench, TestBenchNoFastDiff, TestBenchBigFastDiff
//
// Outside go test: e2e/image-build-test.sh (./dev.sh image) builds the
// Dockerfile and runs e2e tests with the image's server.
package e2e
