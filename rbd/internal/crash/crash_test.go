package crash

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// crasher builds testdata/crasher.
func crasher(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "crasher")
	gobin := "go"
	if root := runtime.GOROOT(); root != "" { // empty under -trimpath
		gobin = filepath.Join(root, "bin", "go")
	}
	out, err := exec.Command(gobin, "build", "-o", bin, "./testdata/crasher").CombinedOutput()
	if err != nil {
		t.Fatalf("build testdata/crasher: %v\n%s", err, out)
	}
	return bin
}

// TestInstall kills processes the ways a librados thread and a Go thread
// can die, with and without Install, and reads what they leave on stderr.
func TestInstall(t *testing.T) {
	bin := crasher(t)
	const report, end = "rbd-snapshot-metadata: fatal signal ", "rbd-snapshot-metadata: end of the stack"
	for _, c := range []struct {
		name    string
		args    []string
		signal  syscall.Signal // the process's death; 0: exit code code
		code    int
		want    []string // in stderr, or stdout for go-nil
		wantNot []string
	}{
		// What CI saw: libstdc++'s line, then nothing.
		{name: "throw without", args: []string{"throw"}, signal: syscall.SIGABRT,
			want: []string{"terminate called after throwing an instance of 'std::system_error'", "Owner died"}, wantNot: []string{report}},
		{name: "throw", args: []string{"-install", "throw"}, signal: syscall.SIGABRT,
			want: []string{"Owner died\n" + report + "SIGABRT (an abort", "libstdc++.so", "(abort+", end}},
		{name: "fault without", args: []string{"fault"}, signal: syscall.SIGSEGV, wantNot: []string{report}},
		{name: "fault", args: []string{"-install", "fault"}, signal: syscall.SIGSEGV,
			want: []string{report + "SIGSEGV in C or C++ code", "libstdc++.so", end}},
		// A C thread that once called into Go has the runtime's signal
		// stack, and the runtime still says nothing of it.
		{name: "bound abort without", args: []string{"bound-abort"}, signal: syscall.SIGABRT, wantNot: []string{report}},
		{name: "bound abort", args: []string{"-install", "bound-abort"}, signal: syscall.SIGABRT,
			want: []string{report + "SIGABRT (an abort", "(abort+", end}},
		// A library's fault in a cgo call: its stack, then the runtime's
		// report of the goroutine.
		{name: "cgo fault", args: []string{"-install", "cgo-fault"}, code: 2,
			want: []string{report + "SIGSEGV in C or C++ code", "libc.so", end, "signal arrived during cgo execution", "main._Cfunc_rsm_test_cgo_fault"}},
		// The runtime's own signals are its own, as before.
		{name: "go nil", args: []string{"-install", "go-nil"}, code: 0,
			want: []string{"recovered: runtime error: invalid memory address or nil pointer dereference"}, wantNot: []string{report}},
		{name: "go abort", args: []string{"-install", "go-abort"}, code: 2,
			want: []string{"SIGABRT: abort", "goroutine 1 ", "main.main()"}, wantNot: []string{report}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, c.args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			cmd.Env = append(os.Environ(), "GOTRACEBACK=single")
			err := cmd.Run()
			var ee *exec.ExitError
			switch {
			case c.signal != 0:
				ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
				if !errors.As(err, &ee) || !ws.Signaled() || ws.Signal() != c.signal {
					t.Errorf("ended with %v, want death by %v", err, c.signal)
				}
			case c.code == 0 && err != nil, c.code != 0 && (!errors.As(err, &ee) || ee.ExitCode() != c.code):
				t.Errorf("ended with %v, want exit code %d", err, c.code)
			}
			out := stderr.String() + stdout.String()
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range c.wantNot {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}
}
