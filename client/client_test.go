package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver/drivertest"
)

// breaker fails the stream with code after every n-th message sent, to
// play a connection that keeps breaking.
type breaker struct {
	n     int
	code  codes.Code
	calls atomic.Int64
	// refuse is how many calls are refused with ABORTED before the
	// handler runs, as a server at its stream limit does.
	refuse int64
}

type breakingStream struct {
	grpc.ServerStream
	b    *breaker
	sent int
}

func (s *breakingStream) SendMsg(m any) error {
	if s.sent == s.b.n {
		return status.Error(s.b.code, "connection broke (test)")
	}
	s.sent++
	return s.ServerStream.SendMsg(m)
}

func (b *breaker) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if b.calls.Add(1) <= b.refuse {
		return status.Error(codes.Aborted, "at the limit of streams (test)")
	}
	if b.n < 0 {
		return h(srv, ss)
	}
	return h(srv, &breakingStream{ServerStream: ss, b: b})
}

func newClient(t *testing.T, typ csi.BlockMetadataType, b *breaker) *client.Client {
	t.Helper()
	src := drivertest.NewSource()
	var ext []driver.Extent
	for i := range int64(300) {
		ext = append(ext, driver.Extent{Offset: i*3*4096 + i%7*512, Length: 4096 + i%3*4096})
	}
	src.Add(&drivertest.Volume{Capacity: 300 * 3 * 4096, Allocated: map[string][]driver.Extent{"s1": ext[:100], "s2": ext}, Delta: map[string][]driver.Extent{"s1>s2": ext[100:]}})
	d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: typ, FixedBlockSize: 8192})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.StreamInterceptor(b.intercept))
	csi.RegisterSnapshotMetadataServer(srv, d)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); srv.Stop() })
	c := client.New(conn)
	c.NewBackOff = func() backoff.BackOff { return &backoff.ZeroBackOff{} }
	return c
}

func collect(ctx context.Context, c *client.Client, req client.Request) ([]client.Extent, client.Progress, error) {
	var got []client.Extent
	p, err := c.Stream(ctx, req, func(p client.Page) error {
		got = append(got, p.Extents...)
		return nil
	})
	return got, p, err
}

// TestResumeEqualsUninterrupted breaks streams after every n-th page and
// checks that the client still hands over exactly the uninterrupted stream.
func TestResumeEqualsUninterrupted(t *testing.T) {
	ctx := context.Background()
	for _, typ := range []csi.BlockMetadataType{csi.BlockMetadataType_VARIABLE_LENGTH, csi.BlockMetadataType_FIXED_LENGTH} {
		for _, req := range []client.Request{{Target: "s2"}, {Base: "s1", Target: "s2"}, {Target: "s2", StartingOffset: 5000}} {
			req.MaxResults = 7
			want, _, err := collect(ctx, newClient(t, typ, &breaker{n: -1}), req)
			if err != nil {
				t.Fatal(err)
			}
			// A cut after every page boundary: n pages of each stream
			// arrive, then it breaks (n = 0: it never makes progress).
			pages := (len(want)+int(req.MaxResults)-1)/int(req.MaxResults) + 1
			for n := 0; n <= pages; n++ {
				for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.Aborted} {
					if (code == codes.DeadlineExceeded && n%5 != 1) || (code == codes.Aborted && n%5 != 2) {
						continue
					}
					name := fmt.Sprintf("%v %+v break after %d with %v", typ, req, n, code)
					b := &breaker{n: n, code: code}
					c := newClient(t, typ, b)
					c.MaxRetries = 3
					got, p, err := collect(ctx, c, req)
					if n == 0 {
						// No progress at all: the retries run out.
						if status.Code(errors.Unwrap(err)) != code || p.Extents != 0 {
							t.Errorf("%s: %v, %+v; want giving up with %v", name, err, p, code)
						}
						continue
					}
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("%s: -uninterrupted +resumed:\n%s", name, diff)
					}
					// Streams of fewer than n+1 pages end before the cut.
					broke := n*int(req.MaxResults) < len(want)
					if broke != (p.Retries > 0) || p.Extents != int64(len(want)) {
						t.Errorf("%s: progress %+v", name, p)
					}
				}
			}
		}
	}
}

// TestRetriesAtTheLimit plays a server at its --max-streams limit, which
// refuses streams with ABORTED before sending anything: the client backs
// off and tries again until a slot is free.
func TestRetriesAtTheLimit(t *testing.T) {
	want, _, err := collect(context.Background(), newClient(t, csi.BlockMetadataType_VARIABLE_LENGTH, &breaker{n: -1}), client.Request{Target: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	b := &breaker{n: -1}
	c := newClient(t, csi.BlockMetadataType_VARIABLE_LENGTH, b)
	var backoffs atomic.Int64
	c.NewBackOff = func() backoff.BackOff {
		return &countingBackOff{n: &backoffs}
	}
	b.refuse = 3
	got, p, err := collect(context.Background(), c, client.Request{Target: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("-uninterrupted +after refusals:\n%s", diff)
	}
	if p.Retries != 3 || backoffs.Load() != 3 || b.calls.Load() != 4 {
		t.Errorf("progress %+v, %d backoffs, %d calls; want 3 retries after 3 backoffs", p, backoffs.Load(), b.calls.Load())
	}
}

type countingBackOff struct{ n *atomic.Int64 }

func (b *countingBackOff) NextBackOff() time.Duration { b.n.Add(1); return time.Millisecond }
func (b *countingBackOff) Reset()                     {}

func TestNonRetryableReturnsAtOnce(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.OutOfRange, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.Internal} {
		b := &breaker{n: 1, code: code}
		c := newClient(t, csi.BlockMetadataType_VARIABLE_LENGTH, b)
		_, p, err := collect(context.Background(), c, client.Request{Target: "s2", MaxResults: 5})
		if status.Code(err) != code || b.calls.Load() != 1 || p.Extents != 5 {
			t.Errorf("%v: err %v after %d calls, progress %+v", code, err, b.calls.Load(), p)
		}
	}
	c := newClient(t, csi.BlockMetadataType_VARIABLE_LENGTH, &breaker{n: -1})
	if _, _, err := collect(context.Background(), c, client.Request{Target: "missing"}); status.Code(err) != codes.NotFound {
		t.Errorf("missing snapshot: %v", err)
	}
}

func TestCallerErrorStops(t *testing.T) {
	b := &breaker{n: -1}
	c := newClient(t, csi.BlockMetadataType_VARIABLE_LENGTH, b)
	stop := errors.New("disk full")
	pages := 0
	p, err := c.Stream(context.Background(), client.Request{Target: "s2", MaxResults: 10}, func(client.Page) error {
		pages++
		if pages == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || b.calls.Load() != 1 || p.Extents != 20 {
		t.Errorf("err %v, calls %d, progress %+v", err, b.calls.Load(), p)
	}
}

func TestContextEndsRetries(t *testing.T) {
	c := newClient(t, csi.BlockMetadataType_VARIABLE_LENGTH, &breaker{n: 0, code: codes.Unavailable})
	c.NewBackOff = func() backoff.BackOff { return backoff.NewConstantBackOff(time.Hour) }
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, _, err := collect(ctx, c, client.Request{Target: "s2"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want the context's deadline", err)
	}
}

// rawServer sends the pages it is given, whatever they hold: a broken
// server.
type rawServer struct {
	csi.UnimplementedSnapshotMetadataServer
	typ      csi.BlockMetadataType
	capacity int64
	pages    [][]*csi.BlockMetadata
}

func (r *rawServer) GetMetadataAllocated(_ *csi.GetMetadataAllocatedRequest, s csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	for _, p := range r.pages {
		if err := s.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: r.typ, VolumeCapacityBytes: r.capacity, BlockMetadata: p}); err != nil {
			return err
		}
	}
	return nil
}

func rawClient(t *testing.T, r *rawServer) *client.Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	csi.RegisterSnapshotMetadataServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); srv.Stop() })
	return client.New(conn)
}

// TestRefusesBrokenTuples: tuples that overflow int64, go backwards
// (within a page or across pages, repeated ones too), or lie beyond the
// capacity fail the stream with ErrInconsistent, and the caller never sees
// them; a FIXED_LENGTH block that holds the last byte is fine.
func TestRefusesBrokenTuples(t *testing.T) {
	const maxInt64 = 1<<63 - 1
	tup := func(off, size int64) *csi.BlockMetadata { return &csi.BlockMetadata{ByteOffset: off, SizeBytes: size} }
	variable, fixed := csi.BlockMetadataType_VARIABLE_LENGTH, csi.BlockMetadataType_FIXED_LENGTH
	for _, tc := range []struct {
		name     string
		typ      csi.BlockMetadataType
		capacity int64
		pages    [][]*csi.BlockMetadata
		ok       bool
	}{
		{"overflow", variable, maxInt64, [][]*csi.BlockMetadata{{tup(maxInt64-10, 100)}}, false},
		{"overflow fixed", fixed, maxInt64, [][]*csi.BlockMetadata{{tup(maxInt64-10, 100)}}, false},
		{"backwards in a page", variable, 1 << 20, [][]*csi.BlockMetadata{{tup(8192, 4096), tup(0, 4096)}}, false},
		{"backwards across pages", variable, 1 << 20, [][]*csi.BlockMetadata{{tup(8192, 4096)}, {tup(4096, 4096)}}, false},
		{"overlapping", fixed, 1 << 20, [][]*csi.BlockMetadata{{tup(0, 4096), tup(2048, 4096)}}, false},
		{"starts at the capacity", variable, 1 << 20, [][]*csi.BlockMetadata{{tup(0, 4096), tup(1<<20, 4096)}}, false},
		{"ends beyond the capacity", variable, 1 << 20, [][]*csi.BlockMetadata{{tup(1<<20-4096, 8192)}}, false},
		{"fixed block beyond the capacity", fixed, 1 << 20, [][]*csi.BlockMetadata{{tup(1<<20, 4096)}}, false},
		{"empty", variable, 1 << 20, [][]*csi.BlockMetadata{{tup(0, 0)}}, false},
		{"negative", variable, 1 << 20, [][]*csi.BlockMetadata{{tup(-4096, 4096)}}, false},
		{"fixed block holding the last byte", fixed, 1<<20 - 100, [][]*csi.BlockMetadata{{tup(0, 4096), tup(1<<20-4096, 4096)}}, true},
		{"good", variable, 1 << 20, [][]*csi.BlockMetadata{{tup(0, 4096), tup(4096, 4096)}, {tup(1<<20-4096, 4096)}}, true},
	} {
		c := rawClient(t, &rawServer{typ: tc.typ, capacity: tc.capacity, pages: tc.pages})
		var seen []client.Extent
		_, err := c.Stream(context.Background(), client.Request{Target: "s"}, func(p client.Page) error {
			seen = append(seen, p.Extents...)
			return nil
		})
		if tc.ok {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, client.ErrInconsistent) {
			t.Errorf("%s: %v, want ErrInconsistent", tc.name, err)
		}
		for _, e := range seen {
			if e.Offset < 0 || e.Length <= 0 || e.Offset > maxInt64-e.Length || e.Offset >= tc.capacity {
				t.Errorf("%s: the caller saw the broken tuple %+v", tc.name, e)
			}
		}
	}
}
