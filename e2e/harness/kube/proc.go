//go:build e2e

package kube

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// ------------------------------------------------------------ processes --

// Proc is a process of the test, stopped by its PID when the test ends.
type Proc struct {
	Name    string
	Cmd     *exec.Cmd
	Exited  chan struct{} // closed once waited for
	Err     error         // the exit's, once Exited is closed
	MayExit bool          // an exit before the end is the test's business
}

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool { return !harness.Closed(p.Exited) }

// StartProcess runs bin (a name in RSM_K8S_BIN, or a path) with args, its
// output in dir/logs/name.log, its PID in dir/pids/name; when the test
// ends it gets SIGTERM, and SIGKILL 20 s later. An exit before that fails
// the test, unless the Proc's MayExit is set.
func (k *Env) StartProcess(t *testing.T, name, bin string, args ...string) *Proc {
	t.Helper()
	logf, err := os.Create(filepath.Join(k.Dir, "logs", name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(bin) {
		bin = filepath.Join(k.Bin, bin)
	}
	p := &Proc{Name: name, Cmd: exec.Command(bin, args...), Exited: make(chan struct{})}
	p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	// Killed with the test binary, should that die first.
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	pid := p.Cmd.Process.Pid
	go func() { p.Err = p.Cmd.Wait(); logf.Close(); close(p.Exited) }()
	WriteFile(t, filepath.Join(k.Dir, "pids", name), strconv.Itoa(pid))
	t.Cleanup(func() {
		if !p.Running() {
			if !p.MayExit {
				t.Errorf("%s (pid %d) exited before the test ended: %v\n%s", name, pid, p.Err, harness.Tail(k.Log(name), 30))
			}
			return
		}
		t0 := time.Now()
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.Exited:
		case <-time.After(20 * time.Second):
			t.Errorf("%s (pid %d) still running 20 s after SIGTERM: SIGKILL", name, pid)
			_ = p.Cmd.Process.Kill()
			<-p.Exited
		}
		t.Logf("stopped %s (pid %d) in %.1fs", name, pid, time.Since(t0).Seconds())
		if t.Failed() {
			t.Logf("%s log:\n%s", name, harness.Tail(k.Log(name), 60))
		}
	})
	return p
}

// Log is the output of the test's process name so far.
func (k *Env) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(k.Dir, "logs", name+".log"))
	return string(b)
}

// WriteFile writes s to path (0600), or fails the test.
func WriteFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
