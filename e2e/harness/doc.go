//go:build e2e

// Package harness is what the e2e tests share: the real Ceph cluster that
// e2e/cluster.sh starts, images and snapshots on it, the server (as the
// released binary in a subprocess, or in process), the references its
// answers are judged against, and the faults it must survive. Helpers used
// by one test file only stay in that file.
//
// It builds only with the e2e tag, as the tests do, and runs inside the
// test binary of package e2e: in the rootfs (e2e/exec.sh), with the
// package's folder e2e/ as the working directory, and with the cluster's
// environment (cluster.sh's env file: CEPH_MON_HOST, CEPH_KEY, CEPH_CONF,
// RSM_CLUSTER_DIR, RSM_SERVER_BIN, ...) that ClusterEnv reads. Every helper
// takes the test first, fails it on an error of its own, and undoes what
// it made (images, connections, processes) when the test ends, with
// t.Cleanup.
//
// The Kubernetes side (a control plane, kubectl, helm, the sidecar and its
// lister) is the package kube below it (e2e/harness/kube), which builds on
// this one.
//
// By file:
//
//   - cluster.go: the cluster's environment (ClusterEnv), RADOS
//     connections (ConnectAdmin, ConnectTo), images with Ceph-CSI's
//     features and their removal (CreateImage, RemoveImageOnCleanup),
//     writes, discards and snapshots, the rbd and ceph command lines
//     (RbdCLI, RbdCLIEnv, RbdTry, CephAuth), and a second cluster of a
//     test's own (StartExtraCluster).
//   - csi.go: volumes and snapshots laid out exactly as Ceph-CSI's RBD
//     controller lays them out, journal and LUKS2 header included
//     (NewCSICluster, CSICluster.CreateVolume, CSIVolume.Snapshot,
//     CSISnap.Restore).
//   - volumes.go: an image with snapshots and the native IDs the server
//     accepts for it (CreateVolume, RbdVolume), filled with recognizable
//     data (FillAt), or with many writes fast (ManyWrites, ImportDiff;
//     SharedManyWrites for tests that only read it).
//   - server.go: the server binary as a subprocess (StartServer, Server),
//     its two RPCs called with the raw CSI client (MetaReq, Server.Get,
//     Server.Open), the spec's stream invariants (CheckStream), the
//     request secrets of the Ceph-CSI-like user client.csi (CSISecrets),
//     and a client that reads slowly (SlowReader).
//   - spans.go: byte ranges, the unit answers are compared in (Span,
//     MergeSpans, ClipSpans, RoundOut, Uncovered, DiffSpans).
//   - reference.go: the references: `rbd diff` (RbdDiffOf,
//     WantFromRbdDiff) and the bytes of the snapshots (OpenSnap,
//     ChangedBytes, OracleMisses).
//   - faults.go: a daemon paused (PauseDaemon), the OSD killed and
//     restarted (KillOSD), and the wait until the cluster serves I/O
//     again (WaitClusterIO).
//   - wait.go: polling until a condition holds (WaitFor), and whether a
//     channel is closed (Closed).
//   - procserver.go: a server process that can be killed and restarted on
//     the same socket (StartProc, ProcServer), free addresses and short
//     socket paths (FreeTCPAddr, ShortSocket), and /metrics (Scrape,
//     MetricValue).
//   - inproc.go: a server in the test process whose source, handlers and
//     goroutines the test can inspect (StartInProc, InProc,
//     RecordingServices).
//   - memory.go: a process's memory from /proc (ProcStatus, SampleMemory).
//   - trim.go: snapshot trimming at once (FastSnapTrim), and the wait
//     until a removed snapshot is gone from objects' snap sets (WaitTrimmed).
//   - suite.go: fixtures shared by the tests of one test binary, made by
//     the first that asks (SharedManyWrites) and removed when the suite
//     ends (EndSuite, which the e2e package's TestMain calls).
package harness
