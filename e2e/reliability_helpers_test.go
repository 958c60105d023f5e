//go:build e2e

package e2e

// Helpers of the reliability tests (reliability_*_test.go): faults injected
// into the cluster's daemons, a server process that can be killed and
// restarted on the same socket, /metrics scraping, and an in-process server
// (rbd.Source + rbddriver + driver + server.Run) whose source, handlers and
// goroutines the test can inspect.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/rbddriver"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/server"
)

// ------------------------------------------------------------ daemons --

// daemonPID returns the PID of a daemon of the test cluster (name "osd.0"
// or "mon.a"), from cluster.sh's pid file, checking that it is a ceph
// daemon, so that a stale file never makes the test signal another process.
func daemonPID(t testing.TB, name string) int {
	t.Helper()
	f := filepath.Join(clusterEnv(t, "RSM_CLUSTER_DIR"), "run", "ceph-"+name+".pid")
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

// pauseDaemon stops a daemon with SIGSTOP and returns the function that
// continues it (SIGCONT), which also runs when the test ends, whatever
// happens, so that the cluster the other tests share is left whole.
func pauseDaemon(t testing.TB, name string) (resume func()) {
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

// killOSD kills the OSD with SIGKILL and returns the function that starts
// it again, as cluster.sh does (inside the rootfs, where the test runs);
// that function also runs when the test ends. It waits until the OSD
// serves I/O again.
func killOSD(t testing.TB) (restart func()) {
	t.Helper()
	pid := daemonPID(t, "osd.0")
	var once sync.Once
	restart = func() {
		once.Do(func() {
			if startOSD(t) {
				waitClusterIO(t)
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
	dir := clusterEnv(t, "RSM_CLUSTER_DIR")
	out, err := os.OpenFile(filepath.Join(dir, "log", "osd.out"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Errorf("start osd.0: %v", err)
		return false
	}
	defer out.Close()
	// ceph-osd daemonizes: the command returns once it forked.
	cmd := exec.Command("ceph-osd", "--conf", clusterEnv(t, "CEPH_CONF"), "-i", "0")
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

// waitClusterIO waits until the cluster serves I/O again. An OSD that does
// not serve again by itself within about a minute (seen once in CI after a
// SIGSTOP and SIGCONT of 10 s) is the cluster's failure, not the server's:
// the test logs the cluster's state and the OSD's log, restarts the OSD,
// and goes on, so that the server's recovery is still checked and the
// tests after it get a working cluster.
func waitClusterIO(t testing.TB) {
	t.Helper()
	if serveIO(t, 2) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	st, _ := exec.CommandContext(ctx, "ceph", "--connect-timeout", "10", "-s").CombinedOutput()
	cancel()
	osdLog, _ := os.ReadFile(filepath.Join(clusterEnv(t, "RSM_CLUSTER_DIR"), "log", "ceph-osd.0.log"))
	t.Logf("the OSD serves no I/O a minute after the fault; restarting it. ceph -s:\n%s\nOSD log:\n%s",
		st, tail(string(osdLog), 40))
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
		cmd := exec.CommandContext(ctx, "rados", "-p", pool, "--rados-osd-op-timeout", "30", "--rados-mon-op-timeout", "30",
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

// --------------------------------------------------- a killable server --

// procServer is a server process on a socket that the test chooses, so
// that it can be killed and another started on the same socket.
type procServer struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	log     *os.File
}

// startProc runs RSM_SERVER_BIN on sock, logging to logPath (appended), and
// waits until it answers on the socket.
func startProc(t testing.TB, sock, logPath string, flags ...string) *procServer {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--endpoint", "unix://" + sock,
		"--clusterconfig", filepath.Join(clusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"),
		"-v=2", "--grace-period=2s",
	}, flags...)
	p := &procServer{cmd: exec.Command(clusterEnv(t, "RSM_SERVER_BIN"), args...), exited: make(chan struct{}), log: logf}
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

// kill sends SIGKILL and waits until the process is gone.
func (p *procServer) kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("SIGKILL the server: %v", err)
	}
	<-p.exited
}

// shortSocket returns a socket path short enough for sun_path.
func shortSocket(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rsm-rel-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "csi.sock")
}

// ------------------------------------------------------------ metrics --

// freeTCPAddr returns a 127.0.0.1 address where nothing listens now.
func freeTCPAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape returns the body of http://addr/metrics.
func scrape(t testing.TB, addr string) string {
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

// metricValue returns the value of the sample named exactly name (with its
// labels, if any) in a /metrics body, and whether it is there.
func metricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// ------------------------------------------------- in-process server --

// handlerRecord is what one RPC's handler did, seen from the services
// wrapper: how it returned, and how many tuples it sent.
type handlerRecord struct {
	method   string
	err      error
	panicked any
	tuples   int
}

// recordingServices wraps the driver's handlers of both SnapshotMetadata
// RPCs to record how each returned: server.Run takes no interceptor.
type recordingServices struct {
	*driver.Driver
	mu      sync.Mutex
	records []handlerRecord
	done    chan handlerRecord // each record, as it is made
}

func (r *recordingServices) record(h handlerRecord) {
	r.mu.Lock()
	r.records = append(r.records, h)
	r.mu.Unlock()
	select {
	case r.done <- h:
	default:
	}
}

// next waits up to timeout for the next handler to return.
func (r *recordingServices) next(t testing.TB, timeout time.Duration) handlerRecord {
	t.Helper()
	select {
	case h := <-r.done:
		return h
	case <-time.After(timeout):
		t.Fatalf("no handler returned within %v", timeout)
		return handlerRecord{}
	}
}

func (r *recordingServices) handle(method string, h *handlerRecord, err *error) {
	h.method, h.err = method, *err
	if p := recover(); p != nil {
		h.panicked = p
		r.record(*h)
		panic(p)
	}
	r.record(*h)
}

type countingAllocated struct {
	csi.SnapshotMetadata_GetMetadataAllocatedServer
	n *int
}

func (s countingAllocated) Send(m *csi.GetMetadataAllocatedResponse) error {
	err := s.SnapshotMetadata_GetMetadataAllocatedServer.Send(m)
	if err == nil {
		*s.n += len(m.GetBlockMetadata())
	}
	return err
}

type countingDelta struct {
	csi.SnapshotMetadata_GetMetadataDeltaServer
	n *int
}

func (s countingDelta) Send(m *csi.GetMetadataDeltaResponse) error {
	err := s.SnapshotMetadata_GetMetadataDeltaServer.Send(m)
	if err == nil {
		*s.n += len(m.GetBlockMetadata())
	}
	return err
}

func (r *recordingServices) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, s csi.SnapshotMetadata_GetMetadataAllocatedServer) (err error) {
	var h handlerRecord
	defer r.handle("GetMetadataAllocated", &h, &err)
	return r.Driver.GetMetadataAllocated(req, countingAllocated{s, &h.tuples})
}

func (r *recordingServices) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, s csi.SnapshotMetadata_GetMetadataDeltaServer) (err error) {
	var h handlerRecord
	defer r.handle("GetMetadataDelta", &h, &err)
	return r.Driver.GetMetadataDelta(req, countingDelta{s, &h.tuples})
}

// syncBuf is a log sink shared by the server's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// inProc is a server in the test process, on a socket in a temporary
// folder, logging at -v=10 into logs.
type inProc struct {
	src  *rsm.Source
	svc  *recordingServices
	logs *syncBuf
	sock string
	conn *grpc.ClientConn
	sm   csi.SnapshotMetadataClient

	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// startInProc serves the cluster's snapshots in process, with the given
// rbd options; wrap, when set, wraps the driver's source (a fault
// injector). Stop shuts it down; it also runs when the test ends.
func startInProc(t testing.TB, opts rsm.Options, wrap func(driver.Source) driver.Source, dopts driver.Options) *inProc {
	t.Helper()
	opts.ConfigPath = filepath.Join(clusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json")
	p := &inProc{src: rsm.NewSource(opts), logs: &syncBuf{}, sock: shortSocket(t), done: make(chan error, 1)}
	var src driver.Source = rbddriver.New(p.src)
	if wrap != nil {
		src = wrap(src)
	}
	if dopts.Name == "" {
		dopts.Name = "rbd.csi.ceph.com"
	}
	if dopts.BlockMetadataType == csi.BlockMetadataType_UNKNOWN {
		dopts.BlockMetadataType = csi.BlockMetadataType_VARIABLE_LENGTH
	}
	d, err := driver.New(src, dopts)
	if err != nil {
		p.src.Close()
		t.Fatal(err)
	}
	p.svc = &recordingServices{Driver: d, done: make(chan handlerRecord, 1024)}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(p.logs), textlogger.Verbosity(10)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	p.cancel = cancel
	ready := make(chan struct{})
	go func() {
		p.done <- server.Run(ctx, server.Config{Endpoint: "unix://" + p.sock, Services: p.svc, GracePeriod: 2 * time.Second,
			Ready: func() { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-p.done:
		cancel()
		p.src.Close()
		t.Fatalf("server.Run: %v", err)
	}
	p.conn, err = grpc.NewClient("unix://"+p.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.sm = csi.NewSnapshotMetadataClient(p.conn)
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop closes the client connection, stops the server, closes the source,
// and checks that the socket is gone.
func (p *inProc) stop(t testing.TB) {
	t.Helper()
	if p.stopped {
		return
	}
	p.stopped = true
	p.conn.Close()
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("server.Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("server.Run still running 30 s after its context ended")
	}
	p.src.Close()
	if _, err := os.Lstat(p.sock); err == nil {
		t.Errorf("the server left its socket %s behind", p.sock)
	}
}

// waitRefs waits until the source holds no reference to a cluster
// connection: every Diff closed, no Open waiting.
func (p *inProc) waitRefs(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := p.src.Stats()
		if st.Refs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, the source still holds %d references (%+v): a Diff was not closed", st.Refs, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// open starts r on the in-process server, like rsmServer.open.
func (p *inProc) open(ctx context.Context, r metaReq) (func() (metaResponse, error), error) {
	s := &rsmServer{sm: p.sm}
	return s.open(ctx, r)
}

// call runs r to its end, like rsmServer.call.
func (p *inProc) call(ctx context.Context, r metaReq) metaStream {
	s := &rsmServer{sm: p.sm}
	return s.call(ctx, r)
}

// slowReader connects to the server on sock with gRPC's flow-control
// windows fixed at 64 KiB (no BDP growth): a client on it that reads
// slowly, or not at all, holds the server a few thousand small tuples in,
// with most of the diff still to run. The connection is closed when the
// test ends.
func slowReader(t testing.TB, sock string) *rsmServer {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &rsmServer{sm: csi.NewSnapshotMetadataClient(cc)}
}

// notOK reports whether err is a gRPC status other than OK.
func notOK(err error) bool { return err != nil && status.Code(err) != codes.OK }
