//go:build e2e

package harness

// Helpers for the tests of the server binary (RSM_SERVER_BIN): run it as a
// subprocess, call its two RPCs with the raw CSI client, check the spec's
// stream invariants, and the references it is judged against: `rbd diff`
// and the bytes of the snapshots themselves.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The cluster IDs of csi-config.json (cluster.sh): the pool's default RADOS
// namespace, and namespace ns1.
const (
	ClusterID   = "rsm-e2e"
	ClusterIDNS = "rsm-e2e-ns1"
)

// ------------------------------------------------------------- the server --

// Server is one rbd-snapshot-metadata process and a connection to it.
type Server struct {
	tb      testing.TB
	Flags   []string
	Sock    string
	logPath string
	Cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been waited for
	waitErr error

	Conn *grpc.ClientConn
	SM   csi.SnapshotMetadataClient
	ID   csi.IdentityClient
	// Hide lists strings (keys) that must appear neither in the server's
	// log nor in any status message.
	Hide []string
	// terminated is set once the test sent SIGTERM itself.
	terminated bool
}

// StartServer runs RSM_SERVER_BIN on a unix socket in a temporary folder
// with the cluster's csi-config.json and -v=2, plus extraFlags (later flags
// win), waits until it serves, and connects to it. When the test ends, it
// sends SIGTERM and checks that the server exits with 0, removes its socket
// and never logged a key; the log is printed when the test failed.
func StartServer(t testing.TB, extraFlags ...string) *Server {
	t.Helper()
	bin := ClusterEnv(t, "RSM_SERVER_BIN")
	config := filepath.Join(ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json")
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	if len(sock) > 100 { // sun_path holds 108 bytes; long test names make long temp dirs
		short, err := os.MkdirTemp("", "rsm-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		sock = filepath.Join(short, "csi.sock")
	}
	s := &Server{
		tb:      t,
		Sock:    sock,
		logPath: filepath.Join(dir, "server.log"),
		exited:  make(chan struct{}),
		Hide:    []string{ClusterEnv(t, "CEPH_CSI_KEY"), ClusterEnv(t, "CEPH_KEY")},
	}
	s.Flags = append([]string{
		"--endpoint", "unix://" + sock,
		"--clusterconfig", config,
		"-v=2",
		// Every stream of a test is over when it stops the server.
		"--grace-period=5s",
	}, extraFlags...)
	logf, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	s.Cmd = exec.Command(bin, s.Flags...)
	s.Cmd.Stdout, s.Cmd.Stderr = logf, logf
	if err := s.Cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		s.waitErr = s.Cmd.Wait()
		logf.Close()
		close(s.exited)
	}()
	t.Cleanup(s.stop)

	deadline := time.Now().Add(20 * time.Second)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		select {
		case <-s.exited:
			t.Fatalf("server %v exited before serving: %v", s.Flags, s.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %v: no socket %s after 20 s", s.Flags, sock)
		}
	}
	s.Conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("connect to %s: %v", sock, err)
	}
	s.SM = csi.NewSnapshotMetadataClient(s.Conn)
	s.ID = csi.NewIdentityClient(s.Conn)
	// The socket file exists from bind(2), a moment before listen(2): a
	// connect in between is refused, so the first call waits for the
	// connection (10 s at most) rather than fail at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.ID.Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Probe %s: %v", sock, err)
	}
	return s
}

// ServerHasPrecision reports whether the server binary knows
// --precision=mode (its -help lists the modes).
func ServerHasPrecision(t testing.TB, mode string) bool {
	t.Helper()
	out, _ := exec.Command(ClusterEnv(t, "RSM_SERVER_BIN"), "-help").CombinedOutput()
	return strings.Contains(string(out), mode+":")
}

// PID is the server's process ID.
func (s *Server) PID() int { return s.Cmd.Process.Pid }

// Running reports whether the server process is still there.
func (s *Server) Running() bool { return !Closed(s.exited) }

// Log returns what the server logged so far.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		s.tb.Errorf("read the server log: %v", err)
	}
	return string(b)
}

// Sigterm sends SIGTERM to the server, as Kubernetes does to stop a pod.
func (s *Server) Sigterm(t testing.TB) {
	t.Helper()
	s.terminated = true
	if err := s.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM the server: %v", err)
	}
}

// Wait waits up to timeout for the server to exit and returns how it
// exited; ok is false when it is still running.
func (s *Server) Wait(timeout time.Duration) (err error, ok bool) {
	select {
	case <-s.exited:
		return s.waitErr, true
	case <-time.After(timeout):
		return nil, false
	}
}

// stop is StartServer's cleanup.
func (s *Server) stop() {
	t := s.tb
	t.Helper()
	if s.Conn != nil {
		s.Conn.Close()
	}
	switch {
	case s.Running() && !s.terminated:
		if err := s.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("SIGTERM the server: %v", err)
		}
	case !s.Running() && !s.terminated:
		t.Errorf("server %v exited before the test ended: %v", s.Flags, s.waitErr)
	}
	select {
	case <-s.exited:
		if s.waitErr != nil {
			t.Errorf("server %v: exit after SIGTERM: %v, want exit status 0", s.Flags, s.waitErr)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("server %v: still running 20 s after SIGTERM; killing it", s.Flags)
		_ = s.Cmd.Process.Kill()
		<-s.exited
	}
	if _, err := os.Lstat(s.Sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server left its socket %s behind (%v)", s.Sock, err)
	}
	log := s.Log()
	for _, h := range s.Hide {
		if h != "" && strings.Contains(log, h) {
			t.Errorf("the server log %s contains a cephx key", s.logPath)
		}
	}
	if t.Failed() {
		t.Logf("server %v log:\n%s", s.Flags, Tail(log, 300))
	}
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines]\n", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "")
}

// CSISecrets are the request secrets of the Ceph-CSI-like user client.csi.
func CSISecrets(t testing.TB) map[string]string {
	t.Helper()
	return map[string]string{"userID": ClusterEnv(t, "CEPH_CSI_USER"), "userKey": ClusterEnv(t, "CEPH_CSI_KEY")}
}

// WrongKey returns key with its secret changed: still a well-formed cephx
// key, but not the user's.
func WrongKey(t testing.TB, key string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(key)
	if err != nil || len(b) <= 12 {
		t.Fatalf("not a cephx key: %v", err)
	}
	for i := 12; i < len(b); i++ {
		b[i] ^= 0x5a
	}
	return base64.StdEncoding.EncodeToString(b)
}

// ---------------------------------------------------------- calling it --

// MetaReq is a request of either RPC: GetMetadataAllocated when Base is
// empty, else GetMetadataDelta.
type MetaReq struct {
	Base, Target string
	Start        int64
	Max          int32
	Secrets      map[string]string
}

// String names the RPC and its arguments, for failure messages.
func (r MetaReq) String() string {
	if r.Base == "" {
		return fmt.Sprintf("Allocated(%s, start %d, max %d)", r.Target, r.Start, r.Max)
	}
	return fmt.Sprintf("Delta(%s, %s, start %d, max %d)", r.Base, r.Target, r.Start, r.Max)
}

// Page is one response message.
type Page struct {
	typ      csi.BlockMetadataType
	capacity int64
	Tuples   []Span
}

// MetaStream is everything one call returned: its pages, and the error that
// ended it (nil for a stream that ended with OK).
type MetaStream struct {
	Pages []Page
	Err   error
}

// Tuples returns the tuples of all pages, in order.
func (m MetaStream) Tuples() []Span {
	var all []Span
	for _, p := range m.Pages {
		all = append(all, p.Tuples...)
	}
	return all
}

// Capacity returns the capacity of the first page, -1 without pages.
func (m MetaStream) Capacity() int64 {
	if len(m.Pages) == 0 {
		return -1
	}
	return m.Pages[0].capacity
}

// response is what the messages of both RPCs have in common.
type MetaResponse interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}

// Open starts the RPC of r; recv then returns its messages.
func (s *Server) Open(ctx context.Context, r MetaReq) (recv func() (MetaResponse, error), err error) {
	if r.Base == "" {
		st, err := s.SM.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{
			SnapshotId: r.Target, StartingOffset: r.Start, MaxResults: r.Max, Secrets: r.Secrets})
		if err != nil {
			return nil, err
		}
		return func() (MetaResponse, error) { return st.Recv() }, nil
	}
	st, err := s.SM.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{
		BaseSnapshotId: r.Base, TargetSnapshotId: r.Target, StartingOffset: r.Start, MaxResults: r.Max, Secrets: r.Secrets})
	if err != nil {
		return nil, err
	}
	return func() (MetaResponse, error) { return st.Recv() }, nil
}

// ToPage takes the tuples, type and capacity out of one response.
func ToPage(m MetaResponse) Page {
	p := Page{typ: m.GetBlockMetadataType(), capacity: m.GetVolumeCapacityBytes()}
	for _, b := range m.GetBlockMetadata() {
		p.Tuples = append(p.Tuples, Span{Offset: b.GetByteOffset(), Length: b.GetSizeBytes()})
	}
	return p
}

// Call runs one RPC to its end and returns what it streamed.
func (s *Server) Call(ctx context.Context, r MetaReq) MetaStream {
	var m MetaStream
	recv, err := s.Open(ctx, r)
	if err != nil {
		m.Err = err
		return m
	}
	for {
		resp, err := recv()
		if err == io.EOF {
			return m
		}
		if err != nil {
			m.Err = err
			return m
		}
		m.Pages = append(m.Pages, ToPage(resp))
	}
}

// Get runs r, which must succeed, checks the stream's invariants, and
// returns it.
func (s *Server) Get(t testing.TB, r MetaReq) MetaStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if r.Secrets == nil {
		r.Secrets = CSISecrets(t)
	}
	m := s.Call(ctx, r)
	if m.Err != nil {
		t.Fatalf("%v: %v", r, m.Err)
	}
	CheckStream(t, r, m, s.BlockType(), s.FixedSize())
	return m
}

// BlockType is the type the server was started with.
func (s *Server) BlockType() csi.BlockMetadataType {
	for i, f := range s.Flags {
		if f == "--block-metadata-type" && i+1 < len(s.Flags) {
			return csi.BlockMetadataType(csi.BlockMetadataType_value[s.Flags[i+1]])
		}
	}
	return csi.BlockMetadataType_VARIABLE_LENGTH
}

// FixedSize is the FIXED_LENGTH tuple size the server was started with.
func (s *Server) FixedSize() int64 {
	size := int64(1 << 20) // the flag's default
	for i, f := range s.Flags {
		if f == "--fixed-block-size" && i+1 < len(s.Flags) {
			if _, err := fmt.Sscan(s.Flags[i+1], &size); err != nil {
				s.tb.Fatalf("--fixed-block-size %q: %v", s.Flags[i+1], err)
			}
		}
	}
	return size
}

// pageSize is the number of tuples in every page but the last, as the
// driver documents it (driver.go: defaultPage, maxPage): max_results, or
// 16384 when it is 0, and never more than 65536, so that a page stays far
// below gRPC's 4 MiB message limit.
func pageSize(maxResults int32) int {
	if maxResults == 0 {
		return 16384
	}
	return min(int(maxResults), 65536)
}

// CheckStream checks a successful stream against the CSI spec, and against
// the pager's documented contract (marked "contract"):
//   - every page has the type the server was started with, and one capacity;
//   - pages hold at most max_results tuples, and at least one (contract);
//     only the last page is shorter than pageSize (contract);
//   - tuples are positive, strictly ascending and never overlap, across pages;
//   - the first tuple ends after starting_offset, and none starts at or after
//     the capacity;
//   - FIXED_LENGTH: every tuple is `fixed` bytes, aligned to it (contract);
//   - VARIABLE_LENGTH: tuples lie within [starting_offset, capacity) and
//     adjacent ones are merged (contract).
func CheckStream(t testing.TB, r MetaReq, m MetaStream, typ csi.BlockMetadataType, fixed int64) {
	t.Helper()
	var prev *Span
	for i, p := range m.Pages {
		if p.typ != typ {
			t.Errorf("%v: page %d has type %v, want %v", r, i, p.typ, typ)
		}
		if p.capacity != m.Pages[0].capacity {
			t.Errorf("%v: page %d has capacity %d, page 0 %d", r, i, p.capacity, m.Pages[0].capacity)
		}
		if r.Max > 0 && len(p.Tuples) > int(r.Max) {
			t.Errorf("%v: page %d has %d tuples, more than max_results", r, i, len(p.Tuples))
		}
		if len(p.Tuples) == 0 {
			t.Errorf("%v: page %d is empty (contract)", r, i)
		}
		if i < len(m.Pages)-1 && len(p.Tuples) != pageSize(r.Max) {
			t.Errorf("%v: page %d of %d has %d tuples, want %d; only the last may be short (contract)", r, i, len(m.Pages), len(p.Tuples), pageSize(r.Max))
		}
		for j := range p.Tuples {
			b := p.Tuples[j]
			where := fmt.Sprintf("%v: page %d tuple %d %+v", r, i, j, b)
			if b.Length <= 0 || b.Offset < 0 {
				t.Fatalf("%s: size_bytes must be positive, byte_offset not negative", where)
			}
			if prev == nil && SpanEnd(b) <= r.Start {
				t.Errorf("%s: the first tuple ends at or before starting_offset %d", where, r.Start)
			}
			if prev != nil && b.Offset < SpanEnd(*prev) {
				t.Fatalf("%s: overlaps or precedes the tuple before, %+v", where, *prev)
			}
			if b.Offset >= p.capacity {
				t.Errorf("%s: starts at or after the capacity %d", where, p.capacity)
			}
			switch typ {
			case csi.BlockMetadataType_FIXED_LENGTH:
				if b.Length != fixed || b.Offset%fixed != 0 {
					t.Errorf("%s: want a %d-byte aligned block (contract)", where, fixed)
				}
			case csi.BlockMetadataType_VARIABLE_LENGTH:
				if b.Offset < r.Start || SpanEnd(b) > p.capacity {
					t.Errorf("%s: outside [starting_offset %d, capacity %d) (contract)", where, r.Start, p.capacity)
				}
				if prev != nil && b.Offset == SpanEnd(*prev) {
					t.Errorf("%s: touches the tuple before, %+v, without being merged (contract)", where, *prev)
				}
			}
			prev = &p.Tuples[j]
		}
	}
}

// SlowReader connects to the server on sock with gRPC's flow-control
// windows fixed at 64 KiB (no BDP growth): a client on it that reads
// slowly, or not at all, holds the server a few thousand small tuples in,
// with most of the diff still to run. The connection is closed when the
// test ends.
func SlowReader(t testing.TB, sock string) *Server {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &Server{SM: csi.NewSnapshotMetadataClient(cc)}
}
