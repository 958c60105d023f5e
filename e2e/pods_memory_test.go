//go:build e2e

package e2e

// The server's memory in its pod, as the kernel counts it: the container's
// memory cgroup (v1) on the node, under stalled readers that hold as many
// streams as --max-streams lets a precise stream beside them
// (TestPods/memory-stalled-readers), and after everything
// (TestPods/memory-cgroup).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

// podServerMemLimit is the chart's limits.memory for the server container.
const podServerMemLimit = 512 << 20

// cgroupMemory is what the kernel counts of a container's memory.
type cgroupMemory struct {
	limit, usage, peak int64  // memory.limit_in_bytes, usage_in_bytes, max_usage_in_bytes
	oom                string // memory.oom_control, on one line
}

func (m cgroupMemory) String() string {
	return fmt.Sprintf("limit %d MiB, usage %.1f MiB, peak %.1f MiB; %s",
		m.limit>>20, float64(m.usage)/(1<<20), float64(m.peak)/(1<<20), m.oom)
}

// containerCgroup is the cgroup (v1) folder of p's container named name in
// the hierarchy ctl (memory, pids, ...) under the node's cgroupRoot, and
// that container's status; it fails t if there is none.
func containerCgroup(t *testing.T, k *kube.Env, p podInfo, name, ctl string) (string, containerStatus) {
	t.Helper()
	root, err := os.ReadFile(filepath.Join(k.Dir, "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name != name {
			continue
		}
		id := strings.TrimPrefix(c.ContainerID, "containerd://")
		base := filepath.Join("/sys/fs/cgroup", ctl, strings.TrimSpace(string(root)))
		dirs, _ := filepath.Glob(filepath.Join(base, "kubepods*", "*pod"+p.Metadata.UID, id))
		more, _ := filepath.Glob(filepath.Join(base, "kubepods*", "*", "*pod"+p.Metadata.UID, id))
		if dirs = append(dirs, more...); len(dirs) != 1 {
			t.Fatalf("%s: the container's %s cgroup: found %v", p.Metadata.Name, ctl, dirs)
		}
		return dirs[0], c
	}
	t.Fatalf("%s: no container %s", p.Metadata.Name, name)
	return "", containerStatus{}
}

// containerMemory reads the memory cgroup of p's container named name,
// and fails t if the container restarted.
func containerMemory(t *testing.T, k *kube.Env, p podInfo, name string) cgroupMemory {
	t.Helper()
	dir, c := containerCgroup(t, k, p, name, "memory")
	if c.RestartCount != 0 {
		t.Errorf("%s: %d restarts", p.Metadata.Name, c.RestartCount)
	}
	read := func(f string) int64 {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	oom, _ := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	return cgroupMemory{read("memory.limit_in_bytes"), read("memory.usage_in_bytes"), read("memory.max_usage_in_bytes"),
		strings.ReplaceAll(strings.TrimSpace(string(oom)), "\n", ", ")}
}

// checkUnderLimit: the chart's limit in the cgroup, a peak below it, and
// no OOM kill.
func (m cgroupMemory) checkUnderLimit(t *testing.T, pod string) {
	t.Helper()
	if m.limit != podServerMemLimit {
		t.Errorf("%s: the cgroup's limit is %d, want the chart's 512Mi", pod, m.limit)
	}
	if m.peak >= m.limit {
		t.Errorf("%s: peak %d reached the limit %d", pod, m.peak, m.limit)
	}
	if !strings.Contains(m.oom, "oom_kill 0") {
		t.Errorf("%s: the kernel OOM-killed in the container: %s", pod, m.oom)
	}
}

// streamsInFlight is the server's rbd_snapshot_metadata_streams_in_flight,
// summed over its methods, scraped through the metrics Service (of the one
// replica left).
func streamsInFlight(t *testing.T, k *kube.Env) int {
	t.Helper()
	out := k.Kubectl(t, "get", "--raw", "/api/v1/namespaces/"+podNS+"/services/rbd-snapshot-metadata-metrics:9191/proxy/metrics")
	n, found := 0, false
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || !strings.HasPrefix(f[0], "rbd_snapshot_metadata_streams_in_flight") {
			continue
		}
		if name, _, _ := strings.Cut(f[0], "{"); name != "rbd_snapshot_metadata_streams_in_flight" {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		n, found = n+int(v), true
	}
	if !found {
		t.Fatalf("no rbd_snapshot_metadata_streams_in_flight in the metrics:\n%s", harness.Tail(out, 10))
	}
	return n
}

// finishedDeltas counts the GetMetadataDelta streams p's server logged as
// finished (the chart's logLevel 4 logs each).
func finishedDeltas(t *testing.T, k *kube.Env, p podInfo) int {
	t.Helper()
	n := 0
	for _, l := range strings.Split(k.Kubectl(t, "-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata"), "\n") {
		if strings.Contains(l, `"Stream finished" method="/csi.v1.SnapshotMetadata/GetMetadataDelta"`) {
			n++
		}
	}
	return n
}

// streamsStarted counts the streams of a backup client run with -streams
// that logged a first record, and the ones that ended in an error.
func streamsStarted(t *testing.T, logs string) (started, failed int) {
	t.Helper()
	seen := map[int]bool{}
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var r struct {
			Stream, Record int
			Error          string
		}
		if l == "" || json.Unmarshal([]byte(l), &r) != nil {
			continue
		}
		if r.Error != "" {
			failed++
		}
		if r.Record >= 1 && !seen[r.Stream] {
			seen[r.Stream] = true
			started++
		}
	}
	return started, failed
}

// scaleChart scales the chart's Deployment to n replicas and waits until
// n pods are left, all Ready.
func scaleChart(t *testing.T, k *kube.Env, sel string, n int) {
	t.Helper()
	k.Kubectl(t, "-n", podNS, "scale", "deployment", "rbd-snapshot-metadata", fmt.Sprintf("--replicas=%d", n))
	harness.WaitFor(t, fmt.Sprintf("%d Ready replicas", n), 3*time.Minute, func() bool {
		ps := pods(t, k, podNS, sel)
		for _, p := range ps {
			if p.readyAfter() < 0 {
				return false
			}
		}
		return len(ps) == n
	})
}

// stalledReaders, on the chart's install scaled to one replica: a client
// pod opens 31 streams of the long Delta at once, each stalled after its
// first record (a backup tool that stopped reading), then the precise
// Delta is read in full beside them: the server's default --max-streams
// (32). Every stalled stream must reach the server (held, or sent whole
// into the sidecar's windows: both are counted and logged), the precise
// one must come back byte for byte, the container must stay under the
// pod's limit with no OOM kill or restart, and every stream must be
// released once the client is gone. The replicas are put back to the
// chart's two at the end.
func stalledReaders(t *testing.T, k *kube.Env, sel string, dl1, dl2 []byte) {
	const stalled = 31
	scaleChart(t, k, sel, 1)
	defer scaleChart(t, k, sel, 2)
	server := pods(t, k, podNS, sel)[0]
	t.Logf("before: %s", containerMemory(t, k, server, "rbd-snapshot-metadata"))
	done0 := finishedDeltas(t, k, server)
	pod := startPod(t, k, "stalled", kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0", "-snapshot", "snap-l2",
		"-prev-snapshot", "snap-l1", "-namespace", kube.NS, "-streams", strconv.Itoa(stalled), "-record-delay", "1h")
	deleted := false
	defer func() {
		if !deleted {
			k.KubectlQuiet("-n", kube.NS, "delete", "pod", pod, "--wait=false")
		}
	}()
	harness.WaitFor(t, "a first record on each stalled stream", 3*time.Minute, func() bool {
		out, _ := k.KubectlQuiet("-n", kube.NS, "logs", pod)
		started, failed := streamsStarted(t, out)
		if failed > 0 {
			t.Fatalf("%d of the stalled streams failed:\n%s", failed, harness.Tail(out, 10))
		}
		return started == stalled
	})
	// Each stalled stream reached the server: it either holds it still or
	// has sent it whole into the sidecar's flow-control windows (a long
	// Delta of 32768 tuples is about 330 KB, which the sidecar and the
	// client's connection may hold while the client reads nothing).
	server = pods(t, k, podNS, sel)[0]
	held := streamsInFlight(t, k)
	if done := finishedDeltas(t, k, server) - done0; done+held < stalled {
		t.Errorf("under %d stalled readers the server has %d streams in flight and finished %d: some never reached it", stalled, held, done)
	} else {
		t.Logf("under %d stalled readers the server holds %d streams and has sent %d whole into the sidecar's windows", stalled, held, done)
	}
	logs, ok := runPod(t, k, "precise-beside-stalled", kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
		"-snapshot", "snap-l2", "-prev-snapshot", "snap-l1", "-namespace", kube.NS)
	if !ok {
		t.Fatalf("the precise Delta beside %d stalled streams failed:\n%s", stalled, harness.Tail(logs, 10))
	}
	got, _ := clientAnswer(t, logs)
	csiCheckOracle(t, "the precise Delta beside the stalled streams", got, dl1, dl2, 0)
	if n := streamsInFlight(t, k); n > held {
		t.Errorf("after the precise Delta the server has %d streams in flight, more than the %d stalled ones it held", n, held)
	}
	m := containerMemory(t, k, pods(t, k, podNS, sel)[0], "rbd-snapshot-metadata")
	t.Logf("%d stalled streams and a precise Delta of %d tuples: %s", stalled, len(got.extents), m)
	m.checkUnderLimit(t, server.Metadata.Name)
	k.Kubectl(t, "-n", kube.NS, "delete", "pod", pod, "--wait=false")
	deleted = true
	harness.WaitFor(t, "every stalled stream released", 2*time.Minute, func() bool { return streamsInFlight(t, k) == 0 })
}
