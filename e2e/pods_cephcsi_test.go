//go:build e2e

package e2e

// TestPodsCephCSI: deploy/README.md's third route, "Ceph-CSI from its
// manifests: in the provisioner pod", on a real kubelet (a node like
// TestPods', of its own, e2e/run-pods.sh). Ceph-CSI v3.13.1's real
// csi-rbdplugin-provisioner manifest (../shared/reference/upstream) is
// applied as a user applies it (replicas 1: one node), then patched with
// ours by the README's three commands over a copy of deploy/, and the
// rollout that the one node leaves waiting is let go on as the README says.
// Its images that cannot be had here
// are STAND-INS under the same names (e2e/k8s/standin: Ceph-CSI's own
// quay.io/cephcsi/cephcsi:v3.13.1 and the sig-storage csi-provisioner,
// csi-snapshotter, csi-attacher and csi-resizer), which only create or dial
// the sockets their arguments name and wait for SIGTERM. Every check is of
// our container and of the real external-snapshot-metadata sidecar v1.1.0
// beside it: nothing a stand-in does can make one pass.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

const (
	csiNS          = "ceph-csi-rbd" // the namespace the README's commands use
	csiProvisioner = "csi-rbdplugin-provisioner"
	csiSel         = "app=csi-rbdplugin-provisioner" // the manifest's pod label
	// Ceph-CSI's examples/rbd/secret.yaml and snapshotclass.yaml.
	csiSecret = "csi-rbd-secret"
	csiClass  = "csi-rbdplugin-snapclass"
	// How long the patched provisioner pod may take to be Ready.
	csiReadyWithin = 3 * time.Minute
	// Ceph-CSI's manifest, in ../shared/reference/upstream, which
	// run-pods.sh binds into the rootfs and names in RSM_UPSTREAM.
	csiManifest = "ceph-csi-v3.13.1/csi-rbdplugin-provisioner.yaml"
)

// csiUpstreamContainers are the manifest's containers, in its order, and
// the images they run here: all stand-ins.
var csiUpstreamContainers = [][2]string{
	{"csi-rbdplugin", "quay.io/cephcsi/cephcsi:v3.13.1"},
	{"csi-provisioner", "registry.k8s.io/sig-storage/csi-provisioner:v5.0.1"},
	{"csi-snapshotter", "registry.k8s.io/sig-storage/csi-snapshotter:v8.2.0"},
	{"csi-attacher", "registry.k8s.io/sig-storage/csi-attacher:v4.6.1"},
	{"csi-resizer", "registry.k8s.io/sig-storage/csi-resizer:v1.11.1"},
	{"csi-rbdplugin-controller", "quay.io/cephcsi/cephcsi:v3.13.1"},
	{"liveness-prometheus", "quay.io/cephcsi/cephcsi:v3.13.1"},
}

func TestPodsCephCSI(t *testing.T) {
	up := os.Getenv("RSM_UPSTREAM")
	if up == "" {
		up = filepath.Join("..", "shared", "reference", "upstream")
	}
	manifest, err := os.ReadFile(filepath.Join(up, csiManifest))
	if os.Getenv("RSM_NODE_IP") != "" && err != nil {
		t.Skipf("Ceph-CSI's reference manifest is not there (%v): skipping the Ceph-CSI provisioner route; "+
			"it reads shared/reference/upstream/ next to the repository", err)
	}
	k := startNode(t)
	image, tag := os.Getenv("RSM_POD_IMAGE"), os.Getenv("RSM_POD_TAG")
	if image == "" || tag == "" {
		t.Fatal("RSM_POD_IMAGE and RSM_POD_TAG are not set (e2e/run-pods.sh sets them)")
	}
	cephCSIObjects(t, k)
	cephCSIUpstream(t, k, string(manifest))
	r := csiSnapshots(t, k)
	took := cephCSIPatch(t, k, image, tag)
	t.Logf("deploy/README.md's commands to the patched provisioner pod Ready: %.1fs", took.Seconds())

	t.Run("provisioner-pod", func(t *testing.T) { checkProvisionerPod(t, k) })
	for _, c := range []struct {
		name  string
		args  []string
		short [2][]byte
	}{
		{"allocated", []string{"-snapshot", "csi-a2"}, [2][]byte{nil, r.short[1]}},
		{"delta", []string{"-snapshot", "csi-a2", "-prev-snapshot", "csi-a1"}, r.short},
	} {
		t.Run("backup-client/"+c.name, func(t *testing.T) {
			logs, ok := runPod(t, k, "csi-"+c.name, kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
				append(c.args, "-namespace", kube.NS)...)
			if !ok {
				t.Fatalf("backup client failed:\n%s", harness.Tail(logs, 20))
			}
			got, _ := clientAnswer(t, logs)
			csiCheckOracle(t, "provisioner pod: backup client "+c.name, got, c.short[0], c.short[1], 0)
			// Served by our container in the provisioner pod.
			method := map[string]string{"allocated": "GetMetadataAllocated", "delta": "GetMetadataDelta"}[c.name]
			if log := k.Kubectl(t, "-n", csiNS, "logs", "deploy/"+csiProvisioner, "-c", "rbd-snapshot-metadata"); !strings.Contains(log, method) {
				t.Errorf("our container in the provisioner pod logged no %s:\n%s", method, harness.Tail(log, 10))
			}
		})
	}
	t.Run("rollout-restart", func(t *testing.T) {
		disrupt(t, k, r, "csi-restart", "500ms", false, true, func(t *testing.T) {
			k.Kubectl(t, "-n", csiNS, "rollout", "restart", "deployment/"+csiProvisioner)
		})
	})
}

// cephCSIObjects: what Ceph-CSI's other manifests and examples create, with
// this cluster's values, and the backup side. csi-config-map.yaml's
// ceph-csi-config with the monitors at the node's address (the cluster's
// csi-config.json), ceph-conf.yaml's ceph-config, csi-kms-config-map.yaml's
// ceph-csi-encryption-kms-config, csi-provisioner-rbac.yaml's
// ServiceAccount (its RBAC is for Ceph-CSI's own containers: stand-ins
// here, which call no API); examples/rbd/secret.yaml's Secret with the
// Ceph-CSI user's userID and userKey and snapshotclass.yaml's class naming
// it as the snapshotter secret; a backup application's ServiceAccount bound
// to our client role, and one without it.
func cephCSIObjects(t *testing.T, k *kube.Env) {
	t.Helper()
	k.Kubectl(t, "create", "namespace", csiNS)
	k.Kubectl(t, "-n", csiNS, "create", "serviceaccount", "rbd-csi-provisioner")
	k.Kubectl(t, "-n", csiNS, "create", "configmap", "ceph-csi-config",
		"--from-file=config.json="+filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	k.Kubectl(t, "-n", csiNS, "create", "configmap", "ceph-config",
		"--from-literal=ceph.conf=[global]\nauth_cluster_required = cephx\nauth_service_required = cephx\nauth_client_required = cephx\n",
		"--from-literal=keyring=")
	k.Kubectl(t, "-n", csiNS, "create", "configmap", "ceph-csi-encryption-kms-config", "--from-literal=config.json={}")
	k.Kubectl(t, "-n", csiNS, "create", "secret", "generic", csiSecret,
		"--from-literal=userID="+harness.ClusterEnv(t, "CEPH_CSI_USER"),
		"--from-literal=userKey="+harness.ClusterEnv(t, "CEPH_CSI_KEY"))
	f := filepath.Join(k.Dir, "csi-class.yaml")
	kube.WriteFile(t, f, `apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: `+csiClass+`}
driver: `+kube.Driver+`
parameters:
  clusterID: `+harness.ClusterID+`
  csi.storage.k8s.io/snapshotter-secret-name: `+csiSecret+`
  csi.storage.k8s.io/snapshotter-secret-namespace: `+csiNS+`
deletionPolicy: Delete
`)
	k.Kubectl(t, "apply", "-f", f)
	k.Kubectl(t, "create", "namespace", kube.NS)
	k.Kubectl(t, "-n", kube.NS, "create", "serviceaccount", kube.BackupSA)
	k.Kubectl(t, "create", "clusterrolebinding", "backup-app-snapshot-metadata",
		"--clusterrole=rbd-snapshot-metadata:"+csiNS+":client", "--serviceaccount="+kube.NS+":"+kube.BackupSA)
}

// cephCSIUpstream applies Ceph-CSI's provisioner manifest as its README
// says (the namespace replaced) and waits for its pod, all stand-ins. One
// node: the manifest's required pod anti-affinity (one provisioner a node)
// leaves room for one replica, so replicas 1, what a user of a one-node
// cluster sets.
func cephCSIUpstream(t *testing.T, k *kube.Env, manifest string) {
	t.Helper()
	s := strings.ReplaceAll(manifest, "namespace: default", "namespace: "+csiNS)
	if !strings.Contains(s, "\n  replicas: 3\n") {
		t.Fatal("Ceph-CSI's manifest no longer has replicas: 3")
	}
	s = strings.Replace(s, "\n  replicas: 3\n", "\n  replicas: 1\n", 1)
	f := filepath.Join(k.Dir, "csi-rbdplugin-provisioner.yaml")
	kube.WriteFile(t, f, s)
	k.Kubectl(t, "apply", "-f", f)
	took := waitRollout(t, k, csiNS, csiProvisioner, csiReadyWithin)
	t.Logf("Ceph-CSI's provisioner alone (stand-ins) Ready in %.1fs", took.Seconds())
}

// cephCSIStuck: the rollout that the patch started waits, as deploy/README.md
// says, with no more nodes than replicas: the new pod is unschedulable for
// the anti-affinity (the default 25% surge starts it before the old pod
// goes). Then the README's strategy patch lets the old pod go first.
func cephCSIStuck(t *testing.T, k *kube.Env) {
	t.Helper()
	var msg string
	harness.WaitFor(t, "the new provisioner pod unschedulable for the anti-affinity", 2*time.Minute, func() bool {
		out, _ := k.KubectlQuiet("-n", csiNS, "get", "pods", "-l", csiSel, "-o",
			`jsonpath={range .items[*]}{.status.conditions[?(@.type=="PodScheduled")].message}{"\n"}{end}`)
		msg = strings.TrimSpace(out)
		return strings.Contains(msg, "anti-affinity")
	})
	t.Logf("the patch's rollout waits, as deploy/README.md says: %s", msg)
	k.Kubectl(t, "-n", csiNS, "patch", "deployment", csiProvisioner, "--type=merge",
		"-p", `{"spec":{"strategy":{"rollingUpdate":{"maxSurge":0,"maxUnavailable":1}}}}`)
}

// cephCSIPatch runs deploy/README.md's three commands over a copy of
// deploy/ whose examples a user has given certificates and our image, and
// returns how long the patched pod took to be Ready.
func cephCSIPatch(t *testing.T, k *kube.Env, image, tag string) time.Duration {
	t.Helper()
	src := userCheckout(t, k, "examples/ceph-csi/provisioner/kustomization.yaml", image, tag)
	// As written in deploy/README.md, NS=ceph-csi-rbd (the example's own).
	script := `set -eo pipefail
NS=` + csiNS + `
deploy/gen-certs.sh -n $NS deploy/examples/ceph-csi/certs
kubectl apply --server-side --field-manager=rbd-snapshot-metadata -k deploy/examples/ceph-csi
kubectl kustomize deploy/examples/ceph-csi/provisioner |
  kubectl -n $NS patch deployment csi-rbdplugin-provisioner --patch-file=/dev/stdin
`
	t0 := time.Now()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(k.Dir, "admin.kubeconfig"), "PATH="+k.Bin+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	t.Logf("$ %s%s", script, out)
	if err != nil {
		t.Fatalf("deploy/README.md's commands: %v", err)
	}
	cephCSIStuck(t, k)
	t1 := time.Now()
	waitRollout(t, k, csiNS, csiProvisioner, csiReadyWithin)
	t.Logf("the strategy patch to the patched pod Ready: %.1fs", time.Since(t1).Seconds())
	return time.Since(t0)
}

// csiSnapshots makes the Ceph-CSI volumes and snapshots of the checks and
// their VolumeSnapshots (csi-a1, csi-a2: a short Delta; csi-l1, csi-l2:
// 32768 changed 4 KiB blocks, the long one), with Ceph-CSI's class.
func csiSnapshots(t *testing.T, k *kube.Env) podRoute {
	t.Helper()
	conn := harness.ConnectAdmin(t)
	def := harness.NewCSICluster(t, conn, harness.ClusterID, "")
	a := def.CreateVolume(t, csiVolSize, nil)
	a.Write(t, 0, 4096)
	a.Write(t, 5*harness.MiB+12288, 8192)
	a.Write(t, csiVolSize-4096, 4096)
	a1 := a.Snapshot(t)
	a.Write(t, 4096, 8192)
	a.Discard(t, 5*harness.MiB, harness.ObjSize)
	a.Write(t, 9*harness.MiB+1000, 50)
	a2 := a.Snapshot(t)
	big := def.CreateVolume(t, 128*harness.MiB, nil)
	l1 := big.Snapshot(t)
	for o := uint64(0); o < 128*harness.MiB; o += harness.CSIBlock {
		big.Write(t, o, 512)
	}
	l2 := big.Snapshot(t)
	r := podRoute{ns: csiNS, deploy: csiProvisioner, sel: csiSel, pre: "csi-", replicas: 1,
		short: [2][]byte{a1.Data(t), a2.Data(t)}, long: [2][]byte{l1.Data(t), l2.Data(t)}}
	for n, s := range map[string]struct {
		h string
		d []byte
	}{"a1": {a1.Handle(), r.short[0]}, "a2": {a2.Handle(), r.short[1]}, "l1": {l1.Handle(), r.long[0]}, "l2": {l2.Handle(), r.long[1]}} {
		k.VolumeSnapshotOf(t, kube.Driver, csiClass, "csi-"+n, s.h, int64(len(s.d)))
	}
	return r
}

// checkProvisionerPod: the patched pod Running and Ready with no restart,
// Ceph-CSI's seven containers (stand-ins) and their images kept, ours
// added, and the real sidecar in front of our server's socket.
func checkProvisionerPod(t *testing.T, k *kube.Env) {
	ps := checkPodsHealthy(t, k, csiNS, csiSel, 1)
	if len(ps) != 1 {
		t.FailNow()
	}
	p := ps[0].Metadata.Name
	if d := ps[0].readyAfter(); d > csiReadyWithin {
		t.Errorf("pod %s Ready %.1fs after its creation, more than %v", p, d.Seconds(), csiReadyWithin)
	}
	names := strings.Fields(k.Kubectl(t, "-n", csiNS, "get", "pod", p, "-o", "jsonpath={.spec.containers[*].name}"))
	images := strings.Fields(k.Kubectl(t, "-n", csiNS, "get", "pod", p, "-o", "jsonpath={.spec.containers[*].image}"))
	got := map[string]string{}
	for i := range names {
		if i < len(images) {
			got[names[i]] = images[i]
		}
	}
	want := append([][2]string{{"rbd-snapshot-metadata", os.Getenv("RSM_POD_IMAGE") + ":" + os.Getenv("RSM_POD_TAG")},
		{"csi-snapshot-metadata", "registry.k8s.io/sig-storage/csi-snapshot-metadata:v1.1.0"}}, csiUpstreamContainers...)
	if len(names) != len(want) {
		t.Errorf("containers %v, want Ceph-CSI's 7 and our 2", names)
	}
	for _, c := range want {
		if got[c[0]] != c[1] {
			t.Errorf("container %s runs %q, want %q", c[0], got[c[0]], c[1])
		}
	}
	for _, c := range csiUpstreamContainers {
		log, _ := k.KubectlQuiet("-n", csiNS, "logs", p, "-c", c[0])
		t.Logf("%s: STAND-IN, not the real image: %s", c[0], lastLine(log))
	}
	// The sidecar asked OUR socket for the driver's name and capability.
	if log := k.Kubectl(t, "-n", csiNS, "logs", p, "-c", "csi-snapshot-metadata"); !strings.Contains(log, `CSI driver name: "`+kube.Driver+`"`) {
		t.Errorf("the sidecar did not get the driver's name from our server:\n%s", harness.Tail(log, 10))
	}
}
