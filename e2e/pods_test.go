//go:build e2e

package e2e

// TestPods: our pods on a real kubelet. A one-node Kubernetes v1.34.2
// (e2e/k8s/node.sh: kubelet, kube-proxy, scheduler, controller-manager,
// containerd, CNI bridge, CoreDNS from its add-on manifest) runs in a
// network namespace with a reef cluster (e2e/run-pods.sh, ./dev.sh pods).
// Our image, built from the Dockerfile, and the sidecar v1.1.0's image,
// built from its module, are installed with the Helm chart as
// deploy/README.md says; then backup clients run as pods with
// ServiceAccounts of their own and reach our server through the
// SnapshotMetadataService, the Service, the sidecar and the socket. Only
// e2e/run-pods.sh runs it: elsewhere it skips.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

const (
	podNS      = "ceph-csi-rbd" // the chart's release namespace: Ceph-CSI's
	podRelease = "rsm"
)

// startNode brings the node up (node.sh up) in a folder of the test and
// returns an admin client of its API server; node.sh down when the test
// ends, with the logs' tails if it failed.
func startNode(t *testing.T) *kube.Env {
	t.Helper()
	if os.Getenv("RSM_NODE_IP") == "" {
		t.Skip("needs the network namespace and the images of e2e/run-pods.sh (./dev.sh pods)")
	}
	// run-pods.sh names a folder of the machine's, so that it can bring
	// the node down should this process die before its cleanups run; each
	// test's node has a folder (its etcd, containerd) of its own there.
	dir := os.Getenv("RSM_NODE_DIR")
	if dir != "" {
		dir = filepath.Join(dir, t.Name())
	} else {
		var err error
		if dir, err = os.MkdirTemp("/var/tmp", "rsm-node."); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	node := filepath.Join("e2e", "k8s", "node.sh")
	t0 := time.Now()
	out, err := exec.Command(node, "up", dir).CombinedOutput()
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range []string{"kubelet", "containerd", "kube-proxy", "kube-apiserver", "kube-controller-manager"} {
				b, _ := os.ReadFile(filepath.Join(dir, "logs", l+".log"))
				t.Logf("%s log:\n%s", l, harness.Tail(string(b), 25))
			}
		}
		out, err := exec.Command(node, "down", dir).CombinedOutput()
		if err != nil {
			t.Errorf("node.sh down: %v\n%s", err, out)
		}
	})
	if err != nil {
		t.Fatalf("node.sh up: %v\n%s", err, out)
	}
	t.Logf("node up in %.1fs:\n%s", time.Since(t0).Seconds(), out)
	return kube.Attach(t, dir, "https://"+os.Getenv("RSM_NODE_IP")+":6443")
}

// podObjects: what the backup side of a cluster has: the namespace of the
// VolumeSnapshots, Ceph-CSI's snapshotter Secret and VolumeSnapshotClass,
// a backup application's ServiceAccount bound to the chart's client role,
// and one without it.
func podObjects(t *testing.T, k *kube.Env) {
	t.Helper()
	k.Kubectl(t, "create", "namespace", kube.NS)
	k.Kubectl(t, "-n", kube.NS, "create", "secret", "generic", kube.Secret,
		"--from-literal=userID="+harness.ClusterEnv(t, "CEPH_CSI_USER"),
		"--from-literal=userKey="+harness.ClusterEnv(t, "CEPH_CSI_KEY"))
	f := filepath.Join(k.Dir, "class.yaml")
	kube.WriteFile(t, f, kube.SnapshotClass(kube.Class, kube.Driver))
	k.Kubectl(t, "apply", "-f", f)
	k.Kubectl(t, "-n", kube.NS, "create", "serviceaccount", kube.BackupSA)
	k.Kubectl(t, "-n", kube.NS, "create", "serviceaccount", kube.NoRoleSA)
	// As the chart's rbac.yaml tells backup applications to.
	k.Kubectl(t, "create", "clusterrolebinding", "backup-app-snapshot-metadata",
		"--clusterrole=rbd-snapshot-metadata:"+podNS+":client", "--serviceaccount="+kube.NS+":"+kube.BackupSA)
}

// waitRollout waits for a Deployment's rollout and returns how long it took.
func waitRollout(t *testing.T, k *kube.Env, ns, deploy string, d time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	if out, err := k.KubectlErr(t, "-n", ns, "rollout", "status", "deploy/"+deploy, "--timeout="+d.String()); err != nil {
		t.Fatalf("rollout of %s/%s: %v\n%s\n%s", ns, deploy, err, out, describePods(k, ns))
	}
	return time.Since(t0)
}

func describePods(k *kube.Env, ns string) string {
	out, _ := k.KubectlQuiet("-n", ns, "get", "pods,events", "-o", "wide")
	return out
}

// containerStatus is what a test reads of a container's status.
type containerStatus struct {
	Name         string
	Ready        bool
	RestartCount int
	ContainerID  string
}

// podInfo is what a test reads of a pod.
type podInfo struct {
	Metadata struct {
		Name              string
		UID               string
		CreationTimestamp time.Time
		Labels            map[string]string
	}
	Status struct {
		Phase      string
		PodIP      string
		Conditions []struct {
			Type               string
			Status             string
			LastTransitionTime time.Time
		}
		ContainerStatuses []containerStatus
	}
}

func pods(t *testing.T, k *kube.Env, ns, selector string) []podInfo {
	t.Helper()
	var l struct{ Items []podInfo }
	out, err := k.KubectlQuiet("-n", ns, "get", "pods", "-l", selector, "-o", "json")
	if err != nil {
		t.Fatalf("kubectl get pods: %v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// restarts are the restart counts of p's containers, by name.
func (p podInfo) restarts() map[string]int {
	r := map[string]int{}
	for _, c := range p.Status.ContainerStatuses {
		r[c.Name] = c.RestartCount
	}
	return r
}

// podByUID is the pod of selector whose UID is uid, if it is there.
func podByUID(t *testing.T, k *kube.Env, ns, selector, uid string) (podInfo, bool) {
	t.Helper()
	for _, p := range pods(t, k, ns, selector) {
		if p.Metadata.UID == uid {
			return p, true
		}
	}
	return podInfo{}, false
}

// readyAfter is how long a pod took from its creation to Ready.
func (p podInfo) readyAfter() time.Duration {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" && c.Status == "True" {
			return c.LastTransitionTime.Sub(p.Metadata.CreationTimestamp)
		}
	}
	return -1
}

// checkPodsHealthy: every pod of the selector Running and Ready, no
// container restarted; returns the pods.
func checkPodsHealthy(t *testing.T, k *kube.Env, ns, selector string, want int) []podInfo {
	t.Helper()
	ps := pods(t, k, ns, selector)
	if len(ps) != want {
		t.Errorf("%d pods of %s, want %d\n%s", len(ps), selector, want, describePods(k, ns))
	}
	for _, p := range ps {
		if p.Status.Phase != "Running" || p.readyAfter() < 0 {
			t.Errorf("pod %s: phase %s, not Ready", p.Metadata.Name, p.Status.Phase)
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != 0 || !c.Ready {
				t.Errorf("pod %s container %s: ready %v, %d restarts", p.Metadata.Name, c.Name, c.Ready, c.RestartCount)
			}
		}
		t.Logf("pod %s (%s): Ready %.1fs after its creation", p.Metadata.Name, p.Status.PodIP, p.readyAfter().Seconds())
	}
	return ps
}

// runPod runs a backup client as a Pod of its own, with the
// ServiceAccount sa, to its end; returns its log and whether it succeeded.
func runPod(t *testing.T, k *kube.Env, name, sa, image string, args ...string) (string, bool) {
	t.Helper()
	return waitPod(t, k, startPod(t, k, name, sa, image, args...), 3*time.Minute)
}

// startPod creates the client's Pod (restartPolicy Never, non-root, a
// read-only root) and returns its name.
func startPod(t *testing.T, k *kube.Env, name, sa, image string, args ...string) string {
	t.Helper()
	js, _ := json.Marshal(args)
	f := filepath.Join(k.Dir, "pod-"+name+".yaml")
	kube.WriteFile(t, f, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  serviceAccountName: %s
  restartPolicy: Never
  containers:
  - name: client
    image: %s
    imagePullPolicy: Never
    args: %s
    securityContext:
      runAsNonRoot: true
      runAsUser: 65534
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
`, name, kube.NS, sa, image, js))
	k.Kubectl(t, "apply", "-f", f)
	return name
}

// waitPod waits for the client's Pod to end; returns its log and whether
// it succeeded, and deletes it.
func waitPod(t *testing.T, k *kube.Env, name string, d time.Duration) (string, bool) {
	t.Helper()
	t0 := time.Now()
	var phase string
	for time.Since(t0) < d {
		out, _ := k.KubectlQuiet("-n", kube.NS, "get", "pod", name, "-o", "jsonpath={.status.phase}")
		phase = strings.TrimSpace(out)
		if phase == "Succeeded" || phase == "Failed" {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	logs, _ := k.KubectlQuiet("-n", kube.NS, "logs", name)
	t.Logf("pod %s: %s after %.1fs more, %d bytes of log", name, phase, time.Since(t0).Seconds(), len(logs))
	if phase != "Succeeded" && phase != "Failed" {
		t.Fatalf("pod %s did not end in %v (phase %q)\n%s", name, d, phase, describePods(k, kube.NS))
	}
	k.Kubectl(t, "-n", kube.NS, "delete", "pod", name, "--wait=false")
	return logs, phase == "Succeeded"
}

// clientAnswer reads the backup client's JSON lines (e2e/k8s/sidecar/backupclient).
func clientAnswer(t *testing.T, logs string) (csiAnswer, string) {
	t.Helper()
	a := csiAnswer{capacity: -1}
	var typ string
	done := false
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var r struct {
			Offset, Size        int64
			Done                bool
			Tuples              int
			Type                string
			VolumeCapacityBytes int64
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("backup client line %q: %v", l, err)
		}
		if r.Done {
			done, typ, a.capacity = true, r.Type, r.VolumeCapacityBytes
			if r.Tuples != len(a.extents) {
				t.Errorf("backup client counted %d tuples, printed %d", r.Tuples, len(a.extents))
			}
			continue
		}
		a.extents = append(a.extents, harness.Span{Offset: r.Offset, Length: r.Size})
	}
	if !done {
		t.Fatalf("backup client printed no final line:\n%s", harness.Tail(logs, 10))
	}
	return a, typ
}

func TestPods(t *testing.T) {
	t0 := time.Now()
	k := startNode(t)
	image, tag := os.Getenv("RSM_POD_IMAGE"), os.Getenv("RSM_POD_TAG")
	if image == "" || tag == "" {
		t.Fatal("RSM_POD_IMAGE and RSM_POD_TAG are not set (e2e/run-pods.sh sets them)")
	}
	podObjects(t, k)
	r := &podsRun{k: k, image: image, tag: tag}
	r.shortSnapshots(t)

	// ---- The chart, as deploy/README.md installs it: in Ceph-CSI's
	// namespace, whose ConfigMap ceph-csi-config holds the monitors.
	r.installChart(t, t0)
	t.Run("memory-limit", r.memoryLimit)
	r.backupClients(t)
	t.Run("lister", r.lister)
	t.Run("refused-by-sidecar", r.refusedBySidecar)
	t.Run("refused-without-role", r.refusedWithoutRole)
	t.Run("metrics-service", r.metricsService)
	t.Run("both-replicas-serve", r.bothReplicasServe)
	checkPodsHealthy(t, k, podNS, r.sel, 2)

	// ---- Lifecycle: a long Delta, read at a consumer's pace, while the
	// pods are replaced under it.
	r.longSnapshots(t)
	t.Run("rolling-upgrade", r.rollingUpgrade)
	t.Run("pod-deleted", r.podDeleted)

	// ---- Memory, from the kernel (pods_memory_test.go): under stalled
	// readers beside a precise stream, then the server containers' cgroups
	// after every stream above (the long Deltas included).
	t.Run("memory-stalled-readers", func(t *testing.T) { stalledReaders(t, k, r.sel, r.dl1, r.dl2) })
	t.Run("memory-cgroup", r.memoryCgroup)
	// ---- A server killed in its pod, restarted in place by the kubelet
	// beside the old socket (pods_restart_test.go).
	t.Run("restart-in-place", func(t *testing.T) { restartInPlace(t, k, r.sel, r.da1, r.da2) })
	// ---- The certificate renewed by helm upgrade, seen by the running
	// sidecars (pods_cert_test.go).
	t.Run("cert-renewal", func(t *testing.T) { certRenewal(t, k, r.chart, r.sel, r.da1, r.da2) })

	// ---- The standalone kustomize example, as deploy/README.md's Rook
	// route applies it.
	t.Run("kustomize-rook", r.kustomizeRook)
}

// podsRun is what TestPods' steps share: the node, our image, the
// Ceph-CSI snapshots (a1, a2: the short Delta; l1, l2: the long one) and
// their bytes, and the chart's install: its path, its pods' selector, the
// pods it rolled out first and the route disrupt replaces them on.
type podsRun struct {
	k                  *kube.Env
	image, tag         string
	def                *harness.CSICluster
	a1, a2, l1, l2     *harness.CSISnap
	da1, da2, dl1, dl2 []byte
	chart, sel         string
	ps                 []podInfo
	route              podRoute
}

// shortSnapshots: Ceph-CSI volumes and snapshots, and their
// VolumeSnapshots snap-a1 and snap-a2.
func (r *podsRun) shortSnapshots(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	r.def = harness.NewCSICluster(t, conn, harness.ClusterID, "")
	a := r.def.CreateVolume(t, csiVolSize, nil)
	for _, w := range [][2]uint64{{0, 4096}, {5*harness.MiB + 12288, 8192}, {9 * harness.MiB, 64 << 10}, {12 * harness.MiB, harness.ObjSize}, {csiVolSize - 4096, 4096}} {
		a.Write(t, w[0], w[1])
	}
	r.a1 = a.Snapshot(t)
	a.Write(t, 4096, 8192)
	a.Write(t, 9*harness.MiB+1000, 50)
	a.Discard(t, 12*harness.MiB, harness.ObjSize)
	a.Write(t, 28*harness.MiB, 4096)
	r.a2 = a.Snapshot(t)
	r.da1, r.da2 = r.a1.Data(t), r.a2.Data(t)
	r.k.VolumeSnapshot(t, "snap-a1", r.a1.Handle(), int64(len(r.da1)))
	r.k.VolumeSnapshot(t, "snap-a2", r.a2.Handle(), int64(len(r.da2)))
}

// installChart: helm install of the chart with our image rolls out two
// healthy replicas; the test ends here if there are not two.
func (r *podsRun) installChart(t *testing.T, t0 time.Time) {
	k := r.k
	k.Kubectl(t, "create", "namespace", podNS)
	k.Kubectl(t, "-n", podNS, "create", "configmap", "ceph-csi-config",
		"--from-file=config.json="+filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	r.chart = filepath.Join("deploy", "helm", "rbd-snapshot-metadata")
	t1 := time.Now()
	// logLevel 4: a line per request, with its IDs, tells which pod
	// serves a stream.
	k.Helm(t, "install", podRelease, r.chart, "-n", podNS, "--set", "image.repository="+r.image, "--set", "image.tag="+r.tag,
		"--set", "server.logLevel=4")
	took := waitRollout(t, k, podNS, "rbd-snapshot-metadata", 5*time.Minute)
	t.Logf("helm install to both replicas Ready: %.1fs (node up %.1fs before)", took.Seconds(), t1.Sub(t0).Seconds())
	r.sel = "app=rbd-snapshot-metadata" // the chart's selector
	r.ps = checkPodsHealthy(t, k, podNS, r.sel, 2)
	if len(r.ps) != 2 {
		t.FailNow()
	}
}

// memoryLimit: the chart's limits.memory (512Mi) reaches the server
// through the downward API, and Go's limit is 3/4 of it.
func (r *podsRun) memoryLimit(t *testing.T) {
	for _, p := range r.ps {
		log := r.k.Kubectl(t, "-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
		m := regexp.MustCompile(`Go memory limit from the container's[^\n]*`).FindString(log)
		t.Logf("%s: %s", p.Metadata.Name, m)
		if !strings.Contains(m, fmt.Sprintf("goMemoryLimit=%d", 512<<20*3/4)) || !strings.Contains(m, fmt.Sprintf(`memoryLimit="%d"`, 512<<20)) {
			t.Errorf("%s: the server's log does not show the pod's 512Mi limit:\n%s", p.Metadata.Name, harness.Tail(log, 15))
		}
	}
}

// backupClients: backup-client/allocated and backup-client/delta, a
// backup client pod's answers, in variable-length extents, match the
// byte oracle.
func (r *podsRun) backupClients(t *testing.T) {
	type q struct {
		name         string
		args         []string
		before, targ []byte
	}
	for _, c := range []q{
		{"allocated", []string{"-snapshot", "snap-a2", "-namespace", kube.NS}, nil, r.da2},
		{"delta", []string{"-snapshot", "snap-a2", "-prev-snapshot", "snap-a1", "-namespace", kube.NS}, r.da1, r.da2},
	} {
		t.Run("backup-client/"+c.name, func(t *testing.T) {
			logs, ok := runPod(t, r.k, "backup-"+c.name, kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0", c.args...)
			if !ok {
				t.Fatalf("backup client failed:\n%s", harness.Tail(logs, 20))
			}
			got, typ := clientAnswer(t, logs)
			if typ != "VARIABLE_LENGTH" {
				t.Errorf("block metadata type %q, want VARIABLE_LENGTH", typ)
			}
			csiCheckOracle(t, "backup client pod "+c.name, got, c.before, c.targ, 0)
		})
	}
}

// lister: the sidecar's snapshot-metadata-lister in a pod gets the Delta
// the byte oracle has, in records of max-results tuples at most.
func (r *podsRun) lister(t *testing.T) {
	logs, ok := runPod(t, r.k, "lister", kube.BackupSA, "rsm-e2e.local/snapshot-metadata-lister:v1.1.0",
		"-n", kube.NS, "-s", "snap-a2", "-p", "snap-a1", "-o", "json", "-max-results", "3")
	if !ok {
		t.Fatalf("lister failed:\n%s", harness.Tail(logs, 20))
	}
	got := csiAnswer{capacity: -1}
	for _, p := range kube.ParseLister(t, logs) {
		if len(p.Tuples) > 3 {
			t.Errorf("a record of %d tuples, max-results 3", len(p.Tuples))
		}
		got.capacity = p.Capacity
		got.extents = append(got.extents, p.Tuples...)
	}
	csiCheckOracle(t, "lister pod delta", got, r.da1, r.da2, 0)
}

// refusedBySidecar: a client that may read the snapshots but asks for a
// token of a ServiceAccount without the client role: the sidecar's
// TokenReview and SubjectAccessReview refuse that account.
func (r *podsRun) refusedBySidecar(t *testing.T) {
	logs, ok := runPod(t, r.k, "impostor", kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
		"-snapshot", "snap-a2", "-namespace", kube.NS, "-service-account", kube.NoRoleSA)
	if ok {
		t.Fatalf("a token of a ServiceAccount without the client role got an answer:\n%s", harness.Tail(logs, 5))
	}
	if !strings.Contains(logs, "PermissionDenied") {
		t.Errorf("refused, but not by the sidecar's access review (PermissionDenied):\n%s", harness.Tail(logs, 5))
	}
	t.Logf("refused: %s", strings.TrimSpace(harness.Tail(logs, 2)))
}

// refusedWithoutRole: a backup client running as a ServiceAccount
// without the client role is refused for its rights.
func (r *podsRun) refusedWithoutRole(t *testing.T) {
	logs, ok := runPod(t, r.k, "intruder", kube.NoRoleSA, "rsm-e2e.local/backup-client:v1.1.0",
		"-snapshot", "snap-a2", "-namespace", kube.NS)
	if ok {
		t.Fatalf("a ServiceAccount without the client role got an answer:\n%s", harness.Tail(logs, 5))
	}
	if !strings.Contains(logs, "forbidden") && !strings.Contains(logs, "PermissionDenied") && !strings.Contains(logs, "Unauthenticated") {
		t.Errorf("refused, but not for its rights:\n%s", harness.Tail(logs, 5))
	}
	t.Logf("refused: %s", strings.TrimSpace(harness.Tail(logs, 2)))
}

// metricsService: our metrics, through the metrics Service, as a scraper
// inside the cluster reaches it (the API server's service proxy picks an
// endpoint).
func (r *podsRun) metricsService(t *testing.T) {
	out := r.k.Kubectl(t, "get", "--raw", "/api/v1/namespaces/"+podNS+"/services/rbd-snapshot-metadata-metrics:9191/proxy/metrics")
	if !strings.Contains(out, "rbd_snapshot_metadata_") {
		t.Errorf("no rbd_snapshot_metadata_ metric through the Service:\n%s", harness.Tail(out, 10))
	}
}

// bothReplicasServe: backup clients through the Service reach both
// replicas. kube-proxy picks an endpoint per connection at random: 20
// clients miss a replica with probability 2^-19.
func (r *podsRun) bothReplicasServe(t *testing.T) {
	k, ps := r.k, r.ps
	served := map[string]int{}
	for i := 0; i < 20 && (served[ps[0].Metadata.Name] == 0 || served[ps[len(ps)-1].Metadata.Name] == 0); i++ {
		logs, ok := runPod(t, k, fmt.Sprintf("spread-%d", i), kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
			"-snapshot", "snap-a1", "-namespace", kube.NS)
		if !ok {
			t.Fatalf("backup client failed:\n%s", harness.Tail(logs, 20))
		}
		for _, p := range ps {
			log, _ := k.KubectlQuiet("-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
			served[p.Metadata.Name] = strings.Count(log, "GetMetadataAllocated")
		}
	}
	t.Logf("requests per replica: %v", served)
	for _, p := range ps {
		if served[p.Metadata.Name] == 0 {
			t.Errorf("replica %s served nothing", p.Metadata.Name)
		}
	}
}

// longSnapshots: the long Delta's snapshots, snap-l1 and snap-l2, and the
// chart's install as the route whose pods disrupt replaces. 32768
// extents, 1000 tuples a record, so that the stream (about 330 KB)
// outgrows what the gRPC windows of the three hops (ours, the sidecar's,
// the client's) hold in flight.
func (r *podsRun) longSnapshots(t *testing.T) {
	k := r.k
	// One write a 4 KiB block: the byte oracle's unit.
	big := r.def.CreateVolume(t, 128*harness.MiB, nil)
	r.l1 = big.Snapshot(t)
	for o := uint64(0); o < 128*harness.MiB; o += harness.CSIBlock {
		big.Write(t, o, 512)
	}
	r.l2 = big.Snapshot(t)
	r.dl1, r.dl2 = r.l1.Data(t), r.l2.Data(t)
	k.VolumeSnapshot(t, "snap-l1", r.l1.Handle(), int64(len(r.dl1)))
	k.VolumeSnapshot(t, "snap-l2", r.l2.Handle(), int64(len(r.dl2)))
	r.route = podRoute{ns: podNS, deploy: "rbd-snapshot-metadata", sel: r.sel, pre: "snap-", replicas: 2,
		short: [2][]byte{r.da1, r.da2}, long: [2][]byte{r.dl1, r.dl2}}
}

// rollingUpgrade: a helm upgrade within the chart's grace (the server's
// 25 s, the pod's 30 s): 33 records at 0.5 s.
func (r *podsRun) rollingUpgrade(t *testing.T) {
	disrupt(t, r.k, r.route, "upgrade", "500ms", false, true, func(t *testing.T) {
		r.k.Helm(t, "upgrade", podRelease, r.chart, "-n", podNS, "--reuse-values", "--set", "image.tag="+r.tag+"-next")
	})
}

// podDeleted: the stream's pod deleted, past the chart's grace: 33
// records at 2 s, so that the server's grace and then the kubelet's
// SIGKILL end the stream under the client.
func (r *podsRun) podDeleted(t *testing.T) {
	k := r.k
	disrupt(t, k, r.route, "deleted", "2s", true, false, func(t *testing.T) {
		// The pod whose server has the stream.
		var serving []string
		for _, p := range pods(t, k, podNS, r.sel) {
			out, _ := k.KubectlQuiet("-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
			if strings.Contains(out, r.l2.Handle()) {
				serving = append(serving, p.Metadata.Name)
			}
		}
		if len(serving) != 1 {
			t.Fatalf("%d pods logged the stream's request, want 1: %v", len(serving), serving)
		}
		k.Kubectl(t, "-n", podNS, "delete", "pod", serving[0], "--wait=false")
	})
}

// memoryCgroup: every server container's cgroup, after every stream
// above, stayed under its limit.
func (r *podsRun) memoryCgroup(t *testing.T) {
	for _, p := range pods(t, r.k, podNS, r.sel) {
		m := containerMemory(t, r.k, p, "rbd-snapshot-metadata")
		t.Logf("%s: %s", p.Metadata.Name, m)
		m.checkUnderLimit(t, p.Metadata.Name)
	}
}

// kustomizeRook: the standalone kustomize example, as deploy/README.md's
// Rook route applies it: a checkout of deploy/ whose example a user has
// given certificates (gen-certs.sh) and our image, in Rook's namespace
// with Rook's driver name (no Rook here, so no Driver CR to patch), rolls
// out, answers a backup client pod's Delta in full, and keeps it whole or
// retryable across its rolling restart.
func (r *podsRun) kustomizeRook(t *testing.T) {
	k := r.k
	const ns, driver, class = "rook-ceph", "rook-ceph.rbd.csi.ceph.com", "rook-ceph-snapclass"
	src := userCheckout(t, k, "examples/rook/kustomization.yaml", r.image, r.tag)
	example := filepath.Join(src, "deploy", "examples", "rook")
	if out, err := exec.Command(filepath.Join(src, "deploy", "gen-certs.sh"), "-n", ns, filepath.Join(example, "certs")).CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, out)
	}
	k.Kubectl(t, "create", "namespace", ns)
	k.Kubectl(t, "-n", ns, "create", "configmap", "ceph-csi-config",
		"--from-file=config.json="+filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	t0 := time.Now()
	k.Kubectl(t, "apply", "--server-side", "--field-manager=rbd-snapshot-metadata", "-k", example)
	waitRollout(t, k, ns, "rbd-snapshot-metadata", 5*time.Minute)
	t.Logf("kubectl apply -k to both replicas Ready: %.1fs", time.Since(t0).Seconds())
	checkPodsHealthy(t, k, ns, r.sel, 2)

	f := filepath.Join(k.Dir, "rook-class.yaml")
	kube.WriteFile(t, f, kube.SnapshotClass(class, driver))
	k.Kubectl(t, "apply", "-f", f)
	for n, v := range map[string]struct {
		h string
		d []byte
	}{"a1": {r.a1.Handle(), r.da1}, "a2": {r.a2.Handle(), r.da2}, "l1": {r.l1.Handle(), r.dl1}, "l2": {r.l2.Handle(), r.dl2}} {
		k.VolumeSnapshotOf(t, driver, class, "rook-"+n, v.h, int64(len(v.d)))
	}
	k.Kubectl(t, "create", "clusterrolebinding", "backup-app-rook-snapshot-metadata",
		"--clusterrole=rbd-snapshot-metadata:"+ns+":client", "--serviceaccount="+kube.NS+":"+kube.BackupSA)

	clientDeltaMatches(t, k, "rook-delta", "rook-", "kustomize route: backup client pod delta", r.da1, r.da2)

	// The kustomize routes' rolling restart, during a long Delta.
	rook := r.route
	rook.ns, rook.pre = ns, "rook-"
	disrupt(t, k, rook, "restart", "500ms", false, true, func(t *testing.T) {
		k.Kubectl(t, "-n", ns, "rollout", "restart", "deploy/rbd-snapshot-metadata")
	})
}

// clientDeltaMatches runs a backup client pod for the Delta between the
// VolumeSnapshots PRE+"a1" and PRE+"a2" of kube.NS and checks its answer
// against the byte oracle.
func clientDeltaMatches(t *testing.T, k *kube.Env, name, pre, what string, da1, da2 []byte) {
	t.Helper()
	logs, ok := runPod(t, k, name, kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
		"-snapshot", pre+"a2", "-prev-snapshot", pre+"a1", "-namespace", kube.NS)
	if !ok {
		t.Fatalf("%s: backup client failed:\n%s", what, harness.Tail(logs, 20))
	}
	got, _ := clientAnswer(t, logs)
	csiCheckOracle(t, what, got, da1, da2, 0)
}

// userCheckout copies deploy/ to a checkout of the test's, as a user's of
// the repository, and sets our image there in the kustomization file kz
// (relative to deploy/), as deploy/README.md tells a user to; returns the
// checkout's folder (holding deploy/).
func userCheckout(t *testing.T, k *kube.Env, kz, image, tag string) string {
	t.Helper()
	src := filepath.Join(k.Dir, "checkout")
	if err := os.CopyFS(filepath.Join(src, "deploy"), os.DirFS("deploy")); err != nil {
		t.Fatal(err)
	}
	kz = filepath.Join(src, "deploy", kz)
	b, err := os.ReadFile(kz)
	if err != nil {
		t.Fatal(err)
	}
	const was = "newName: registry.example.com/rbd-snapshot-metadata\n    newTag: v0.1.0"
	if !strings.Contains(string(b), was) {
		t.Fatalf("%s sets the image otherwise than %q", kz, was)
	}
	// Quoted: a tag of digits alone (a commit hash such as 4543157) is a
	// number in YAML, which kustomize refuses ("cannot unmarshal number
	// into Go struct field Image.images.newTag of type string").
	kube.WriteFile(t, kz, strings.Replace(string(b), was, "newName: "+image+"\n    newTag: \""+tag+"\"", 1))
	return src
}

// podRoute is an install of ours whose pods disrupt replaces: its
// namespace, Deployment, pod selector and replicas, the prefix of its
// VolumeSnapshots (<pre>a1, a2: a short Delta; l1, l2: the long one) and
// those snapshots' bytes.
type podRoute struct {
	ns, deploy, sel, pre string
	replicas             int
	short, long          [2][]byte
}

// disrupt runs the long Delta at delay a record (33 records), calls
// during once it is under way, and checks what the client got: with cut,
// an error a backup tool retries (the fault outlasts the grace), else the
// whole answer or such an error; with allNew, that the next request is
// served by a pod that was not there.
func disrupt(t *testing.T, k *kube.Env, r podRoute, name, delay string, cut, allNew bool, during func(t *testing.T)) {
	t.Helper()
	before := podNames(pods(t, k, r.ns, r.sel))
	pod := startPod(t, k, name, kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0", "-snapshot", r.pre+"l2",
		"-prev-snapshot", r.pre+"l1", "-namespace", kube.NS, "-max-results", "1000", "-record-delay", delay)
	// Mid-stream: once the first records have arrived.
	harness.WaitFor(t, name+"'s first records", 2*time.Minute, func() bool {
		out, _ := k.KubectlQuiet("-n", kube.NS, "logs", pod)
		return strings.Count(out, "\n") >= 2000
	})
	during(t)
	logs, ok := waitPod(t, k, pod, 5*time.Minute)
	if ok && cut {
		t.Errorf("%s: the stream ended OK although its pod went away 2000 tuples into it: the buffers held it all, so this did not test a cut stream; make it longer", name)
	}
	if ok {
		got, _ := clientAnswer(t, logs)
		csiCheckOracle(t, name+": the stream across the replacement", got, r.long[0], r.long[1], 0)
		t.Logf("%s: the stream ended OK with all %d tuples", name, len(got.extents))
	} else {
		last := lastLine(logs)
		if !regexp.MustCompile(`Unavailable|Aborted|Canceled|DeadlineExceeded|EOF|connection`).MatchString(last) {
			t.Errorf("%s: the stream failed with what a backup tool would not retry: %s", name, last)
		}
		t.Logf("%s: the stream ended with a retryable error: %s", name, last)
	}
	waitRollout(t, k, r.ns, r.deploy, 5*time.Minute)
	// The replaced pods gone (their grace is 30 s), r.replicas Ready ones left.
	harness.WaitFor(t, "the replaced pods gone", 2*time.Minute, func() bool {
		ps := pods(t, k, r.ns, r.sel)
		ready := 0
		for _, p := range ps {
			if p.readyAfter() >= 0 {
				ready++
			}
		}
		return len(ps) == r.replicas && ready == r.replicas
	})
	after := checkPodsHealthy(t, k, r.ns, r.sel, r.replicas)
	// The next request: answered in full by a pod that was not there.
	logs, ok = runPod(t, k, name+"-next", kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
		"-snapshot", r.pre+"a2", "-prev-snapshot", r.pre+"a1", "-namespace", kube.NS)
	if !ok {
		t.Fatalf("%s: the next request failed:\n%s", name, harness.Tail(logs, 10))
	}
	got, _ := clientAnswer(t, logs)
	csiCheckOracle(t, name+": the next request", got, r.short[0], r.short[1], 0)
	var fresh []string
	for _, p := range after {
		if !before[p.Metadata.Name] {
			fresh = append(fresh, p.Metadata.Name)
		}
	}
	if len(fresh) == 0 {
		t.Errorf("%s: no new pod (before %v)", name, before)
	}
	if !allNew {
		return
	}
	served := false
	for n := range podNames(after) {
		if out, _ := k.KubectlQuiet("-n", r.ns, "logs", n, "-c", "rbd-snapshot-metadata"); strings.Contains(out, "GetMetadataDelta") {
			served = served || !before[n]
		}
	}
	if !served {
		t.Errorf("%s: no new pod (%v) served the next request", name, fresh)
	}
}

func podNames(ps []podInfo) map[string]bool {
	m := map[string]bool{}
	for _, p := range ps {
		m[p.Metadata.Name] = true
	}
	return m
}

// TestPodsHold is ./dev.sh node: the node with the images imported, held
// up until SIGINT or SIGTERM (Ctrl-C); then it comes down. Only with
// RSM_NODE_HOLD set.
func TestPodsHold(t *testing.T) {
	if os.Getenv("RSM_NODE_HOLD") == "" {
		t.Skip("./dev.sh node (RSM_NODE_HOLD) only")
	}
	k := startNode(t)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Printf(`
The node is up (logs: %s/logs). In another shell, enter its network namespace:
  nsenter --net=/proc/%d/ns/net -- %s/e2e/in-rootfs.sh -b %s -b %s -w %s bash
  export KUBECONFIG=%s/kubeconfig PATH=%s:$PATH
Our image is %s:%s. Ctrl-C here brings it all down.
`, k.Dir, os.Getpid(), mustGetwd(t), k.Dir, k.Bin, mustGetwd(t), k.Dir, k.Bin, os.Getenv("RSM_POD_IMAGE"), os.Getenv("RSM_POD_TAG"))
	<-ctx.Done()
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	d, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return d
}
