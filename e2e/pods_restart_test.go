//go:build e2e

package e2e

// TestPods/restart-in-place: the server container killed in its pod (as
// an OOM kill or a crash ends it) and restarted in place by the kubelet,
// in the same pod, whose emptyDir still holds the dead server's socket
// file; the sidecar beside it exits on losing its server and is
// restarted too, and must reach the new one.

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

// serverPID is the node's PID of the server in p's server container: the
// process of its cgroup that runs rbd-snapshot-metadata (a probe's
// snapmeta may be there too).
func serverPID(t *testing.T, k *kube.Env, p podInfo) int {
	t.Helper()
	dir, _ := containerCgroup(t, k, p, "rbd-snapshot-metadata", "memory")
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && runsServer(pid) {
			return pid
		}
	}
	t.Fatalf("%s: no rbd-snapshot-metadata process among %q", p.Metadata.Name, b)
	return 0
}

// restartInPlace, on the chart's install scaled to one replica: SIGKILL
// to the server, so that it leaves its socket file behind. The kubelet
// restarts the container in the same pod (and the sidecar, which exits
// on losing it); the new server must take the stale socket over
// (server/listen.go), pass its liveness probe (snapmeta health over that
// socket) and answer a backup client pod's Delta in full through the
// sidecar (after one retryable error at most, which a backup tool
// retries), and nothing may restart after the pod is Ready again.
func restartInPlace(t *testing.T, k *kube.Env, sel string, da1, da2 []byte) {
	scaleChart(t, k, sel, 1)
	defer scaleChart(t, k, sel, 2)
	p := pods(t, k, podNS, sel)[0]
	pid := serverPID(t, k, p)
	t0 := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
	// The sidecar exits when it loses our server (external-snapshot-metadata
	// v1.1.0 connects with csi-lib-utils' ExitOnConnectionLoss), so the
	// kubelet restarts it too: wait for the whole pod to be Ready again,
	// the server restarted once.
	var restarts map[string]int
	harness.WaitFor(t, "the server restarted in place and the pod Ready", 3*time.Minute, func() bool {
		q, ok := podByUID(t, k, podNS, sel, p.Metadata.UID)
		if !ok {
			return false
		}
		restarts = q.restarts()
		ready := true
		for _, c := range q.Status.ContainerStatuses {
			ready = ready && c.Ready
		}
		return ready && restarts["rbd-snapshot-metadata"] == 1
	})
	t.Logf("%s: the server killed, restarted in the same pod and the pod Ready after %.1fs (restarts: %v)",
		p.Metadata.Name, time.Since(t0).Seconds(), restarts)
	prev := k.Kubectl(t, "-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata", "--previous")
	if !strings.Contains(prev, "Go memory limit") {
		t.Errorf("the killed container's log is not the old server's:\n%s", harness.Tail(prev, 5))
	}
	// The liveness probe's command, as the kubelet runs it (its first run
	// may be 30 s away): the new server answers on the old socket's path.
	k.Kubectl(t, "-n", podNS, "exec", p.Metadata.Name, "-c", "rbd-snapshot-metadata", "--",
		"/usr/local/bin/snapmeta", "--endpoint=unix:///csi/csi-snapshot-metadata.sock", "--timeout=5s", "health")
	// A backup tool retries a retryable error, with a pause: while the
	// sidecar is exiting or restarting, calls fail (seen: Unavailable,
	// "error reading from server: EOF", then "connection refused" to the
	// Service); within five tries one must be answered in full.
	var logs string
	for try := 1; ; try++ {
		var ok bool
		logs, ok = runPod(t, k, "after-restart-"+strconv.Itoa(try), kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
			"-snapshot", "snap-a2", "-prev-snapshot", "snap-a1", "-namespace", kube.NS)
		if ok {
			t.Logf("the Delta after the restart answered on try %d", try)
			break
		}
		last := lastLine(logs)
		if !regexp.MustCompile(`Unavailable|Aborted|Canceled|DeadlineExceeded|EOF|connection`).MatchString(last) || try == 5 {
			t.Fatalf("the Delta after the restart, try %d: %s", try, last)
		}
		t.Logf("the Delta after the restart, try %d, failed with a retryable error: %s", try, last)
		time.Sleep(5 * time.Second)
	}
	if q, ok := podByUID(t, k, podNS, sel, p.Metadata.UID); ok {
		restarts = q.restarts()
	}
	t.Logf("restarts once answered: %v", restarts)
	got, _ := clientAnswer(t, logs)
	csiCheckOracle(t, "the Delta after the restart in place", got, da1, da2, 0)
	now := k.Kubectl(t, "-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
	if !strings.Contains(now, "GetMetadataDelta") {
		t.Errorf("the restarted server did not log the Delta:\n%s", harness.Tail(now, 10))
	}
	if q, ok := podByUID(t, k, podNS, sel, p.Metadata.UID); ok {
		for name, n := range q.restarts() {
			if n != restarts[name] {
				t.Errorf("%s: container %s restarted %d times, %d when the pod was Ready again", q.Metadata.Name, name, n, restarts[name])
			}
		}
	}
}
