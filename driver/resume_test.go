package driver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver/drivertest"
)

// faults fails the diffs of a fake source with a temporary error at the
// given extents, counted across all the diffs of the source: each fault
// once.
type faults struct {
	mu    sync.Mutex
	calls int
	hit   int
	at    map[int]bool
}

func (f *faults) reset(at []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls, f.hit, f.at = 0, 0, map[int]bool{}
	for _, i := range at {
		f.at[i] = true
	}
}

func (f *faults) before(context.Context, int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.at[f.calls] {
		f.hit++
		return fmt.Errorf("read object: %w", drivertest.TemporaryError{Why: "timeout"})
	}
	return nil
}

// resumeDriver is a driver that resumes at once, within budget.
func resumeDriver(t testing.TB, src driver.Source, typ csi.BlockMetadataType, block int64, budget time.Duration, obs driver.Observer) *driver.Driver {
	t.Helper()
	d, err := driver.New(src, driver.Options{Name: "rbd.csi.ceph.com", BlockMetadataType: typ, FixedBlockSize: block,
		ResumeBudget: budget, NewBackOff: func() backoff.BackOff { return &backoff.ZeroBackOff{} }, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// pagesOf returns a stream's pages as extents, for comparing page by page.
func pagesOf(r result) [][]driver.Extent {
	var out [][]driver.Extent
	for _, p := range r.pages {
		var es []driver.Extent
		for _, b := range p {
			es = append(es, driver.Extent{Offset: b.ByteOffset, Length: b.SizeBytes})
		}
		out = append(out, es)
	}
	return out
}

// seamCase is one stream: a volume, a request and faults.
type seamCase struct {
	typ     csi.BlockMetadataType
	block   int64
	obj     int64 // 0: a diff without objects (no Resumer)
	delta   bool
	start   int64
	max     int32
	extents []driver.Extent
}

// seamServer serves one seamCase's volume, with faults set per stream.
type seamServer struct {
	c    seamCase
	src  *drivertest.Source
	f    *faults
	rec  *resumeRecorder
	conn *grpc.ClientConn
	want result // the stream without faults
}

func (c seamCase) serve(t *testing.T) *seamServer {
	t.Helper()
	const capacity = 64 * 1024
	s := &seamServer{c: c, src: drivertest.NewSource(), f: &faults{}, rec: &resumeRecorder{}}
	s.src.Add(&drivertest.Volume{Capacity: capacity, ObjectSize: c.obj,
		Allocated: map[string][]driver.Extent{"a": nil, "b": c.extents}, Delta: map[string][]driver.Extent{"a>b": c.extents}})
	s.src.BeforeExtent = s.f.before
	s.conn = serve(t, resumeDriver(t, s.src, c.typ, c.block, time.Minute, s.rec))
	var err error
	if s.want, err = s.stream(t); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *seamServer) stream(t *testing.T) (result, error) {
	c := s.c
	if c.delta {
		return delta(t, s.conn, &csi.GetMetadataDeltaRequest{BaseSnapshotId: "a", TargetSnapshotId: "b", StartingOffset: c.start, MaxResults: c.max})
	}
	return allocated(t, s.conn, &csi.GetMetadataAllocatedRequest{SnapshotId: "b", StartingOffset: c.start, MaxResults: c.max})
}

// run streams with faults at the given extents (counted across the
// diffs of the stream) and checks that the client sees the pages of the
// stream without faults, and that every fault was resumed.
func (s *seamServer) run(t *testing.T, at []int) {
	t.Helper()
	s.f.reset(at)
	opened, resumed := s.src.Opened(), s.rec.count()
	got, err := s.stream(t)
	if err != nil {
		t.Fatalf("%+v, faults %v: %v", s.c, at, err)
	}
	if d := cmp.Diff(pagesOf(s.want), pagesOf(got)); d != "" {
		t.Fatalf("%+v, faults %v: pages differ from an uninterrupted stream's, -want +got:\n%s", s.c, at, d)
	}
	waitClosed(t, s.src)
	if o, n := s.src.Opened()-opened, s.rec.count()-resumed; o != 1+n || n != s.f.hit {
		t.Fatalf("%+v, faults %v: %d opens for %d resumes of %d faults", s.c, at, o, n, s.f.hit)
	}
}

type resumeRecorder struct {
	mu      sync.Mutex
	reasons []string
	failed  int
}

func (r *resumeRecorder) Streamed(string, int, int64, time.Duration) {}

func (r *resumeRecorder) Resumed(_, reason string, _ time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.reasons = append(r.reasons, reason)
	} else {
		r.failed++
	}
}

func (r *resumeRecorder) count() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.reasons) }

// seamExtents are extents that touch, overlap, share FIXED_LENGTH blocks
// and cross object boundaries (objects of 4096 bytes in the cases below).
var seamExtents = []driver.Extent{
	{Offset: 100, Length: 50}, {Offset: 150, Length: 10}, {Offset: 155, Length: 900},
	{Offset: 4000, Length: 200}, {Offset: 4300, Length: 10}, {Offset: 5000, Length: 4000},
	{Offset: 9100, Length: 1}, {Offset: 12288, Length: 4096}, {Offset: 16384, Length: 100},
	{Offset: 30000, Length: 30000}, {Offset: 60000, Length: 10000},
}

// TestResumeSeams fails the diff at every extent, one and several times,
// in every mode, and checks that the client gets the pages of an
// uninterrupted stream.
func TestResumeSeams(t *testing.T) {
	n := len(seamExtents)
	var faultSets [][]int
	for i := 1; i <= n; i++ {
		faultSets = append(faultSets, []int{i})
	}
	faultSets = append(faultSets, []int{1, 2, 3}, []int{2, 4, 6, 8, 10, 12}, []int{n, n + 1})
	for _, typ := range []struct {
		typ   csi.BlockMetadataType
		block int64
	}{{csi.BlockMetadataType_VARIABLE_LENGTH, 0}, {csi.BlockMetadataType_FIXED_LENGTH, 1024}, {csi.BlockMetadataType_FIXED_LENGTH, 3000}} {
		for _, obj := range []int64{0, 4096} {
			for _, start := range []int64{0, 160, 4200} {
				for _, max := range []int32{0, 1, 2, 3} {
					s := seamCase{typ: typ.typ, block: typ.block, obj: obj, delta: max%2 == 1, start: start, max: max,
						extents: seamExtents}.serve(t)
					for _, fs := range faultSets {
						s.run(t, fs)
					}
				}
			}
		}
	}
}

// FuzzResumeSeam fuzzes the seam: random extents, faults, modes, page
// sizes and starting offsets.
func FuzzResumeSeam(f *testing.F) {
	f.Add(uint64(1), uint8(0), uint8(0), uint16(0))
	f.Add(uint64(2), uint8(1), uint8(1), uint16(5000))
	f.Add(uint64(3), uint8(2), uint8(3), uint16(100))
	f.Fuzz(func(t *testing.T, seed uint64, mode, max uint8, start uint16) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var ext []driver.Extent
		pos := int64(0)
		for pos < 60000 && len(ext) < 40 {
			off := max64(0, pos+int64(rng.IntN(3000))-500)
			if len(ext) > 0 {
				off = max64(off, ext[len(ext)-1].Offset)
			}
			l := int64(rng.IntN(5000))
			ext = append(ext, driver.Extent{Offset: off, Length: l})
			pos = off + l
		}
		var fs []int
		for i := range 2 * len(ext) {
			if rng.IntN(4) == 0 {
				fs = append(fs, i+1)
			}
		}
		c := seamCase{typ: csi.BlockMetadataType_VARIABLE_LENGTH, obj: []int64{0, 4096, 1000}[mode%3], delta: mode%2 == 1,
			start: int64(start) % 65536, max: int32(max % 9), extents: ext}
		if mode&4 != 0 {
			c.typ, c.block = csi.BlockMetadataType_FIXED_LENGTH, int64(512+int(mode)*100)
		}
		c.serve(t).run(t, fs)
	})
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// bigVolume has one snapshot "big" of n extents of 4 KiB, 8 KiB apart.
func bigVolume(n int64) (*drivertest.Source, []driver.Extent) {
	src := drivertest.NewSource()
	var ext []driver.Extent
	for i := range n {
		ext = append(ext, driver.Extent{Offset: i * 8192, Length: 4096})
	}
	src.Add(&drivertest.Volume{Capacity: n * 8192, Allocated: map[string][]driver.Extent{"big": ext}})
	return src, ext
}

// handlerStream is a GetMetadataAllocated stream without gRPC, for
// calling the driver's handler directly inside a synctest bubble: the
// driver's sender, backoffs and resume budget then run on the bubble's
// fake clock, and a test can assert how long they took exactly. The
// driver uses only Context and Send of a stream.
type handlerStream struct {
	grpc.ServerStream
	sent []*csi.GetMetadataAllocatedResponse // by the sender's goroutine, read once the handler returned
}

func (s *handlerStream) Context() context.Context { return context.Background() }

func (s *handlerStream) Send(m *csi.GetMetadataAllocatedResponse) error {
	s.sent = append(s.sent, m)
	return nil
}

// allocatedDirect calls d's GetMetadataAllocated handler and returns what
// a client would have received, and the handler's status.
func allocatedDirect(d *driver.Driver, req *csi.GetMetadataAllocatedRequest) (result, error) {
	s := &handlerStream{}
	err := d.GetMetadataAllocated(req, s)
	r, _ := recvAll(func() (*csi.GetMetadataAllocatedResponse, error) {
		if len(s.sent) == 0 {
			return nil, io.EOF
		}
		m := s.sent[0]
		s.sent = s.sent[1:]
		return m, nil
	})
	return r, err
}

// TestResumeEnds checks what still ends a stream that failed with a
// temporary error: an error that lasts from the re-open, at once, with its
// own code; a budget spent, with UNAVAILABLE saying so; and no budget. It
// runs the handler in a synctest bubble: the budget and the backoffs are
// spent on a fake clock, exactly, whatever the load.
func TestResumeEnds(t *testing.T) {
	temp := drivertest.TemporaryError{Why: "connection reset"}
	for _, tc := range []struct {
		name     string
		budget   time.Duration
		open     error // from every re-open
		iterate  error // the diff's error
		wantCode codes.Code
		want     string
		opens    int
	}{
		{"no budget", 0, nil, temp, codes.Unavailable, "connection reset", 1},
		// The first open, and one after each 100 ms of the budget.
		{"budget spent", 300 * time.Millisecond, temp, temp, codes.Unavailable, "--resume-budget of 300ms", 4},
		{"deleted meanwhile", time.Minute, fmt.Errorf("snapshot: %w", fs.ErrNotExist), temp, codes.NotFound, "snapshot", 2},
		{"caps taken", time.Minute, fmt.Errorf("open: %w", fs.ErrPermission), temp, codes.PermissionDenied, "open", 2},
		{"key revoked", time.Minute, refusedLogin{}, temp, codes.Unauthenticated, "authentication", 2},
		{"invalid", time.Minute, fmt.Errorf("bad: %w", fs.ErrInvalid), temp, codes.InvalidArgument, "bad", 2},
		{"lasting diff error", time.Minute, nil, errors.New("broken"), codes.Internal, "broken", 1},
		{"not found from the diff", time.Minute, nil, fmt.Errorf("gone: %w", fs.ErrNotExist), codes.NotFound, "gone", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src, ext := bigVolume(1000)
				src.BeforeExtent = func(_ context.Context, i int) error {
					if i == 500 {
						return tc.iterate
					}
					return nil
				}
				src.OpenHook = func(_ context.Context, n int) error {
					if n > 0 {
						return tc.open
					}
					return nil
				}
				d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, ResumeBudget: tc.budget,
					NewBackOff: func() backoff.BackOff { return backoff.NewConstantBackOff(100 * time.Millisecond) }})
				if err != nil {
					t.Fatal(err)
				}
				began := time.Now()
				r, err := allocatedDirect(d, &csi.GetMetadataAllocatedRequest{SnapshotId: "big", MaxResults: 100})
				took := time.Since(began)
				if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want %v with %q", err, tc.wantCode, tc.want)
				}
				if len(r.tuples) >= len(ext) || cmp.Diff(ext[:len(r.tuples)], r.tuples) != "" {
					t.Fatalf("%d tuples: not a prefix", len(r.tuples))
				}
				if src.OpenCalls() != tc.opens {
					t.Fatalf("%d opens, want %d", src.OpenCalls(), tc.opens)
				}
				if tc.budget > 0 && tc.wantCode == codes.Unavailable && took != tc.budget {
					t.Fatalf("gave up after %v, budget %v", took, tc.budget)
				}
				waitClosed(t, src)
			})
		})
	}
}

// TestResumeRefusesAnotherLineage: a re-opened diff that reads other
// snapshots than the first (a parent flattened away meanwhile) ends the
// stream ABORTED, without a tuple of it; the same lineage resumes.
func TestResumeRefusesAnotherLineage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lineage  func(n int) string
		wantCode codes.Code
	}{
		{"same", func(int) string { return "rbd/id:1@4 <- rbd/id:0@2" }, codes.OK},
		{"flattened", func(n int) string { return []string{"rbd/id:1@4 <- rbd/id:0@2", "rbd/id:1@4"}[min(n, 1)] }, codes.Aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, ext := bigVolume(1000)
			src.Lineage = tc.lineage
			src.BeforeExtent = func(_ context.Context, i int) error {
				if i == 500 && src.OpenCalls() == 1 {
					return drivertest.TemporaryError{Why: "connection reset"}
				}
				return nil
			}
			d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, ResumeBudget: time.Minute,
				NewBackOff: func() backoff.BackOff { return backoff.NewConstantBackOff(10 * time.Millisecond) }})
			if err != nil {
				t.Fatal(err)
			}
			r, err := allocated(t, serve(t, d), &csi.GetMetadataAllocatedRequest{SnapshotId: "big", MaxResults: 100})
			if status.Code(err) != tc.wantCode {
				t.Fatalf("got %v, want %v", err, tc.wantCode)
			}
			if tc.wantCode == codes.OK && cmp.Diff(ext, r.tuples) != "" {
				t.Fatalf("resumed with the same lineage: %d tuples, want %d", len(r.tuples), len(ext))
			}
			if tc.wantCode != codes.OK && len(r.tuples) > 500 {
				t.Fatalf("%d tuples: sent beyond the seam", len(r.tuples))
			}
			waitClosed(t, src)
		})
	}
}

// TestResumeCancelAndStallDuringBackoff: a cancel, and a client that
// takes no page for the stall timeout, end a stream at once while it backs
// off (here for an hour).
func TestResumeCancelAndStallDuringBackoff(t *testing.T) {
	for _, stallCase := range []bool{false, true} {
		t.Run(fmt.Sprintf("stall=%v", stallCase), func(t *testing.T) {
			src, _ := bigVolume(100000)
			failed := make(chan struct{})
			var once sync.Once
			src.BeforeExtent = func(_ context.Context, i int) error {
				// Before the diff waits for the stalled client: a page
				// being sent, one queued, the third filling.
				if i == 40000 {
					once.Do(func() { close(failed) })
					return drivertest.TemporaryError{Why: "timeout"}
				}
				return nil
			}
			rec := &endRecorder{done: make(chan struct{})}
			const stall = 500 * time.Millisecond
			backingOff := make(chan struct{}, 1)
			d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
				ResumeBudget: 2 * time.Hour, StallTimeout: stall, Observer: rec,
				NewBackOff: func() backoff.BackOff { return signalBackOff{backoff.NewConstantBackOff(time.Hour), backingOff} }})
			if err != nil {
				t.Fatal(err)
			}
			conn := serveDial(t, d, []grpc.DialOption{grpc.WithInitialWindowSize(64 << 10), grpc.WithInitialConnWindowSize(64 << 10)})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := csi.NewSnapshotMetadataClient(conn).GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: "big"})
			if err != nil {
				t.Fatal(err)
			}
			if !stallCase {
				// Read, so that the diff reaches the fault; then cancel
				// during the backoff.
				go func() { _, _ = recvAll(s.Recv) }()
			}
			select {
			case <-failed:
			case <-time.After(30 * time.Second):
				t.Fatal("the diff never reached the fault")
			}
			began := time.Now()
			if !stallCase {
				// The failed diff is closed and the driver asks for its
				// hour's wait: the cancel comes during the backoff.
				select {
				case <-backingOff:
				case <-time.After(30 * time.Second):
					t.Fatal("the driver never backed off")
				}
				cancel()
			}
			select {
			case <-rec.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the stream did not end during its backoff")
			}
			t.Logf("ended %v after the fault", time.Since(began))
			if stallCase {
				if _, err := recvAll(s.Recv); status.Code(err) != codes.DeadlineExceeded {
					t.Fatalf("stalled client during a backoff: %v, want DeadlineExceeded", err)
				}
			}
			waitClosed(t, src)
			if src.OpenCalls() != 1 {
				t.Fatalf("%d opens, want 1: the backoff never ended", src.OpenCalls())
			}
		})
	}
}

// signalBackOff is a backoff that says on next, without blocking, each
// time the driver asks it how long to wait: the driver is about to back
// off.
type signalBackOff struct {
	backoff.BackOff
	next chan<- struct{}
}

func (b signalBackOff) NextBackOff() time.Duration {
	select {
	case b.next <- struct{}{}:
	default:
	}
	return b.BackOff.NextBackOff()
}

type endRecorder struct{ done chan struct{} }

func (r *endRecorder) Streamed(string, int, int64, time.Duration) { close(r.done) }

// TestResumeReportsReasons: each resume is reported with its reason.
func TestResumeReportsReasons(t *testing.T) {
	src, ext := bigVolume(100)
	src.BeforeExtent = func(_ context.Context, i int) error {
		if i == 50 && src.Opened() == 1 {
			return drivertest.TemporaryError{Why: "connection reset"}
		}
		if i == 70 && src.Opened() == 2 {
			return fmt.Errorf("op: %w", os.ErrDeadlineExceeded)
		}
		return nil
	}
	rec := &resumeRecorder{}
	r, err := allocated(t, serve(t, resumeDriver(t, src, csi.BlockMetadataType_VARIABLE_LENGTH, 0, time.Minute, rec)),
		&csi.GetMetadataAllocatedRequest{SnapshotId: "big", MaxResults: 7})
	if err != nil || len(r.tuples) != len(ext) {
		t.Fatalf("%d tuples, %v", len(r.tuples), err)
	}
	if d := cmp.Diff([]string{"connection reset", "timeout"}, rec.reasons); d != "" {
		t.Fatalf("reasons -want +got:\n%s", d)
	}
}

// TestResumeCancelledDuringFailingIterate: a cancel that comes while the
// diff waits for the cluster ends the stream CANCELLED, even when the diff
// then returns the cluster's error rather than the context's.
func TestResumeCancelledDuringFailingIterate(t *testing.T) {
	src, _ := bigVolume(1000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src.BeforeExtent = func(stream context.Context, i int) error {
		if i == 500 {
			cancel()
			// The diff fails only once the cancel has reached the
			// server: the stream's context, which the diff is given, is
			// done. A hang guard, not a bound.
			select {
			case <-stream.Done():
			case <-time.After(10 * time.Second):
				t.Error("the client's cancel never reached the server")
			}
			return drivertest.TemporaryError{Why: "timeout"}
		}
		return nil
	}
	rec := &endRecorder{done: make(chan struct{})}
	d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
		ResumeBudget: time.Minute, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	srv := &codeRecorder{ended: make(chan struct{})}
	conn := serve(t, d, grpc.StreamInterceptor(srv.intercept))
	s, err := csi.NewSnapshotMetadataClient(conn).GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: "big", MaxResults: 10})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = recvAll(s.Recv)
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second): // a hang guard
		t.Fatal("the stream never ended")
	}
	waitClosed(t, src)
	if c := srv.code(t); c != codes.Canceled || src.OpenCalls() != 1 {
		t.Fatalf("the handler ended with %v after %d opens; want Canceled, no re-open", c, src.OpenCalls())
	}
}

// codeRecorder keeps the code of the last handler that returned; ended
// is closed when the first one has.
type codeRecorder struct {
	mu    sync.Mutex
	last  codes.Code
	ended chan struct{}
	once  sync.Once
}

func (r *codeRecorder) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	err := h(srv, ss)
	r.mu.Lock()
	r.last = status.Code(err)
	r.mu.Unlock()
	r.once.Do(func() { close(r.ended) })
	return err
}

// code waits for a handler to return and gives its code.
func (r *codeRecorder) code(t *testing.T) codes.Code {
	t.Helper()
	select {
	case <-r.ended:
	case <-time.After(10 * time.Second): // a hang guard
		t.Fatal("no handler returned")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// noSessionError is a Source's error when the monitors gave no session.
type noSessionError struct{ drivertest.TemporaryError }

func (noSessionError) NoSession() bool { return true }

// TestResumeFirstOpen: a request whose first open fails with a temporary
// error (a backup that starts during an OSD outage) is opened again within
// the budget and answered in full, counted as a resume; one whose monitors
// gave no session, one with no budget, and one whose retries meet a lasting
// error end at once with their code. As TestResumeEnds, it runs the
// handler in a synctest bubble, where the backoffs and the budget are
// spent on a fake clock.
func TestResumeFirstOpen(t *testing.T) {
	temp := drivertest.TemporaryError{Why: "timeout"}
	for _, tc := range []struct {
		name     string
		budget   time.Duration
		fails    []error // the first opens' errors, in turn
		wantCode codes.Code
		opens    int
		resumes  int
	}{
		{"outage", time.Minute, []error{temp, temp, temp}, codes.OK, 4, 1},
		{"no session", time.Minute, []error{noSessionError{temp}}, codes.Unavailable, 1, 0},
		{"no budget", 0, []error{temp}, codes.Unavailable, 1, 0},
		// The first open, and one after each 100 ms of the budget.
		{"budget spent", 300 * time.Millisecond, []error{temp, temp, temp, temp, temp, temp, temp, temp, temp, temp}, codes.Unavailable, 4, 0},
		{"removed meanwhile", time.Minute, []error{temp, fmt.Errorf("snapshot: %w", fs.ErrNotExist)}, codes.NotFound, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src, ext := bigVolume(100)
				src.OpenHook = func(_ context.Context, n int) error {
					if n < len(tc.fails) {
						return tc.fails[n]
					}
					return nil
				}
				rec := &resumeRecorder{}
				d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, ResumeBudget: tc.budget,
					NewBackOff: func() backoff.BackOff { return backoff.NewConstantBackOff(100 * time.Millisecond) }, Observer: rec})
				if err != nil {
					t.Fatal(err)
				}
				r, err := allocatedDirect(d, &csi.GetMetadataAllocatedRequest{SnapshotId: "big", MaxResults: 10})
				if status.Code(err) != tc.wantCode {
					t.Fatalf("got %v, want %v", err, tc.wantCode)
				}
				if tc.wantCode == codes.OK {
					if d := cmp.Diff(ext, r.tuples); d != "" {
						t.Errorf("the answer differs from the volume's extents (-want +got):\n%s", d)
					}
				} else if len(r.tuples) != 0 {
					t.Errorf("%d tuples before %v", len(r.tuples), err)
				}
				if got := src.OpenCalls(); got != tc.opens {
					t.Errorf("%d opens, want %d", got, tc.opens)
				}
				if got := rec.count(); got != tc.resumes {
					t.Errorf("%d resumes observed, want %d", got, tc.resumes)
				}
				waitClosed(t, src)
			})
		})
	}
}
