package driver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver/drivertest"
)

const mib = 1 << 20

// serve starts d on an in-memory listener and returns a connected client.
func serve(t testing.TB, d *driver.Driver, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	return serveDial(t, d, nil, opts...)
}

// serveDial is serve with options for the client's connection.
func serveDial(t testing.TB, d *driver.Driver, dial []grpc.DialOption, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterSnapshotMetadataServer(srv, d)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
	})
	return conn
}

func newDriver(t testing.TB, src driver.Source, typ csi.BlockMetadataType, block int64) *driver.Driver {
	t.Helper()
	d, err := driver.New(src, driver.Options{Name: "rbd.csi.ceph.com", Version: "test", BlockMetadataType: typ, FixedBlockSize: block})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// fixture has snapshots s1 and s2 of a 64 MiB volume, and snapshot
// other of a 10 MiB volume.
var (
	s1Extents    = []driver.Extent{{Offset: 0, Length: 4096}, {Offset: mib, Length: 8192}, {Offset: mib + 8192, Length: 4096}, {Offset: 5 * mib, Length: mib}, {Offset: 63 * mib, Length: mib}}
	s2Extents    = []driver.Extent{{Offset: 0, Length: 8192}, {Offset: mib, Length: 12288}, {Offset: 2 * mib, Length: 4096}, {Offset: 5 * mib, Length: mib}, {Offset: 40 * mib, Length: mib}, {Offset: 63 * mib, Length: mib}}
	deltaExtents = []driver.Extent{{Offset: 4096, Length: 4096}, {Offset: 2*mib - 100, Length: 4196}, {Offset: 40 * mib, Length: mib}, {Offset: 40*mib + mib, Length: 4096}}
)

func fixture() *drivertest.Source {
	src := drivertest.NewSource()
	src.Add(&drivertest.Volume{
		Capacity:  64 * mib,
		Allocated: map[string][]driver.Extent{"s1": s1Extents, "s2": s2Extents},
		Delta:     map[string][]driver.Extent{"s1>s2": deltaExtents},
	})
	src.Add(&drivertest.Volume{
		Capacity:  10 * mib,
		Allocated: map[string][]driver.Extent{"other": {{Offset: 0, Length: 10 * mib}}},
	})
	return src
}

// response is what both RPCs' messages have in common.
type response interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}

// result is a whole stream as a client saw it.
type result struct {
	pages  [][]*csi.BlockMetadata
	types  map[csi.BlockMetadataType]bool
	caps   map[int64]bool
	tuples []driver.Extent
}

func recvAll[T response](recv func() (T, error)) (result, error) {
	r := result{types: map[csi.BlockMetadataType]bool{}, caps: map[int64]bool{}}
	for {
		m, err := recv()
		if err == io.EOF {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		r.pages = append(r.pages, m.GetBlockMetadata())
		r.types[m.GetBlockMetadataType()] = true
		r.caps[m.GetVolumeCapacityBytes()] = true
		for _, b := range m.GetBlockMetadata() {
			r.tuples = append(r.tuples, driver.Extent{Offset: b.ByteOffset, Length: b.SizeBytes})
		}
	}
}

func allocated(t testing.TB, conn *grpc.ClientConn, req *csi.GetMetadataAllocatedRequest) (result, error) {
	t.Helper()
	s, err := csi.NewSnapshotMetadataClient(conn).GetMetadataAllocated(context.Background(), req)
	if err != nil {
		return result{}, err
	}
	return recvAll(s.Recv)
}

func delta(t testing.TB, conn *grpc.ClientConn, req *csi.GetMetadataDeltaRequest) (result, error) {
	t.Helper()
	s, err := csi.NewSnapshotMetadataClient(conn).GetMetadataDelta(context.Background(), req)
	if err != nil {
		return result{}, err
	}
	return recvAll(s.Recv)
}

var errMidStream = errors.New("osd went away")

// refusedLogin is a Source error that says the credentials were refused; it
// is also fs.ErrPermission, as rbd's is.
type refusedLogin struct{}

func (refusedLogin) Error() string         { return "authentication failed" }
func (refusedLogin) Unwrap() error         { return fs.ErrPermission }
func (refusedLogin) Unauthenticated() bool { return true }

// changedMeanwhile is a Source error that says another client changed a
// snapshot while the diff read it, as rbd's errConflict does.
type changedMeanwhile struct{}

func (changedMeanwhile) Error() string { return "parent flattened meanwhile" }
func (changedMeanwhile) Aborted() bool { return true }

func TestErrorCodes(t *testing.T) {
	secrets := map[string]string{"userID": "admin", "userKey": "AQ=="}
	tests := []struct {
		name     string
		openErr  error
		failAt   int // BeforeExtent fails at this extent; -1: never
		failErr  error
		alloc    *csi.GetMetadataAllocatedRequest
		delta    *csi.GetMetadataDeltaRequest
		secrets  map[string]string // instead of the default
		wantCode codes.Code
	}{
		{name: "allocated id at the spec's limit", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: long(128)}, wantCode: codes.NotFound},
		{name: "allocated id beyond the spec's limit", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: long(129)}, wantCode: codes.InvalidArgument},
		{name: "allocated id of a MiB", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: long(mib)}, wantCode: codes.InvalidArgument},
		{name: "delta base beyond the spec's limit", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: long(4096), TargetSnapshotId: "s2"}, wantCode: codes.InvalidArgument},
		{name: "delta target beyond the spec's limit", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: long(200)}, wantCode: codes.InvalidArgument},
		{name: "secrets beyond the spec's limit", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"}, secrets: map[string]string{"userID": "admin", "userKey": long(5000)}, wantCode: codes.InvalidArgument},
		{name: "allocated ok", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"}, wantCode: codes.OK},
		{name: "allocated no id", alloc: &csi.GetMetadataAllocatedRequest{}, wantCode: codes.InvalidArgument},
		{name: "allocated negative max", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", MaxResults: -1}, wantCode: codes.InvalidArgument},
		{name: "allocated negative offset", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", StartingOffset: -1}, wantCode: codes.OutOfRange},
		{name: "allocated offset at capacity", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", StartingOffset: 64 * mib}, wantCode: codes.OK},
		{name: "allocated offset beyond capacity", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", StartingOffset: 64*mib + 1}, wantCode: codes.OutOfRange},
		{name: "allocated unknown", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "nope"}, wantCode: codes.NotFound},
		{name: "allocated huge max", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", MaxResults: 1<<31 - 1}, wantCode: codes.OK},
		{name: "open invalid", openErr: fmt.Errorf("parse: %w", fs.ErrInvalid), alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"}, wantCode: codes.InvalidArgument},
		{name: "open permission", openErr: fmt.Errorf("connect: %w", fs.ErrPermission), alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"}, wantCode: codes.PermissionDenied},
		{name: "open refused login", openErr: fmt.Errorf("connect: %w", refusedLogin{}), delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2"}, wantCode: codes.Unauthenticated},
		{name: "open unsupported", openErr: fmt.Errorf("flattened: %w", errors.ErrUnsupported), delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2"}, wantCode: codes.FailedPrecondition},
		{name: "open unavailable", openErr: fmt.Errorf("mon: %w", os.ErrDeadlineExceeded), alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"}, wantCode: codes.Unavailable},
		{name: "open other", openErr: errors.New("boom"), alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"}, wantCode: codes.Internal},
		{name: "allocated fails mid-stream", failAt: 3, failErr: errMidStream, alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", MaxResults: 1}, wantCode: codes.Internal},
		{name: "delta times out mid-stream", failAt: 3, failErr: fmt.Errorf("osd op: %w", os.ErrDeadlineExceeded), delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2", MaxResults: 1}, wantCode: codes.Unavailable},
		{name: "delta base removed mid-stream", failAt: 3, failErr: fmt.Errorf("base snapshot removed: %w", fs.ErrNotExist), delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2", MaxResults: 1}, wantCode: codes.NotFound},
		{name: "allocated parent changed mid-stream", failAt: 3, failErr: fmt.Errorf("check: %w", changedMeanwhile{}), alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", MaxResults: 1}, wantCode: codes.Aborted},
		{name: "delta ok", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2"}, wantCode: codes.OK},
		{name: "delta no base", delta: &csi.GetMetadataDeltaRequest{TargetSnapshotId: "s2"}, wantCode: codes.InvalidArgument},
		{name: "delta no target", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1"}, wantCode: codes.InvalidArgument},
		{name: "delta unknown base", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "nope", TargetSnapshotId: "s2"}, wantCode: codes.NotFound},
		{name: "delta unknown target", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "nope"}, wantCode: codes.NotFound},
		{name: "delta different volumes", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "other", TargetSnapshotId: "s2"}, wantCode: codes.InvalidArgument},
		{name: "delta negative offset", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2", StartingOffset: -4096}, wantCode: codes.OutOfRange},
		{name: "delta offset beyond", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2", StartingOffset: 1 << 40}, wantCode: codes.OutOfRange},
		{name: "delta negative max", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2", MaxResults: -5}, wantCode: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := fixture()
			src.OpenErr = tt.openErr
			if tt.failErr != nil {
				src.BeforeExtent = func(_ context.Context, i int) error {
					if i == tt.failAt {
						return tt.failErr
					}
					return nil
				}
			}
			conn := serve(t, newDriver(t, src, csi.BlockMetadataType_VARIABLE_LENGTH, 0))
			var err error
			sec := secrets
			if tt.secrets != nil {
				sec = tt.secrets
			}
			if tt.alloc != nil {
				tt.alloc.Secrets = sec
				_, err = allocated(t, conn, tt.alloc)
			} else {
				tt.delta.Secrets = sec
				_, err = delta(t, conn, tt.delta)
			}
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code = %v (%.300v), want %v", got, err, tt.wantCode)
			}
			if err != nil && status.Convert(err).Message() == "" {
				t.Errorf("status %v has no message", err)
			}
			// A status quotes no more than the spec's limit of a client's
			// string, and never a secret.
			if msg := status.Convert(err).Message(); len(msg) > 256 || strings.Contains(msg, long(129)) || !utf8.ValidString(msg) {
				t.Errorf("status message of %d bytes: %.300q", len(msg), msg)
			}
			waitClosed(t, src)
		})
	}
}

// long is an ID of n bytes.
func long(n int) string { return strings.Repeat("x", n) }

// waitClosed checks that every diff the source opened was closed. The
// server closes it as its handler returns, which may be just after the
// client saw the end of the stream.
func waitClosed(t testing.TB, src *drivertest.Source) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for src.OpenDiffs() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d diffs left open", src.OpenDiffs())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPaging(t *testing.T) {
	types := []struct {
		typ   csi.BlockMetadataType
		block int64
	}{
		{csi.BlockMetadataType_VARIABLE_LENGTH, 0},
		{csi.BlockMetadataType_FIXED_LENGTH, 4096},
		{csi.BlockMetadataType_FIXED_LENGTH, 3000}, // a grid that ends past the capacity
		{csi.BlockMetadataType_FIXED_LENGTH, mib},
	}
	for _, ty := range types {
		conn := serve(t, newDriver(t, fixture(), ty.typ, ty.block))
		fixed := ty.typ == csi.BlockMetadataType_FIXED_LENGTH
		for _, max := range []int32{0, 1, 2, 3, 1000} {
			for _, start := range []int64{0, 1, 4095, 4096, 8191, mib + 100, 2*mib - 50, 40*mib + mib + 4095, 63 * mib, 64*mib - 1, 64 * mib} {
				name := fmt.Sprintf("%v/%d/max=%d/start=%d", ty.typ, ty.block, max, start)
				pageSize := int(max)
				if pageSize == 0 {
					pageSize = 1 << 30
				}
				check := func(kind string, r result, err error, extents []driver.Extent) {
					if err != nil {
						t.Fatalf("%s %s: %v", name, kind, err)
					}
					got := driver.CheckPages(t, r.pages, pageSize, fixed, ty.block, start, 64*mib)
					want := driver.Reference(fixed, ty.block, start, 64*mib, extents)
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("%s %s: -want +got:\n%s", name, kind, diff)
					}
					if len(r.pages) > 0 && (len(r.types) != 1 || !r.types[ty.typ] || len(r.caps) != 1 || !r.caps[64*mib]) {
						t.Fatalf("%s %s: types %v, capacities %v", name, kind, r.types, r.caps)
					}
				}
				r, err := allocated(t, conn, &csi.GetMetadataAllocatedRequest{SnapshotId: "s2", StartingOffset: start, MaxResults: max})
				check("allocated", r, err, s2Extents)
				r, err = delta(t, conn, &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2", StartingOffset: start, MaxResults: max})
				check("delta", r, err, deltaExtents)
			}
		}
	}
}

// TestResume checks the spec's continuation rule: a client that resumes
// from the byte after the last tuple it received gets, in all, exactly the
// tuples of one uninterrupted stream.
func TestResume(t *testing.T) {
	for _, typ := range []csi.BlockMetadataType{csi.BlockMetadataType_VARIABLE_LENGTH, csi.BlockMetadataType_FIXED_LENGTH} {
		conn := serve(t, newDriver(t, fixture(), typ, 4096))
		full, err := allocated(t, conn, &csi.GetMetadataAllocatedRequest{SnapshotId: "s2"})
		if err != nil {
			t.Fatal(err)
		}
		var got []driver.Extent
		next := int64(0)
		for range len(full.tuples) + 1 {
			r, err := allocated(t, conn, &csi.GetMetadataAllocatedRequest{SnapshotId: "s2", StartingOffset: next, MaxResults: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.tuples) == 0 {
				break
			}
			got = append(got, r.tuples[0]) // the stream "breaks" after one tuple
			next = r.tuples[0].Offset + r.tuples[0].Length
		}
		if diff := cmp.Diff(full.tuples, got); diff != "" {
			t.Errorf("%v: resumed stream differs, -full +resumed:\n%s", typ, diff)
		}
	}
}

// TestCancel checks that a client's cancel stops the diff at once, closes
// the snapshot, and that the handler does not end with OK.
func TestCancel(t *testing.T) {
	const n = 1000000
	extents := make([]driver.Extent, n)
	for i := range extents {
		extents[i] = driver.Extent{Offset: int64(i) * 8192, Length: 4096}
	}
	src := drivertest.NewSource()
	src.Add(&drivertest.Volume{Capacity: n * 8192, Allocated: map[string][]driver.Extent{"big": extents}})
	var delivered atomic.Int64
	src.BeforeExtent = func(ctx context.Context, i int) error {
		delivered.Store(int64(i))
		return nil
	}
	handlerErr := make(chan error, 1)
	conn := serve(t, newDriver(t, src, csi.BlockMetadataType_VARIABLE_LENGTH, 0),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			err := h(srv, ss)
			handlerErr <- err
			return err
		}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := csi.NewSnapshotMetadataClient(conn).GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: "big", MaxResults: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-handlerErr:
		if status.Code(err) != codes.Canceled {
			t.Errorf("handler ended with %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not stop after the cancel")
	}
	if d := delivered.Load(); d >= n-1 {
		t.Errorf("the diff ran to the end (%d extents) after the cancel", d)
	}
	waitClosed(t, src)
}

func TestIdentity(t *testing.T) {
	var notReady error
	d, err := driver.New(fixture(), driver.Options{
		Name: "rbd.csi.ceph.com", Version: "v9", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
		Ready: func() error { return notReady },
	})
	if err != nil {
		t.Fatal(err)
	}
	id := csi.NewIdentityClient(serve(t, d))
	ctx := context.Background()
	info, err := id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.Name != "rbd.csi.ceph.com" || info.VendorVersion != "v9" {
		t.Errorf("GetPluginInfo = %v, %v", info, err)
	}
	caps, err := id.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	want := &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{Type: &csi.PluginCapability_Service_{
		Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE}}}}}
	if diff := cmp.Diff(want, caps, protocmp.Transform()); err != nil || diff != "" {
		t.Errorf("GetPluginCapabilities: %v, -want +got:\n%s", err, diff)
	}
	if p, err := id.Probe(ctx, &csi.ProbeRequest{}); err != nil || !p.GetReady().GetValue() {
		t.Errorf("Probe = %v, %v, want ready", p, err)
	}
	// Not ready is ready=false, not an error: the sidecar waits on the
	// former and exits on the latter.
	notReady = errors.New("cluster config unreadable")
	if p, err := id.Probe(ctx, &csi.ProbeRequest{}); err != nil || p.GetReady() == nil || p.GetReady().GetValue() {
		t.Errorf("Probe when not ready = %v, %v; want ready=false", p, err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, o := range []driver.Options{
		{Name: "x", BlockMetadataType: csi.BlockMetadataType_FIXED_LENGTH},
		{Name: "x", BlockMetadataType: csi.BlockMetadataType_UNKNOWN},
		{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH},
	} {
		if _, err := driver.New(fixture(), o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

type observed struct {
	method string
	tuples int
	bytes  int64
}

type recorder struct {
	mu  sync.Mutex
	got []observed
}

func (r *recorder) Streamed(method string, tuples int, bytes int64, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, observed{method, tuples, bytes})
}

// TestObserverNamesTheMethod checks that each RPC's figures are recorded
// under its own name, with what the client received.
func TestObserverNamesTheMethod(t *testing.T) {
	rec := &recorder{}
	d, err := driver.New(fixture(), driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	conn := serve(t, d)
	ra, err := allocated(t, conn, &csi.GetMetadataAllocatedRequest{SnapshotId: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := delta(t, conn, &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	sum := func(r result) (n int, b int64) {
		for _, e := range r.tuples {
			n++
			b += e.Length
		}
		return n, b
	}
	na, ba := sum(ra)
	nd, bd := sum(rd)
	want := []observed{{driver.MethodAllocated, na, ba}, {driver.MethodDelta, nd, bd}}
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.mu.Lock()
		got := append([]observed(nil), rec.got...)
		rec.mu.Unlock()
		if len(got) == 2 || time.Now().After(deadline) {
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(observed{})); diff != "" {
				t.Errorf("-want +got:\n%s", diff)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// FuzzRequests sends arbitrary requests of both RPCs through gRPC: the
// server never panics, answers only with the codes the spec allows for bad
// input, and whatever it streams keeps the spec's invariants.
func FuzzRequests(f *testing.F) {
	f.Add("s1", "s2", int64(0), int32(0), false)
	f.Add("", "s2", int64(-1), int32(-1), true)
	f.Add("s2", "", int64(64*mib), int32(1), true)
	f.Add("s1", "s2", int64(1<<62), int32(1<<31-1), false)
	d, err := driver.New(fixture(), driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_FIXED_LENGTH, FixedBlockSize: 4096})
	if err != nil {
		f.Fatal(err)
	}
	conn := serve(f, d)
	allowed := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.OutOfRange: true}
	f.Fuzz(func(t *testing.T, base, target string, start int64, max int32, isDelta bool) {
		if !utf8.ValidString(base) || !utf8.ValidString(target) {
			t.Skip("protobuf strings are UTF-8: no client can send this")
		}
		var r result
		var err error
		if isDelta {
			r, err = delta(t, conn, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: start, MaxResults: max})
		} else {
			r, err = allocated(t, conn, &csi.GetMetadataAllocatedRequest{SnapshotId: target, StartingOffset: start, MaxResults: max})
		}
		if !allowed[status.Code(err)] {
			t.Fatalf("code %v (%v) for base %q target %q start %d max %d", status.Code(err), err, base, target, start, max)
		}
		if err != nil {
			return
		}
		pageSize := int(max)
		if pageSize == 0 {
			pageSize = 1 << 30
		}
		driver.CheckPages(t, r.pages, pageSize, true, 4096, start, 64*mib)
	})
}

// TestStalledReaderReleased opens streams whose client never reads: each
// ends with DEADLINE_EXCEEDED within about the stall timeout once gRPC's
// buffers are full, and its diff is closed; a client that reads gets
// everything.
func TestStalledReaderReleased(t *testing.T) {
	// Long enough that the reading client below, under -race on a busy
	// machine, never pauses that long between pages.
	const stall = time.Second
	src := drivertest.NewSource()
	var ext []driver.Extent
	for i := range int64(100000) {
		ext = append(ext, driver.Extent{Offset: i * 8192, Length: 4096})
	}
	src.Add(&drivertest.Volume{Capacity: 100000 * 8192, Allocated: map[string][]driver.Extent{"big": ext}})
	d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, StallTimeout: stall})
	if err != nil {
		t.Fatal(err)
	}
	// gRPC's fixed 64 KiB windows: without them the client's transport
	// grows its window and keeps taking pages for a while.
	conn := serveDial(t, d, []grpc.DialOption{grpc.WithInitialWindowSize(64 << 10), grpc.WithInitialConnWindowSize(64 << 10)})
	c := csi.NewSnapshotMetadataClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 8
	var streams []csi.SnapshotMetadata_GetMetadataAllocatedClient
	began := time.Now()
	for range n {
		s, err := c.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: "big", MaxResults: 1000})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	// Nothing reads: every diff must be closed after about the stall
	// timeout (plus the time to fill the buffers).
	for src.Opened() < n || src.OpenDiffs() > 0 {
		if time.Since(began) > 10*stall+10*time.Second {
			t.Fatalf("after %v, %d of %d diffs still open", time.Since(began), src.OpenDiffs(), src.Opened())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d stalled streams released after %v", n, time.Since(began))
	for _, s := range streams {
		r, err := recvAll(s.Recv)
		if status.Code(err) != codes.DeadlineExceeded || len(r.tuples) >= len(ext) {
			t.Fatalf("stalled stream: %d tuples, %v; want a prefix and DeadlineExceeded", len(r.tuples), err)
		}
	}
	// A client that reads is never cut off. Its gaps between pages are
	// short but not bounded on a loaded machine under -race, so it reads
	// from a driver whose stall timeout is generous.
	d, err = driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, StallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := allocated(t, serve(t, d), &csi.GetMetadataAllocatedRequest{SnapshotId: "big"})
	if err != nil || len(r.tuples) != len(ext) {
		t.Fatalf("a reading client: %d tuples, %v", len(r.tuples), err)
	}
}
