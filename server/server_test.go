package server_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver/drivertest"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/metrics"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/server"
)

const secretKey = "AQBsecretsecretsecretsecretsecretsecret=="

// syncBuffer is a log sink that the server's goroutines can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a server on a socket in a temporary folder, logging at the
// most verbose level into the returned buffer.
func start(t *testing.T, src *drivertest.Source, opts ...func(*server.Config)) (sock string, logs *syncBuffer, conn *grpc.ClientConn) {
	t.Helper()
	d, err := driver.New(src, driver.Options{Name: "rbd.csi.ceph.com", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH})
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(t.TempDir(), "csi.sock")
	logs = &syncBuffer{}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logs), textlogger.Verbosity(10)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		cfg := server.Config{Endpoint: "unix://" + sock, Services: d, GracePeriod: time.Second, Ready: func() { close(ready) }}
		for _, o := range opts {
			o(&cfg)
		}
		done <- server.Run(ctx, cfg)
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("socket left behind: %v", err)
		}
	})
	return sock, logs, conn
}

func source() *drivertest.Source {
	src := drivertest.NewSource()
	src.Add(&drivertest.Volume{Capacity: 1 << 20, Allocated: map[string][]driver.Extent{"c1/rbd/img@s1": {{Offset: 0, Length: 4096}}}})
	return src
}

func drain[T any](recv func() (T, error)) error {
	for {
		if _, err := recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// TestSecretsNeverLogged runs requests that succeed and fail, at the most
// verbose log level, and looks for the secret in everything logged.
func TestSecretsNeverLogged(t *testing.T) {
	_, logs, conn := start(t, source())
	c := csi.NewSnapshotMetadataClient(conn)
	secrets := map[string]string{"userID": "csi-user", "userKey": secretKey}
	for _, id := range []string{"c1/rbd/img@s1", "c1/rbd/img@missing"} {
		s, err := c.GetMetadataAllocated(context.Background(), &csi.GetMetadataAllocatedRequest{SnapshotId: id, Secrets: secrets})
		if err == nil {
			err = drain(s.Recv)
		}
		if id == "c1/rbd/img@s1" && err != nil {
			t.Fatal(err)
		}
		if err != nil && strings.Contains(err.Error(), secretKey) {
			t.Errorf("status carries the secret: %v", err)
		}
		s2, err := c.GetMetadataDelta(context.Background(), &csi.GetMetadataDeltaRequest{BaseSnapshotId: id, TargetSnapshotId: id, Secrets: secrets})
		if err == nil {
			_ = drain(s2.Recv)
		}
	}
	out := logs.String()
	if !strings.Contains(out, "c1/rbd/img@s1") || !strings.Contains(out, "Request") {
		t.Fatalf("the requests were not logged; the test proves nothing:\n%s", out)
	}
	if strings.Contains(out, secretKey) {
		t.Errorf("a secret reached the log:\n%s", out)
	}
}

// TestPanicIsInternal checks that a handler's panic ends its RPC with
// INTERNAL, and that the server goes on serving.
func TestPanicIsInternal(t *testing.T) {
	src := source()
	var once sync.Once
	src.BeforeExtent = func(context.Context, int) error {
		once.Do(func() { panic("bug") })
		return nil
	}
	_, logs, conn := start(t, src)
	c := csi.NewSnapshotMetadataClient(conn)
	req := &csi.GetMetadataAllocatedRequest{SnapshotId: "c1/rbd/img@s1"}
	s, err := c.GetMetadataAllocated(context.Background(), req)
	if err == nil {
		err = drain(s.Recv)
	}
	if status.Code(err) != codes.Internal {
		t.Fatalf("panicking handler: %v, want Internal", err)
	}
	s, err = c.GetMetadataAllocated(context.Background(), req)
	if err == nil {
		err = drain(s.Recv)
	}
	if err != nil {
		t.Fatalf("after the panic: %v", err)
	}
	if !strings.Contains(logs.String(), "Handler panicked") {
		t.Error("the panic was not logged")
	}
}

func TestHealth(t *testing.T) {
	sock, _, conn := start(t, source())
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket %v, %v; want a socket with mode 0660", fi.Mode(), err)
	}
	r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", r, err)
	}
}

func TestSocketReplacedWhenStaleRefusedWhenLive(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	// A stale socket: bound, then its listener closed without unlinking.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	d, _ := driver.New(source(), driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.Config{Endpoint: "unix://" + sock, Services: d, Ready: func() { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("stale socket not replaced: %v", err)
	}
	// A second server on the live socket must refuse, and leave it alone.
	if err := server.Run(context.Background(), server.Config{Endpoint: "unix://" + sock, Services: d}); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Errorf("second server on a live socket: %v", err)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the live socket was removed: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"unix://relative/x.sock", "http://x", "tcp://"} {
		if err := server.Run(context.Background(), server.Config{Endpoint: bad, Services: d}); err == nil {
			t.Errorf("endpoint %q accepted", bad)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestMetrics runs RPCs and scrapes /metrics: RPCs by method and code,
// tuples and bytes under the right method, no stream left in flight, and
// neither a secret nor a snapshot ID in any label.
func TestMetrics(t *testing.T) {
	m := metrics.New(func() float64 { return 3 })
	d, err := driver.New(source(), driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	sock := "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	addr := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.Config{Endpoint: sock, Services: d, Metrics: m, MetricsAddress: addr, Ready: func() { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	defer func() { cancel(); <-done }()
	conn, err := grpc.NewClient(sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := csi.NewSnapshotMetadataClient(conn)
	secrets := map[string]string{"userID": "u", "userKey": secretKey}
	for _, id := range []string{"c1/rbd/img@s1", "c1/rbd/img@s1", "c1/rbd/img@missing"} {
		s, err := c.GetMetadataAllocated(context.Background(), &csi.GetMetadataAllocatedRequest{SnapshotId: id, Secrets: secrets})
		if err == nil {
			_ = drain(s.Recv)
		}
	}
	if _, err := csi.NewIdentityClient(conn).Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	var body string
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		// The last stream's figures land as its handler returns.
		if strings.Contains(body, `rbd_snapshot_metadata_rpcs_total{code="NotFound",method="GetMetadataAllocated"} 1`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{
		`rbd_snapshot_metadata_rpcs_total{code="OK",method="GetMetadataAllocated"} 2`,
		`rbd_snapshot_metadata_rpcs_total{code="NotFound",method="GetMetadataAllocated"} 1`,
		`rbd_snapshot_metadata_rpcs_total{code="OK",method="Probe"} 1`,
		`rbd_snapshot_metadata_streamed_tuples_total{method="GetMetadataAllocated"} 2`,
		`rbd_snapshot_metadata_streamed_bytes_total{method="GetMetadataAllocated"} 8192`,
		`rbd_snapshot_metadata_streams_in_flight{method="GetMetadataAllocated"} 0`,
		`rbd_snapshot_metadata_diff_iterate_seconds_count{method="GetMetadataAllocated"} 2`,
		`rbd_snapshot_metadata_rpc_duration_seconds_count{method="GetMetadataAllocated"} 3`,
		`rbd_snapshot_metadata_cached_connections 3`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, secret := range []string{secretKey, "c1/rbd/img"} {
		if strings.Contains(body, secret) {
			t.Errorf("/metrics carries %q", secret)
		}
	}
}

// TestMaxStreams holds the limit's streams open and checks that one more
// is refused at once with ABORTED, before the source is asked for
// anything, that Identity and health are not counted, and that a freed
// slot serves again.
func TestMaxStreams(t *testing.T) {
	const limit = 3
	src := source()
	hold := make(chan struct{})
	// Each diff's first extent says that its stream holds a slot.
	entered := make(chan struct{}, limit+1)
	src.BeforeExtent = func(ctx context.Context, _ int) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-hold:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_, _, conn := start(t, src, func(c *server.Config) { c.MaxStreams = limit })
	c := csi.NewSnapshotMetadataClient(conn)
	req := &csi.GetMetadataAllocatedRequest{SnapshotId: "c1/rbd/img@s1"}
	var held []csi.SnapshotMetadata_GetMetadataAllocatedClient
	for range limit {
		s, err := c.GetMetadataAllocated(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	for i := range limit {
		select {
		case <-entered:
		case <-time.After(10 * time.Second): // a hang guard, not a bound
			t.Fatalf("%d of %d streams reached their diff", i, limit)
		}
	}
	// At once: the held streams free no slot before hold is closed, so a
	// stream that waited for one would wait until the hang guard's
	// deadline and end DeadlineExceeded, not Aborted.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.GetMetadataAllocated(ctx, req)
	if err == nil {
		err = drain(s.Recv)
	}
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "--max-streams") {
		t.Fatalf("stream beyond the limit: %v, want Aborted naming --max-streams, while the limit's streams are held", err)
	}
	if n := src.Opened(); n != limit {
		t.Errorf("the source opened %d diffs, want %d: the refused stream did work", n, limit)
	}
	if _, err := csi.NewIdentityClient(conn).Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
		t.Errorf("Probe at the limit: %v", err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health at the limit: %v", err)
	}
	close(hold)
	for _, h := range held {
		if err := drain(h.Recv); err != nil {
			t.Fatalf("held stream: %v", err)
		}
	}
	s, err = c.GetMetadataAllocated(context.Background(), req)
	if err == nil {
		err = drain(s.Recv)
	}
	if err != nil {
		t.Fatalf("after the limit's streams ended: %v", err)
	}
}

// TestOversizedIDsNotLogged sends IDs far beyond the CSI spec's 128 bytes:
// INVALID_ARGUMENT, and neither the status nor the most verbose log
// carries them whole.
func TestOversizedIDsNotLogged(t *testing.T) {
	_, logs, conn := start(t, source())
	c := csi.NewSnapshotMetadataClient(conn)
	huge := strings.Repeat("y", 1<<20)
	s, err := c.GetMetadataAllocated(context.Background(), &csi.GetMetadataAllocatedRequest{SnapshotId: huge})
	if err == nil {
		err = drain(s.Recv)
	}
	if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 300 {
		t.Fatalf("1 MiB snapshot_id: %.300v (%d bytes), want a short InvalidArgument", err, len(err.Error()))
	}
	s2, err := c.GetMetadataDelta(context.Background(), &csi.GetMetadataDeltaRequest{BaseSnapshotId: "c1/rbd/img@s1", TargetSnapshotId: huge})
	if err == nil {
		err = drain(s2.Recv)
	}
	if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 300 {
		t.Fatalf("1 MiB target_snapshot_id: %.300v, want a short InvalidArgument", err)
	}
	out := logs.String()
	if !strings.Contains(out, "beyond the CSI limit") {
		t.Fatalf("the requests were not logged; the test proves nothing:\n%.2000s", out)
	}
	if strings.Contains(out, strings.Repeat("y", 129)) {
		t.Errorf("an oversized ID reached the log whole (%d bytes of log)", len(out))
	}
}

// TestStopLeavesSuccessorsSocket: a successor replaced the socket of a
// server that is still stopping (it found it stale); the old server must
// not remove the successor's socket on its way out, but does remove its
// own.
func TestStopLeavesSuccessorsSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, _ := driver.New(source(), driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH})
	run := func() (stop func() error) {
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- server.Run(ctx, server.Config{Endpoint: "unix://" + sock, Services: d, Ready: func() { close(ready) }})
		}()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("Run: %v", err)
		}
		return func() error { cancel(); return <-done }
	}
	stop := run()
	// The successor: the old socket unlinked, a new one in its place.
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	succ, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer succ.Close()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		t.Fatalf("the successor's socket is gone after the old server stopped: %v", err)
	}
	c.Close()
	succ.Close()
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("the successor's own listener left its socket: %v", err)
	}
	// And a server alone removes its own socket.
	stop = run()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

// freezer is a TCP proxy that can stop forwarding in both directions
// without closing anything: a peer that vanished (a half-open connection).
type freezer struct {
	lis    net.Listener
	target string
	frozen chan struct{}
}

func (f *freezer) serve() {
	for {
		c, err := f.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if err != nil {
					return
				}
				select {
				case <-f.frozen:
					<-make(chan struct{}) // hold everything, forever
				default:
				}
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
		}
		go pipe(s, c)
		go pipe(c, s)
	}
}

// TestKeepaliveFreesHalfOpenPeer: a client whose connection goes silent
// mid-stream (its host vanished) no longer holds the stream: the server's
// keepalive ping goes unanswered, the server closes the connection, and the
// diff is released, although the client never cancels.
func TestKeepaliveFreesHalfOpenPeer(t *testing.T) {
	src := source()
	entered := make(chan struct{}, 1)
	src.BeforeExtent = func(ctx context.Context, _ int) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-ctx.Done() // a diff that runs until the stream ends
		return ctx.Err()
	}
	addr := freePort(t)
	d, _ := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.Config{Endpoint: "tcp://" + addr, Services: d, GracePeriod: time.Second,
			Ready: func() { close(ready) }, KeepaliveTime: 200 * time.Millisecond, KeepaliveTimeout: 200 * time.Millisecond})
	}()
	<-ready
	defer func() { cancel(); <-done }()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	f := &freezer{lis: lis, target: addr, frozen: make(chan struct{})}
	go f.serve()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := csi.NewSnapshotMetadataClient(conn).GetMetadataAllocated(context.Background(), &csi.GetMetadataAllocatedRequest{SnapshotId: "c1/rbd/img@s1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second): // a hang guard, not a bound
		t.Fatal("the stream never reached its diff")
	}
	close(f.frozen)
	began := time.Now()
	for src.OpenDiffs() > 0 {
		if time.Since(began) > 10*time.Second {
			t.Fatal("the diff of a vanished peer is still open after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the vanished peer's diff was released %v after it went silent (keepalive 200 ms + 200 ms)", time.Since(began).Round(time.Millisecond))
}
