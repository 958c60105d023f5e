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

// PausedOSD is osd.0 stopped with SIGSTOP (PauseOSD).
type PausedOSD struct {
	t             testing.TB
	cont          func()
	stopped       time.Time
	down, resumed sync.Once
}

// laggyAfter is how long a stop of the OSD lasts before Resume marks it
// down: the stops the CI failure and issue 23 saw were 10 s and longer.
// Marking down after a shorter one delayed the first reads after the OSD
// continued by 24.8 s (after a stop of 5 s, against 0.3 s after one of
// 10 s), likely the PGs of the new interval waiting out the read lease of
// the old one (16 s: osd_heartbeat_grace times
// osd_pool_default_read_lease_ratio); and it would take from the tests the
// OSD that continues with no map change.
const laggyAfter = 8 * time.Second

// PauseOSD stops osd.0 with SIGSTOP. Resume continues it, and also runs
// when the test ends, whatever happens.
//
// On a real cluster the OSD's peers report an OSD that stops answering,
// and the monitors mark it down after osd_heartbeat_grace (20 s); its PGs'
// read leases are renewed by their replicas. With the harness's single OSD
// nobody does either, and after a stop a PG can stay laggy: its reads wait
// ("waiting for readable") for minutes after the OSD continues, while the
// other PGs serve. When that PG holds rbd_info, which every image open
// reads, every open times out. Seen in CI after a stop of 10.1 s late in
// the suite (TestReliabilityFaults), and in issue 23 after 20 s; not
// reproduced on a fresh cluster with stops of 6 to 22 s, with or without
// reads in flight, nor after an earlier mark-down. `ceph osd down 0` ends
// it at once. So Resume first marks a long-stopped OSD down, as its peers
// would have; once continued, the OSD boots again and its PGs peer anew.
// A shorter stop (laggyAfter) is only continued.
func PauseOSD(t testing.TB) *PausedOSD {
	t.Helper()
	p := &PausedOSD{t: t, cont: PauseDaemon(t, "osd.0"), stopped: time.Now()}
	// Before PauseDaemon's plain SIGCONT. A test that ended with the OSD
	// still stopped (it failed) leaves the next test a cluster that serves.
	t.Cleanup(func() {
		if p.resume() {
			WaitClusterIO(t)
		}
	})
	return p
}

// MarkDown marks the stopped OSD down (ceph osd down), once.
func (p *PausedOSD) MarkDown() {
	p.down.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ceph", "--connect-timeout", "20", "osd", "down", "0").CombinedOutput()
		p.t.Logf("ceph osd down 0, as its peers would have: %v %s", err, strings.TrimSpace(string(out)))
	})
}

// Resume continues the OSD, once, after marking it down (if MarkDown has
// not) when it was stopped for laggyAfter or longer.
func (p *PausedOSD) Resume() { p.resume() }

// resume is Resume, reporting whether this call continued the OSD.
func (p *PausedOSD) resume() (did bool) {
	p.resumed.Do(func() {
		did = true
		if time.Since(p.stopped) >= laggyAfter {
			p.MarkDown()
		}
		p.cont()
	})
	return did
}

// Outage keeps the OSD stopped for d more, then continues it. On a real
// cluster its peers would have reported it and the monitors marked it down
// after osd_heartbeat_grace (20 s): Outage marks it down 5 s before it
// continues it, so that clients see it down for those seconds, as they
// would.
func (p *PausedOSD) Outage(d time.Duration) {
	time.Sleep(max(d-5*time.Second, 0))
	p.MarkDown()
	time.Sleep(5 * time.Second)
	p.Resume()
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
	if err := kill(pid); err != nil {
		t.Fatalf("SIGKILL osd.0 (pid %d): %v", pid, err)
	}
	t.Logf("SIGKILL osd.0 (pid %d)", pid)
	return restart
}

// kill sends SIGKILL to pid and waits, for at most 5 s, until it has
// exited (gone, or a zombie not yet reaped).
func kill(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for i := 0; i < 200; i++ {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	return nil
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
// not serve again by itself within about a minute (seen in CI after a
// SIGSTOP and SIGCONT of 10 s: see PauseOSD) is the cluster's failure, not
// the server's: the test logs the cluster's state, restarts the OSD, and
// goes on, so that the server's recovery is still checked and the tests
// after it get a working cluster.
func WaitClusterIO(t testing.TB) {
	t.Helper()
	if serveIO(t, 2) {
		return
	}
	t.Logf("the OSD serves no I/O a minute after the fault; restarting it.\n%s", ClusterState(t))
	_ = kill(daemonPID(t, "osd.0")) // gone already: start it all the same
	if !startOSD(t) || !serveIO(t, 3) {
		t.Fatalf("the cluster does not serve I/O, even after restarting the OSD")
	}
}

// ClusterState is what tells why the cluster does not serve: ceph -s, the
// OSD's ops in flight (from its admin socket), and the end of its log.
func ClusterState(t testing.TB) string {
	t.Helper()
	run := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ceph", args...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%s(%v)", out, err)
		}
		return string(out)
	}
	dir := ClusterEnv(t, "RSM_CLUSTER_DIR")
	osdLog, _ := os.ReadFile(filepath.Join(dir, "log", "ceph-osd.0.log"))
	return fmt.Sprintf("ceph -s:\n%s\nosd.0 ops in flight:\n%s\nosd.0 log:\n%s",
		run("--connect-timeout", "10", "-s"),
		Tail(run("--admin-daemon", filepath.Join(dir, "run", "ceph-osd.0.asok"), "dump_ops_in_flight"), 60),
		Tail(string(osdLog), 40))
}

// probeObjects are read by serveIO: rbd_info, which every image open reads,
// rbd_directory, which every create, rename and removal writes, and an
// object that does not exist. They sit in different PGs of the pool, and a
// laggy PG serves none of its objects while the others are served.
var probeObjects = []string{"rbd_info", "rbd_directory", "rsm-reliability-probe"}

// serveIO waits until the cluster serves a read of every probe object, for
// at most tries times about 30 s each, and reports whether it does.
func serveIO(t testing.TB, tries int) bool {
	t.Helper()
	t0 := time.Now()
	for attempt := 1; ; attempt++ {
		var failed error
		for _, obj := range probeObjects {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			cmd := exec.CommandContext(ctx, "rados", "-p", Pool, "--rados-osd-op-timeout", "30", "--rados-mon-op-timeout", "30",
				"--client-mount-timeout", "30", "stat", obj)
			out, err := cmd.CombinedOutput()
			cancel()
			// ENOENT is an answer of the OSD.
			if err != nil && !strings.Contains(string(out), "No such file") {
				failed = fmt.Errorf("stat %s: %v\n%s", obj, err, out)
				break
			}
		}
		if failed == nil {
			t.Logf("the cluster serves I/O again after %v", time.Since(t0).Round(time.Millisecond))
			return true
		}
		if attempt == tries {
			t.Logf("the cluster serves no I/O %v after the fault: %v", time.Since(t0).Round(time.Second), failed)
			return false
		}
	}
}
