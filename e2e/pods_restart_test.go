//go:build e2e

package e2e

// TestPods/restart-in-place: the server container killed in its pod (as
// an OOM kill or a crash ends it) and restarted in place by the kubelet,
// in the same pod, whose emptyDir still holds the dead server's socket
// file; the sidecar beside it keeps running and must reach the new one.

import (
	"os"
	"path/filepath"
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
		cmd, _ := os.ReadFile(filepath.Join("/proc", f, "cmdline"))
		if exe, _, _ := strings.Cut(string(cmd), "\x00"); filepath.Base(exe) == "rbd-snapshot-metadata" {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("%s: no rbd-snapshot-metadata process among %q", p.Metadata.Name, b)
	return 0
}

// restartInPlace, on the chart's install scaled to one replica: SIGKILL
// to the server, so that it leaves its socket file behind. The kubelet
// restarts the container in the same pod; the new server must take the
// stale socket over (server/listen.go), pass its liveness probe (snapmeta
// health over that socket) and, through the sidecar that kept running,
// answer a backup client pod's Delta in full.
func restartInPlace(t *testing.T, k *kube.Env, sel string, da1, da2 []byte) {
	scaleChart(t, k, sel, 1)
	defer scaleChart(t, k, sel, 2)
	p := pods(t, k, podNS, sel)[0]
	pid := serverPID(t, k, p)
	t0 := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
	harness.WaitFor(t, "the server container restarted in place and Ready", 3*time.Minute, func() bool {
		for _, q := range pods(t, k, podNS, sel) {
			for _, c := range q.Status.ContainerStatuses {
				if q.Metadata.UID == p.Metadata.UID && c.Name == "rbd-snapshot-metadata" {
					return c.RestartCount == 1 && c.Ready
				}
			}
		}
		return false
	})
	t.Logf("%s: the server killed, restarted in the same pod and Ready after %.1fs", p.Metadata.Name, time.Since(t0).Seconds())
	prev := k.Kubectl(t, "-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata", "--previous")
	if !strings.Contains(prev, "Go memory limit") {
		t.Errorf("the killed container's log is not the old server's:\n%s", harness.Tail(prev, 5))
	}
	// The liveness probe's command, as the kubelet runs it (its first run
	// may be 30 s away): the new server answers on the old socket's path.
	k.Kubectl(t, "-n", podNS, "exec", p.Metadata.Name, "-c", "rbd-snapshot-metadata", "--",
		"/usr/local/bin/snapmeta", "--endpoint=unix:///csi/csi-snapshot-metadata.sock", "--timeout=5s", "health")
	logs, ok := runPod(t, k, "after-restart", kube.BackupSA, "rsm-e2e.local/backup-client:v1.1.0",
		"-snapshot", "snap-a2", "-prev-snapshot", "snap-a1", "-namespace", kube.NS)
	if !ok {
		t.Fatalf("the Delta after the restart failed:\n%s", harness.Tail(logs, 10))
	}
	got, _ := clientAnswer(t, logs)
	csiCheckOracle(t, "the Delta after the restart in place", got, da1, da2, 0)
	now := k.Kubectl(t, "-n", podNS, "logs", p.Metadata.Name, "-c", "rbd-snapshot-metadata")
	if !strings.Contains(now, "GetMetadataDelta") {
		t.Errorf("the restarted server did not log the Delta:\n%s", harness.Tail(now, 10))
	}
	for _, q := range pods(t, k, podNS, sel) {
		for _, c := range q.Status.ContainerStatuses {
			if q.Metadata.UID == p.Metadata.UID && c.RestartCount != map[string]int{"rbd-snapshot-metadata": 1}[c.Name] {
				t.Errorf("%s: container %s restarted %d times, want the server once and the sidecar never", q.Metadata.Name, c.Name, c.RestartCount)
			}
		}
	}
}
