//go:build e2e

// Package kube is the Kubernetes side of the e2e tests: a control plane of
// the test's own (etcd and kube-apiserver on 127.0.0.1, the binaries of
// e2e/k8s/k8s.sh build in RSM_K8S_BIN), or an admin client of the pods'
// node (e2e/k8s/node.sh); objects made over its HTTP API or with the real
// kubectl and helm; Kubernetes' external-snapshot-metadata sidecar in front
// of our server, and the sidecar's client, snapshot-metadata-lister. The
// tests that use it are e2e/k8s_*_test.go and e2e/pods_test.go.
//
// It builds only with the e2e tag, as package harness does, and follows its
// rules: every helper takes the test first and fails it on an error of its
// own; every process it starts is the test's child, stopped by its PID when
// the test ends.
//
// By file:
//
//   - env.go: the control plane (StartControlPlane; Start adds
//     TestK8sSidecar's namespace, Secret, VolumeSnapshotClass,
//     SnapshotMetadataService and ServiceAccounts, named by the constants
//     Driver, NS, BackupSA, ...), its ports (Ports), an existing API server
//     (Attach), and the binaries' folder (Bin).
//   - pki.go: the CA and certificates of the control plane and the sidecar
//     (PKI).
//   - proc.go: processes of the test with their logs (Env.StartProcess,
//     Proc, Env.Log), and WriteFile.
//   - api.go: requests to the API server as admin (Do, Must, Create,
//     PatchStatus), VolumeSnapshots bound to a CSI snapshot handle
//     (VolumeSnapshot, SnapshotClass), and kubeconfigs as admin or with a
//     ServiceAccount's token (Kubeconfig, AdminKubeconfig, SAKubeconfig,
//     TokenKubeconfig).
//   - clients.go: the real kubectl and helm as admin (Kubectl, GetJSON,
//     Helm, ...; BuildDir finds what e2e/k8s/k8s.sh built), resource
//     versions (ResourceVersions), RBAC checks (Allowed); the sidecar
//     (StartSidecar, Healthy), its lister and the lister's output (Lister,
//     ParseLister, Record), and e2e/k8s/k8s.sh up's wait (Hold).
package kube
