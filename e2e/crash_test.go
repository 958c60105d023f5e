//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestCSICrashReport kills the real server the way CI once saw it die: a
// librados thread aborts (there, an uncaught std::system_error "Owner
// died", then nothing in the log). The server's log must now hold that
// thread's stack, with Ceph's own library in it, and the process must
// still die by SIGABRT.
func TestCSICrashReport(t *testing.T) {
	srv := csiStartServer(t)
	// A query, so that the server has a cluster connection and its threads.
	k := harness.NewCSICluster(t, harness.ConnectAdmin(t), "rsm-e2e", "")
	v := k.CreateVolume(t, 8*harness.MiB, nil)
	v.Write(t, 0, 4096)
	srv.mustQuery(t, "", v.Snapshot(t).Handle(), 0)

	pid := serverUnder(t, srv.cmd.Process.Pid)
	tid := threadNamed(t, pid, "msgr-worker-")
	if err := syscall.Tgkill(pid, tid, syscall.SIGABRT); err != nil {
		t.Fatalf("tgkill %d %d SIGABRT: %v", pid, tid, err)
	}
	select {
	case <-srv.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the server lives on 30 s after SIGABRT to its thread %d", tid)
	}
	ws, _ := srv.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !(ws.Signaled() && ws.Signal() == syscall.SIGABRT) && ws.ExitStatus() != 128+int(syscall.SIGABRT) {
		t.Errorf("the server ended with %v, want death by SIGABRT", srv.cmd.ProcessState)
	}
	log := srv.log.String()
	for _, want := range []string{
		"rbd-snapshot-metadata: fatal signal SIGABRT (sent by process ", "in C or C++ code (librados, librbd); the stack of its thread, innermost first:\n",
		"libceph-common.so", "rbd-snapshot-metadata: end of the stack",
	} {
		if !strings.Contains(log, want) {
			t.Fatalf("the server's log lacks %q:\n%s", want, log)
		}
	}
	_, stack, _ := strings.Cut(log, "innermost first:\n")
	t.Logf("the aborted thread's stack, as the log has it:\n%s", stack)
}

// serverUnder returns root, or the process under root that runs the
// server binary (under a wrapper, the image's entrypoint).
func serverUnder(t *testing.T, root int) int {
	t.Helper()
	for todo := []int{root}; len(todo) > 0; todo = todo[1:] {
		if runsServer(todo[0]) {
			return todo[0]
		}
		todo = append(todo, children(todo[0])...)
	}
	t.Fatalf("no rbd-snapshot-metadata process under %d", root)
	return 0
}

// runsServer reports whether process pid runs rbd-snapshot-metadata.
func runsServer(pid int) bool {
	argv, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	arg0, _, _ := strings.Cut(string(argv), "\x00")
	return filepath.Base(arg0) == "rbd-snapshot-metadata"
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	var kids []int
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				kids = append(kids, n)
			}
		}
	}
	return kids
}

// threadNamed returns a thread of pid whose name starts with prefix.
func threadNamed(t *testing.T, pid int, prefix string) int {
	t.Helper()
	comms, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/comm")
	var names []string
	for _, f := range comms {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(b))
		if strings.HasPrefix(name, prefix) {
			tid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			if err == nil {
				return tid
			}
		}
		names = append(names, name)
	}
	t.Fatalf("process %d has no thread named %s*; its threads: %v", pid, prefix, names)
	return 0
}
