//go:build e2e

package harness

// Faults injected into the cluster's daemons: a monitor or OSD paused,
// an OSD killed and restarted, and waiting until the cluster serves I/O again.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// daemonPID returns the PID of a daemon of the test cluster (name "osd.0"
// or "mon.a"), from cluster.sh's pid file, checking that it is a ceph
// daemon, so that a stale file never makes the test signal another process.
func daemonPID(t testing.TB, name string) int {
	t.Helper()
	f := filepath.Join(ClusterEnv(t, "RSM_CLUSTER_DIR"), "run", "ceph-"+name+".pid")
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatalf("pid of %s: %v", name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %q is not a pid", f, b)
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if !strings.HasPrefix(string(comm), "ceph-") {
		t.Fatalf("%s: pid %d is %q, not a ceph daemon", f, pid, strings.TrimSpace(string(comm)))
	}
	return pid
}

// PauseDaemon stops a daemon with SIGSTOP and returns the function that
// continues it (SIGCONT), which also runs when the test ends, whatever
// happens, so that the cluster the other tests share is left whole.
func PauseDaemon(t testing.TB, name string) (resume func()) {
	t.Helper()
	pid := daemonPID(t, name)
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %s (pid %d): %v", name, pid, err)
			}
		})
	}
	t.Cleanup(resume)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s (pid %d): %v", name, pid, err)
	}
	t.Logf("SIGSTOP %s (pid %d)", name, pid)
	return resume
}

// KillOSD kills the OSD with SIGKILL and returns the function that starts
// it again, as cluster.sh does (inside the rootfs, where the test runs);
// that function also runs when the test ends. It waits until the OSD
// serves I/O again.
func KillOSD(t testing.TB) (restart func()) {
	t.Helper()
	pid := daemonPID(t, "osd.0")
	var once sync.Once
	restart = func() {
		once.Do(func() {
			if startOSD(t) {
				WaitClusterIO(t)
			}
		})
	}
	t.Cleanup(restart)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL osd.0 (pid %d): %v", pid, err)
	}
	for i := 0; i < 200; i++ {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Logf("SIGKILL osd.0 (pid %d)", pid)
	return restart
}

// startOSD starts osd.0 as cluster.sh does, and reports whether it started.
func startOSD(t testing.TB) bool {
	t.Helper()
	dir := ClusterEnv(t, "RSM_CLUSTER_DIR")
	out, err := os.OpenFile(filepath.Join(dir, "log", "osd.out"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Errorf("start osd.0: %v", err)
		return false
	}
	defer out.Close()
	// ceph-osd daemonizes: the command returns once it forked.
	cmd := exec.Command("ceph-osd", "--conf", ClusterEnv(t, "CEPH_CONF"), "-i", "0")
	cmd.Stdout, cmd.Stderr = out, out
	// In /, as cluster.sh starts it: reef's packages set osd_class_dir to
	// a relative path (lib/x86_64-linux-gnu/rados-classes), resolved when
	// a class is first used. From the test's folder, every class method
	// (rbd_open's first) failed with EOPNOTSUPP.
	cmd.Dir = "/"
	if err := cmd.Run(); err != nil {
		t.Errorf("start osd.0: %v", err)
		return false
	}
	t.Logf("started osd.0 (pid %d)", daemonPID(t, "osd.0"))
	return true
}

// WaitClusterIO waits until the cluster serves I/O again. An OSD that does
// not serve again by itself within about a minute (seen once in CI after a
// SIGSTOP and SIGCONT of 10 s) is the cluster's failure, not the server's:
// the test logs the cluster's state and the OSD's log, restarts the OSD,
// and goes on, so that the server's recovery is still checked and the
// tests after it get a working cluster.
func WaitClusterIO(t testing.TB) {
	t.Helper()
	if serveIO(t, 2) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	st, _ := exec.CommandContext(ctx, "ceph", "--connect-timeout", "10", "-s").CombinedOutput()
	cancel()
	osdLog, _ := os.ReadFile(filepath.Join(ClusterEnv(t, "RSM_CLUSTER_DIR"), "log", "ceph-osd.0.log"))
	t.Logf("the OSD serves no I/O a minute after the fault; restarting it. ceph -s:\n%s\nOSD log:\n%s",
		st, Tail(string(osdLog), 40))
	if pid := daemonPID(t, "osd.0"); syscall.Kill(pid, syscall.SIGKILL) == nil {
		for i := 0; i < 200; i++ {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(b), ") Z ") {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	if !startOSD(t) || !serveIO(t, 3) {
		t.Fatalf("the cluster does not serve I/O, even after restarting the OSD")
	}
}

// serveIO waits until the cluster serves a read, for at most tries times
// about 30 s, and reports whether it does.
// for at most about two minutes.
func serveIO(t testing.TB, tries int) bool {
	t.Helper()
	t0 := time.Now()
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		cmd := exec.CommandContext(ctx, "rados", "-p", Pool, "--rados-osd-op-timeout", "30", "--rados-mon-op-timeout", "30",
			"--client-mount-timeout", "30", "stat", "rsm-reliability-probe")
		out, err := cmd.CombinedOutput()
		cancel()
		// The probe object does not exist: ENOENT is an answer of the OSD.
		if err == nil || strings.Contains(string(out), "No such file") {
			t.Logf("the cluster serves I/O again after %v", time.Since(t0).Round(time.Millisecond))
			return true
		}
		if attempt == tries {
			t.Logf("the cluster serves no I/O %v after the fault: %v\n%s", time.Since(t0).Round(time.Second), err, out)
			return false
		}
	}
}
