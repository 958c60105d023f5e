//go:build e2e

package harness

// An in-process server (rbd.Source + rbddriver + driver +
// server.Run) whose source, handlers and goroutines the test can inspect.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbddriver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/server"
)

// HandlerRecord is what one RPC's handler did, seen from the services
// wrapper: how it returned, and how many tuples it sent.
type HandlerRecord struct {
	method   string
	Err      error
	Panicked any
	Tuples   int
}

// RecordingServices wraps the driver's handlers of both SnapshotMetadata
// RPCs to record how each returned: server.Run takes no interceptor.
type RecordingServices struct {
	*driver.Driver
	mu      sync.Mutex
	records []HandlerRecord
	Done    chan HandlerRecord // each record, as it is made
}

func (r *RecordingServices) record(h HandlerRecord) {
	r.mu.Lock()
	r.records = append(r.records, h)
	r.mu.Unlock()
	select {
	case r.Done <- h:
	default:
	}
}

// Next waits up to timeout for the next handler to return.
func (r *RecordingServices) Next(t testing.TB, timeout time.Duration) HandlerRecord {
	t.Helper()
	select {
	case h := <-r.Done:
		return h
	case <-time.After(timeout):
		t.Fatalf("no handler returned within %v", timeout)
		return HandlerRecord{}
	}
}

func (r *RecordingServices) handle(method string, h *HandlerRecord, err *error) {
	h.method, h.Err = method, *err
	if p := recover(); p != nil {
		h.Panicked = p
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

// GetMetadataAllocated runs the driver's handler and records how it
// returned and how many tuples it sent.
func (r *RecordingServices) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, s csi.SnapshotMetadata_GetMetadataAllocatedServer) (err error) {
	var h HandlerRecord
	defer r.handle("GetMetadataAllocated", &h, &err)
	return r.Driver.GetMetadataAllocated(req, countingAllocated{s, &h.Tuples})
}

// GetMetadataDelta is GetMetadataAllocated's twin.
func (r *RecordingServices) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, s csi.SnapshotMetadata_GetMetadataDeltaServer) (err error) {
	var h HandlerRecord
	defer r.handle("GetMetadataDelta", &h, &err)
	return r.Driver.GetMetadataDelta(req, countingDelta{s, &h.Tuples})
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

// InProc is a server in the test process, on a socket in a temporary
// folder, logging at -v=10 into logs.
type InProc struct {
	Src  *rsm.Source
	Svc  *RecordingServices
	Logs *syncBuf
	Sock string
	conn *grpc.ClientConn
	sm   csi.SnapshotMetadataClient

	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// StartInProc serves the cluster's snapshots in process, with the given
// rbd options; wrap, when set, wraps the driver's source (a fault
// injector). Stop shuts it down; it also runs when the test ends.
func StartInProc(t testing.TB, opts rsm.Options, wrap func(driver.Source) driver.Source, dopts driver.Options) *InProc {
	t.Helper()
	opts.ConfigPath = filepath.Join(ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json")
	p := &InProc{Src: rsm.NewSource(opts), Logs: &syncBuf{}, Sock: ShortSocket(t), done: make(chan error, 1)}
	var src driver.Source = rbddriver.New(p.Src)
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
		p.Src.Close()
		t.Fatal(err)
	}
	p.Svc = &RecordingServices{Driver: d, Done: make(chan HandlerRecord, 1024)}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(p.Logs), textlogger.Verbosity(10)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	p.cancel = cancel
	ready := make(chan struct{})
	go func() {
		p.done <- server.Run(ctx, server.Config{Endpoint: "unix://" + p.Sock, Services: p.Svc, GracePeriod: 2 * time.Second,
			Ready: func() { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-p.done:
		cancel()
		p.Src.Close()
		t.Fatalf("server.Run: %v", err)
	}
	p.conn, err = grpc.NewClient("unix://"+p.Sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.sm = csi.NewSnapshotMetadataClient(p.conn)
	t.Cleanup(func() { p.Stop(t) })
	return p
}

// Stop closes the client connection, stops the server, closes the source,
// and checks that the socket is gone.
func (p *InProc) Stop(t testing.TB) {
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
	p.Src.Close()
	if _, err := os.Lstat(p.Sock); err == nil {
		t.Errorf("the server left its socket %s behind", p.Sock)
	}
}

// WaitRefs waits until the source holds no reference to a cluster
// connection: every Diff closed, no Open waiting.
func (p *InProc) WaitRefs(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := p.Src.Stats()
		if st.Refs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, the source still holds %d references (%+v): a Diff was not closed", st.Refs, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Open starts r on the in-process server, like Server.Open.
func (p *InProc) Open(ctx context.Context, r MetaReq) (func() (MetaResponse, error), error) {
	s := &Server{SM: p.sm}
	return s.Open(ctx, r)
}

// Call runs r to its end, like Server.Call.
func (p *InProc) Call(ctx context.Context, r MetaReq) MetaStream {
	s := &Server{SM: p.sm}
	return s.Call(ctx, r)
}
