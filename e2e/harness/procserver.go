//go:build e2e

package harness

// A server process that can be killed and restarted on the same socket,
// free addresses and short socket paths for it, and its /metrics.

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ProcServer is a server process on a socket that the test chooses, so
// that it can be killed and another started on the same socket.
type ProcServer struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	log     *os.File
}

// StartProc runs RSM_SERVER_BIN on sock, logging to logPath (appended), and
// waits until it answers on the socket.
func StartProc(t testing.TB, sock, logPath string, flags ...string) *ProcServer {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--endpoint", "unix://" + sock,
		"--clusterconfig", filepath.Join(ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"),
		"-v=2", "--grace-period=2s",
	}, flags...)
	p := &ProcServer{cmd: exec.Command(ClusterEnv(t, "RSM_SERVER_BIN"), args...), exited: make(chan struct{}), log: logf}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			t.Errorf("server pid %d still running 20 s after SIGTERM; killing it", p.cmd.Process.Pid)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	// A stale socket file may be there: wait until something answers.
	for deadline := time.Now().Add(20 * time.Second); ; {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		select {
		case <-p.exited:
			t.Fatalf("server exited before serving: %v", p.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("server: nothing answers on %s after 20 s", sock)
		}
	}
	return p
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *ProcServer) Kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("SIGKILL the server: %v", err)
	}
	<-p.exited
}

// ShortSocket returns a socket path short enough for sun_path.
func ShortSocket(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rsm-rel-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "csi.sock")
}

// ------------------------------------------------------------ metrics --

// FreeTCPAddr returns a 127.0.0.1 address where nothing listens now.
func FreeTCPAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Scrape returns the body of http://addr/metrics.
func Scrape(t testing.TB, addr string) string {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return string(b)
}

// MetricValue returns the value of the sample named exactly name (with its
// labels, if any) in a /metrics body, and whether it is there.
func MetricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}
