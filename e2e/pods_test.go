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
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

const (
	podNS      = "ceph-csi-rbd" // the chart's release namespace: Ceph-CSI's
	podRelease = "rsm"
)

// startNode brings the node up (node.sh up) in a folder of the test and
// returns an admin client of its API server; node.sh down when the test
// ends, with the logs' tails if it failed.
func startNode(t *testing.T) *k8sEnv {
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
	k := &k8sEnv{bin: k8sBin(t), dir: dir, api: "https://" + os.Getenv("RSM_NODE_IP") + ":6443",
		crt: &k8sPKI{dir: filepath.Join(dir, "pki")}}
	admin, err := tls.LoadX509KeyPair(k.crt.path("admin.crt"), k.crt.path("admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(k.crt.path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	k.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{admin}}}}
	return k
}

// podObjects: what the backup side of a cluster has: the namespace of the
// VolumeSnapshots, Ceph-CSI's snapshotter Secret and VolumeSnapshotClass,
// a backup application's ServiceAccount bound to the chart's client role,
// and one without it.
func (k *k8sEnv) podObjects(t *testing.T) {
	t.Helper()
	k.kubectl(t, "create", "namespace", k8sNS)
	k.kubectl(t, "-n", k8sNS, "create", "secret", "generic", k8sSecret,
		"--from-literal=userID="+harness.ClusterEnv(t, "CEPH_CSI_USER"),
		"--from-literal=userKey="+harness.ClusterEnv(t, "CEPH_CSI_KEY"))
	f := filepath.Join(k.dir, "class.yaml")
	writeFile(t, f, snapshotClass(k8sClass, k8sDriver))
	k.kubectl(t, "apply", "-f", f)
	k.kubectl(t, "-n", k8sNS, "create", "serviceaccount", k8sBackupSA)
	k.kubectl(t, "-n", k8sNS, "create", "serviceaccount", k8sNoRoleSA)
	// As the chart's rbac.yaml tells backup applications to.
	k.kubectl(t, "create", "clusterrolebinding", "backup-app-snapshot-metadata",
		"--clusterrole=rbd-snapshot-metadata:"+podNS+":client", "--serviceaccount="+k8sNS+":"+k8sBackupSA)
}

// waitRollout waits for a Deployment's rollout and returns how long it took.
func (k *k8sEnv) waitRollout(t *testing.T, ns, deploy string, d time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	if out, err := k.kubectlErr(t, "-n", ns, "rollout", "status", "deploy/"+deploy, "--timeout="+d.String()); err != nil {
		t.Fatalf("rollout of %s/%s: %v\n%s\n%s", ns, deploy, err, out, k.describePods(ns))
	}
	return time.Since(t0)
}

func (k *k8sEnv) describePods(ns string) string {
	out, _ := k.kubectlQuiet("-n", ns, "get", "pods,events", "-o", "wide")
	return out
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
		ContainerStatuses []struct {
			Name         string
			Ready        bool
			RestartCount int
			ContainerID  string
		}
	}
}

func (k *k8sEnv) pods(t *testing.T, ns, selector string) []podInfo {
	t.Helper()
	var l struct{ Items []podInfo }
	out, err := k.kubectlQuiet("-n", ns, "get", "pods", "-l", selector, "-o", "json")
	if err != nil {
		t.Fatalf("kubectl get pods: %v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	return l.Items
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
func (k *k8sEnv) checkPodsHealthy(t *testing.T, ns, selector string, want int) []podInfo {
	t.Helper()
	ps := k.pods(t, ns, selector)
	if len(ps) != want {
		t.Errorf("%d pods of %s, want %d\n%s", len(ps), selector, want, k.describePods(ns))
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
func (k *k8sEnv) runPod(t *testing.T, name, sa, image string, args ...string) (string, bool) {
	t.Helper()
	return k.waitPod(t, k.startPod(t, name, sa, image, args...), 3*time.Minute)
}

// startPod creates the client's Pod (restartPolicy Never, non-root, a
// read-only root) and returns its name.
func (k *k8sEnv) startPod(t *testing.T, name, sa, image string, args ...string) string {
	t.Helper()
	js, _ := json.Marshal(args)
	f := filepath.Join(k.dir, "pod-"+name+".yaml")
	writeFile(t, f, fmt.Sprintf(`apiVersion: v1
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
`, name, k8sNS, sa, image, js))
	k.kubectl(t, "apply", "-f", f)
	return name
}

// waitPod waits for the client's Pod to end; returns its log and whether
// it succeeded, and deletes it.
func (k *k8sEnv) waitPod(t *testing.T, name string, d time.Duration) (string, bool) {
	t.Helper()
	t0 := time.Now()
	var phase string
	for time.Since(t0) < d {
		out, _ := k.kubectlQuiet("-n", k8sNS, "get", "pod", name, "-o", "jsonpath={.status.phase}")
		phase = strings.TrimSpace(out)
		if phase == "Succeeded" || phase == "Failed" {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	logs, _ := k.kubectlQuiet("-n", k8sNS, "logs", name)
	t.Logf("pod %s: %s after %.1fs more, %d bytes of log", name, phase, time.Since(t0).Seconds(), len(logs))
	if phase != "Succeeded" && phase != "Failed" {
		t.Fatalf("pod %s did not end in %v (phase %q)\n%s", name, d, phase, k.describePods(k8sNS))
	}
	k.kubectl(t, "-n", k8sNS, "delete", "pod", name, "--wait=false")
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
	k.podObjects(t)

	// Ceph-CSI volumes and snapshots, and their VolumeSnapshots.
	conn := harness.ConnectAdmin(t)
	def := harness.NewCSICluster(t, conn, harness.ClusterID, "")
	a := def.CreateVolume(t, csiVolSize, nil)
	for _, w := range [][2]uint64{{0, 4096}, {5*harness.MiB + 12288, 8192}, {9 * harness.MiB, 64 << 10}, {12 * harness.MiB, harness.ObjSize}, {csiVolSize - 4096, 4096}} {
		a.Write(t, w[0], w[1])
	}
	a1 := a.Snapshot(t)
	a.Write(t, 4096, 8192)
	a.Write(t, 9*harness.MiB+1000, 50)
	a.Discard(t, 12*harness.MiB, harness.ObjSize)
	a.Write(t, 28*harness.MiB, 4096)
	a2 := a.Snapshot(t)
	da1, da2 := a1.Data(t), a2.Data(t)
	k.volumeSnapshot(t, "snap-a1", a1.Handle(), int64(len(da1)))
	k.volumeSnapshot(t, "snap-a2", a2.Handle(), int64(len(da2)))

	// ---- The chart, as deploy/README.md installs it: in Ceph-CSI's
	// namespace, whose ConfigMap ceph-csi-config holds the monitors.
	k.kubectl(t, "create", "namespace", podNS)
	k.kubectl(t, "-n", podNS, "create", "configmap", "ceph-csi-config",
		"--from-file=config.json="+filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	chart := filepath.Join("deploy", "helm", "rbd-snapshot-metadata")
	t1 := time.Now()
	// logLevel 4: a line per request, with its IDs, tells which pod
	// serves a stream.
	k.helm(t, "install", podRelease, chart, "-n", podNS, "--set", "image.repository="+image, "--set", "image.tag="+tag,
		"--set", "server.logLevel=4")
	took := k.waitRollout(t, podNS, "rbd-snapshot-metadata", 5*time.Minute)
	t.Logf("helm install to both replicas Ready: %.1fs (node up %.1fs before)", took.Seconds(), t1.Sub(t0).Seconds())
	sel := "app=rbd-snapshot-metadata" // the chart's selector
	ps := k.checkPodsHealthy(t, podNS, sel, 2)
	if len(ps) != 2 {
		t.FailNow()
	}

	t.Run("memory-limit", func(t *testing.T) {
		// The chart's limits.memory (512Mi) reaches the server through the
		// downward API, and Go's limit is 3/4 of it.
		for _, p := range ps {
			log := k.kubectl(t, "-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
			m := regexp.MustCompile(`Go memory limit from the container's[^\n]*`).FindString(log)
			t.Logf("%s: %s", p.Metadata.Name, m)
			if !strings.Contains(m, fmt.Sprintf("goMemoryLimit=%d", 512<<20*3/4)) || !strings.Contains(m, fmt.Sprintf(`memoryLimit="%d"`, 512<<20)) {
				t.Errorf("%s: the server's log does not show the pod's 512Mi limit:\n%s", p.Metadata.Name, harness.Tail(log, 15))
			}
		}
	})

	type q struct {
		name         string
		args         []string
		before, targ []byte
	}
	for _, c := range []q{
		{"allocated", []string{"-snapshot", "snap-a2", "-namespace", k8sNS}, nil, da2},
		{"delta", []string{"-snapshot", "snap-a2", "-prev-snapshot", "snap-a1", "-namespace", k8sNS}, da1, da2},
	} {
		t.Run("backup-client/"+c.name, func(t *testing.T) {
			logs, ok := k.runPod(t, "backup-"+c.name, k8sBackupSA, "rsm-e2e.local/backup-client:v1.1.0", c.args...)
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
	t.Run("lister", func(t *testing.T) {
		logs, ok := k.runPod(t, "lister", k8sBackupSA, "rsm-e2e.local/snapshot-metadata-lister:v1.1.0",
			"-n", k8sNS, "-s", "snap-a2", "-p", "snap-a1", "-o", "json", "-max-results", "3")
		if !ok {
			t.Fatalf("lister failed:\n%s", harness.Tail(logs, 20))
		}
		got := csiAnswer{capacity: -1}
		for _, p := range parseLister(t, logs) {
			if len(p.tuples) > 3 {
				t.Errorf("a record of %d tuples, max-results 3", len(p.tuples))
			}
			got.capacity = p.capacity
			got.extents = append(got.extents, p.tuples...)
		}
		csiCheckOracle(t, "lister pod delta", got, da1, da2, 0)
	})
	t.Run("refused-by-sidecar", func(t *testing.T) {
		// A client that may read the snapshots but asks for a token of a
		// ServiceAccount without the client role: the sidecar's
		// TokenReview and SubjectAccessReview refuse that account.
		logs, ok := k.runPod(t, "impostor", k8sBackupSA, "rsm-e2e.local/backup-client:v1.1.0",
			"-snapshot", "snap-a2", "-namespace", k8sNS, "-service-account", k8sNoRoleSA)
		if ok {
			t.Fatalf("a token of a ServiceAccount without the client role got an answer:\n%s", harness.Tail(logs, 5))
		}
		if !strings.Contains(logs, "PermissionDenied") {
			t.Errorf("refused, but not by the sidecar's access review (PermissionDenied):\n%s", harness.Tail(logs, 5))
		}
		t.Logf("refused: %s", strings.TrimSpace(harness.Tail(logs, 2)))
	})
	t.Run("refused-without-role", func(t *testing.T) {
		logs, ok := k.runPod(t, "intruder", k8sNoRoleSA, "rsm-e2e.local/backup-client:v1.1.0",
			"-snapshot", "snap-a2", "-namespace", k8sNS)
		if ok {
			t.Fatalf("a ServiceAccount without the client role got an answer:\n%s", harness.Tail(logs, 5))
		}
		if !strings.Contains(logs, "forbidden") && !strings.Contains(logs, "PermissionDenied") && !strings.Contains(logs, "Unauthenticated") {
			t.Errorf("refused, but not for its rights:\n%s", harness.Tail(logs, 5))
		}
		t.Logf("refused: %s", strings.TrimSpace(harness.Tail(logs, 2)))
	})
	t.Run("metrics-service", func(t *testing.T) {
		// Through the metrics Service, as a scraper inside the cluster
		// reaches it (the API server's service proxy picks an endpoint).
		out := k.kubectl(t, "get", "--raw", "/api/v1/namespaces/"+podNS+"/services/rbd-snapshot-metadata-metrics:9191/proxy/metrics")
		if !strings.Contains(out, "rbd_snapshot_metadata_") {
			t.Errorf("no rbd_snapshot_metadata_ metric through the Service:\n%s", harness.Tail(out, 10))
		}
	})
	t.Run("both-replicas-serve", func(t *testing.T) {
		// kube-proxy picks an endpoint per connection at random: 20
		// clients miss a replica with probability 2^-19.
		served := map[string]int{}
		for i := 0; i < 20 && (served[ps[0].Metadata.Name] == 0 || served[ps[len(ps)-1].Metadata.Name] == 0); i++ {
			logs, ok := k.runPod(t, fmt.Sprintf("spread-%d", i), k8sBackupSA, "rsm-e2e.local/backup-client:v1.1.0",
				"-snapshot", "snap-a1", "-namespace", k8sNS)
			if !ok {
				t.Fatalf("backup client failed:\n%s", harness.Tail(logs, 20))
			}
			for _, p := range ps {
				log, _ := k.kubectlQuiet("-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
				served[p.Metadata.Name] = strings.Count(log, "GetMetadataAllocated")
			}
		}
		t.Logf("requests per replica: %v", served)
		for _, p := range ps {
			if served[p.Metadata.Name] == 0 {
				t.Errorf("replica %s served nothing", p.Metadata.Name)
			}
		}
	})
	k.checkPodsHealthy(t, podNS, sel, 2)

	// ---- Lifecycle: a long Delta, read at a consumer's pace, while the
	// pods are replaced under it: 32768 extents, 1000 tuples a record, so
	// that the stream (about 330 KB) outgrows what the gRPC windows of the
	// three hops (ours, the sidecar's, the client's) hold in flight.
	// One write a 4 KiB block: the byte oracle's unit.
	big := def.CreateVolume(t, 128*harness.MiB, nil)
	l1 := big.Snapshot(t)
	for o := uint64(0); o < 128*harness.MiB; o += harness.CSIBlock {
		big.Write(t, o, 512)
	}
	l2 := big.Snapshot(t)
	dl1, dl2 := l1.Data(t), l2.Data(t)
	k.volumeSnapshot(t, "snap-l1", l1.Handle(), int64(len(dl1)))
	k.volumeSnapshot(t, "snap-l2", l2.Handle(), int64(len(dl2)))
	chartRoute := podRoute{ns: podNS, deploy: "rbd-snapshot-metadata", sel: sel, pre: "snap-", replicas: 2,
		short: [2][]byte{da1, da2}, long: [2][]byte{dl1, dl2}}
	// Within the chart's grace (the server's 25 s, the pod's 30 s): 33
	// records at 0.5 s.
	t.Run("rolling-upgrade", func(t *testing.T) {
		k.disrupt(t, chartRoute, "upgrade", "500ms", false, true, func(t *testing.T) {
			k.helm(t, "upgrade", podRelease, chart, "-n", podNS, "--reuse-values", "--set", "image.tag="+tag+"-next")
		})
	})
	// Past it: 33 records at 2 s, so that the server's grace and then the
	// kubelet's SIGKILL end the stream under the client.
	t.Run("pod-deleted", func(t *testing.T) {
		k.disrupt(t, chartRoute, "deleted", "2s", true, false, func(t *testing.T) {
			// The pod whose server has the stream.
			var serving []string
			for _, p := range k.pods(t, podNS, sel) {
				out, _ := k.kubectlQuiet("-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
				if strings.Contains(out, l2.Handle()) {
					serving = append(serving, p.Metadata.Name)
				}
			}
			if len(serving) != 1 {
				t.Fatalf("%d pods logged the stream's request, want 1: %v", len(serving), serving)
			}
			k.kubectl(t, "-n", podNS, "delete", "pod", serving[0], "--wait=false")
		})
	})

	// ---- Memory, from the kernel: the server containers' cgroups after
	// every stream above (the long Deltas included).
	t.Run("memory-cgroup", func(t *testing.T) {
		cg, err := os.ReadFile(filepath.Join(k.dir, "cgroup"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range k.pods(t, podNS, sel) {
			for _, c := range p.Status.ContainerStatuses {
				if c.Name != "rbd-snapshot-metadata" {
					continue
				}
				if c.RestartCount != 0 {
					t.Errorf("%s: %d restarts", p.Metadata.Name, c.RestartCount)
				}
				id := strings.TrimPrefix(c.ContainerID, "containerd://")
				dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", strings.TrimSpace(string(cg)), "kubepods*", "*pod"+p.Metadata.UID, id))
				more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", strings.TrimSpace(string(cg)), "kubepods*", "*", "*pod"+p.Metadata.UID, id))
				dirs = append(dirs, more...)
				if len(dirs) != 1 {
					t.Fatalf("%s: the container's memory cgroup: found %v", p.Metadata.Name, dirs)
				}
				read := func(f string) int64 {
					b, err := os.ReadFile(filepath.Join(dirs[0], f))
					if err != nil {
						t.Fatal(err)
					}
					n, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
					if err != nil {
						t.Fatal(err)
					}
					return n
				}
				limit, peak := read("memory.limit_in_bytes"), read("memory.max_usage_in_bytes")
				oom, _ := os.ReadFile(filepath.Join(dirs[0], "memory.oom_control"))
				t.Logf("%s: cgroup limit %d MiB, peak usage %.1f MiB; %s", p.Metadata.Name, limit>>20, float64(peak)/(1<<20),
					strings.ReplaceAll(strings.TrimSpace(string(oom)), "\n", ", "))
				if limit != 512<<20 {
					t.Errorf("%s: the cgroup's limit is %d, want the chart's 512Mi", p.Metadata.Name, limit)
				}
				if peak >= limit {
					t.Errorf("%s: peak %d reached the limit %d", p.Metadata.Name, peak, limit)
				}
				if !strings.Contains(string(oom), "oom_kill 0") {
					t.Errorf("%s: the kernel OOM-killed in the container: %s", p.Metadata.Name, oom)
				}
			}
		}
	})

	// ---- The standalone kustomize example, as deploy/README.md's Rook
	// route applies it: a checkout of deploy/ whose example a user has
	// given certificates (gen-certs.sh) and our image, in Rook's namespace
	// with Rook's driver name. (No Rook here, so no Driver CR to patch.)
	t.Run("kustomize-rook", func(t *testing.T) {
		const ns, driver, class = "rook-ceph", "rook-ceph.rbd.csi.ceph.com", "rook-ceph-snapclass"
		src := filepath.Join(k.dir, "checkout")
		if err := os.CopyFS(filepath.Join(src, "deploy"), os.DirFS("deploy")); err != nil {
			t.Fatal(err)
		}
		example := filepath.Join(src, "deploy", "examples", "rook")
		if out, err := exec.Command(filepath.Join(src, "deploy", "gen-certs.sh"), "-n", ns, filepath.Join(example, "certs")).CombinedOutput(); err != nil {
			t.Fatalf("gen-certs.sh: %v\n%s", err, out)
		}
		kz := filepath.Join(example, "kustomization.yaml")
		b, err := os.ReadFile(kz)
		if err != nil {
			t.Fatal(err)
		}
		const was = "newName: registry.example.com/rbd-snapshot-metadata\n    newTag: v0.1.0"
		if !strings.Contains(string(b), was) {
			t.Fatalf("%s sets the image otherwise than %q", kz, was)
		}
		writeFile(t, kz, strings.Replace(string(b), was, "newName: "+image+"\n    newTag: "+tag, 1))
		k.kubectl(t, "create", "namespace", ns)
		k.kubectl(t, "-n", ns, "create", "configmap", "ceph-csi-config",
			"--from-file=config.json="+filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
		t0 := time.Now()
		k.kubectl(t, "apply", "--server-side", "--field-manager=rbd-snapshot-metadata", "-k", example)
		k.waitRollout(t, ns, "rbd-snapshot-metadata", 5*time.Minute)
		t.Logf("kubectl apply -k to both replicas Ready: %.1fs", time.Since(t0).Seconds())
		k.checkPodsHealthy(t, ns, sel, 2)

		f := filepath.Join(k.dir, "rook-class.yaml")
		writeFile(t, f, snapshotClass(class, driver))
		k.kubectl(t, "apply", "-f", f)
		for n, v := range map[string]struct {
			h string
			d []byte
		}{"a1": {a1.Handle(), da1}, "a2": {a2.Handle(), da2}, "l1": {l1.Handle(), dl1}, "l2": {l2.Handle(), dl2}} {
			k.volumeSnapshotOf(t, driver, class, "rook-"+n, v.h, int64(len(v.d)))
		}
		k.kubectl(t, "create", "clusterrolebinding", "backup-app-rook-snapshot-metadata",
			"--clusterrole=rbd-snapshot-metadata:"+ns+":client", "--serviceaccount="+k8sNS+":"+k8sBackupSA)

		logs, ok := k.runPod(t, "rook-delta", k8sBackupSA, "rsm-e2e.local/backup-client:v1.1.0",
			"-snapshot", "rook-a2", "-prev-snapshot", "rook-a1", "-namespace", k8sNS)
		if !ok {
			t.Fatalf("backup client failed:\n%s", harness.Tail(logs, 20))
		}
		got, _ := clientAnswer(t, logs)
		csiCheckOracle(t, "kustomize route: backup client pod delta", got, da1, da2, 0)

		// The kustomize routes' rolling restart, during a long Delta.
		rook := chartRoute
		rook.ns, rook.pre = ns, "rook-"
		k.disrupt(t, rook, "restart", "500ms", false, true, func(t *testing.T) {
			k.kubectl(t, "-n", ns, "rollout", "restart", "deploy/rbd-snapshot-metadata")
		})
	})
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
func (k *k8sEnv) disrupt(t *testing.T, r podRoute, name, delay string, cut, allNew bool, during func(t *testing.T)) {
	t.Helper()
	before := podNames(k.pods(t, r.ns, r.sel))
	pod := k.startPod(t, name, k8sBackupSA, "rsm-e2e.local/backup-client:v1.1.0", "-snapshot", r.pre+"l2",
		"-prev-snapshot", r.pre+"l1", "-namespace", k8sNS, "-max-results", "1000", "-record-delay", delay)
	// Mid-stream: once the first records have arrived.
	waitFor(t, name+"'s first records", 2*time.Minute, func() bool {
		out, _ := k.kubectlQuiet("-n", k8sNS, "logs", pod)
		return strings.Count(out, "\n") >= 2000
	})
	during(t)
	logs, ok := k.waitPod(t, pod, 5*time.Minute)
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
	k.waitRollout(t, r.ns, r.deploy, 5*time.Minute)
	// The replaced pods gone (their grace is 30 s), r.replicas Ready ones left.
	waitFor(t, "the replaced pods gone", 2*time.Minute, func() bool {
		ps := k.pods(t, r.ns, r.sel)
		ready := 0
		for _, p := range ps {
			if p.readyAfter() >= 0 {
				ready++
			}
		}
		return len(ps) == r.replicas && ready == r.replicas
	})
	after := k.checkPodsHealthy(t, r.ns, r.sel, r.replicas)
	// The next request: answered in full by a pod that was not there.
	logs, ok = k.runPod(t, name+"-next", k8sBackupSA, "rsm-e2e.local/backup-client:v1.1.0",
		"-snapshot", r.pre+"a2", "-prev-snapshot", r.pre+"a1", "-namespace", k8sNS)
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
		if out, _ := k.kubectlQuiet("-n", r.ns, "logs", n, "-c", "rbd-snapshot-metadata"); strings.Contains(out, "GetMetadataDelta") {
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
`, k.dir, os.Getpid(), mustGetwd(t), k.dir, k.bin, mustGetwd(t), k.dir, k.bin, os.Getenv("RSM_POD_IMAGE"), os.Getenv("RSM_POD_TAG"))
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
