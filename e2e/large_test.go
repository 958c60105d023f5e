//go:build e2e

package e2e

import (
	"context"
	"errors"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rbd"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// bigRun tells whether RSM_E2E_BIG=1 asks for the slow variants.
func bigRun() bool { return os.Getenv("RSM_E2E_BIG") == "1" }

// ------------------------------------------------------------ memory --

// streamMeasured runs r on a server while sampling its memory, checks the
// stream's invariants, and logs the numbers.
func streamMeasured(t testing.TB, s *harness.Server, r harness.MetaReq) ([]harness.Span, int64) {
	t.Helper()
	mem := harness.SampleMemory(t, s.PID())
	t0 := time.Now()
	m := s.Get(t, r)
	d := time.Since(t0)
	peak, hwm := mem.Finish(t)
	tuples := m.Tuples()
	t.Logf("%v: %d tuples in %d pages in %v (%.0f tuples/s); server RSS %s before, peak %s sampled (%d samples), VmHWM %s",
		r, len(tuples), len(m.Pages), d.Round(time.Millisecond), float64(len(tuples))/d.Seconds(),
		harness.FmtKiB(mem.Baseline), harness.FmtKiB(peak), mem.Samples, harness.FmtKiB(hwm))
	return tuples, max(peak, hwm) - mem.Baseline
}

// maxStreamGrowth bounds how much a stream may grow the server's RSS: the
// driver holds about one page (at most 65536 tuples), librbd an object's
// extents. Holding 1M tuples would take well over 64 MiB.
const maxStreamGrowthKiB = 48 << 10

// ------------------------------------------------ a million, striped --

// stripedMillion builds a volume whose Delta and Allocated have 2^20
// extents after only 1024 one-byte writes: with fancy striping (4 KiB
// stripe units over 2 objects), an object that is new since the base is
// reported from 0 to its size, which is 1024 extents of 4 KiB, 8 KiB apart
// in the image. One byte at the end of the first object of each of 1024
// object sets makes 1024 such objects.
func stripedMillion(t testing.TB) (harness.RbdVolume, []harness.Span) {
	t.Helper()
	const (
		unit  = 4 << 10
		count = 2
		sets  = 1024
		set   = count * harness.ObjSize // 8 MiB of the image
	)
	conn := harness.ConnectAdmin(t)
	v, img := harness.CreateVolume(t, conn, "", "million", sets*set, rbd.FeatureLayering|rbd.FeatureStripingV2, func(o *rbd.ImageOptions) {
		if err := o.SetUint64(rbd.ImageOptionStripeUnit, unit); err != nil {
			t.Fatal(err)
		}
		if err := o.SetUint64(rbd.ImageOptionStripeCount, count); err != nil {
			t.Fatal(err)
		}
	})
	harness.Snapshot(t, img, "s1")
	t0 := time.Now()
	lastUnit := uint64(harness.ObjSize/unit-1) * count * unit // of the set's first object
	for s := uint64(0); s < sets; s++ {
		if _, err := img.WriteAt([]byte{1}, int64(s*set+lastUnit+unit-1)); err != nil {
			t.Fatal(err)
		}
	}
	harness.Snapshot(t, img, "s2")
	want := make([]harness.Span, 0, sets*harness.ObjSize/unit)
	for s := uint64(0); s < sets; s++ {
		for u := uint64(0); u < harness.ObjSize/unit; u++ {
			want = append(want, harness.Span{Offset: int64(s*set + u*count*unit), Length: unit})
		}
	}
	t.Logf("volume %s: %d writes made %d extents in %v", v.Spec(), sets, len(want), time.Since(t0).Round(time.Millisecond))
	return v, want
}

// checkStreamMemory streams r, which must answer want, while sampling the
// server's memory, which must not grow by more than maxStreamGrowthKiB.
func checkStreamMemory(t *testing.T, srv *harness.Server, r harness.MetaReq, want []harness.Span) {
	t.Helper()
	got, growth := streamMeasured(t, srv, r)
	if diff := harness.DiffSpans(want, got); diff != "" {
		t.Fatalf("%v: %s", r, diff)
	}
	if growth > maxStreamGrowthKiB {
		t.Errorf("the server's RSS grew by %s while streaming, want at most %s: does it hold the whole answer?", harness.FmtKiB(growth), harness.FmtKiB(maxStreamGrowthKiB))
	}
}

// openFirstPage starts r on s and receives its first page.
func openFirstPage(ctx context.Context, t *testing.T, s *harness.Server, r harness.MetaReq) (recv func() (harness.MetaResponse, error), first harness.MetaResponse) {
	t.Helper()
	recv, err := s.Open(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	first, err = recv()
	if err != nil {
		t.Fatalf("%v: first page: %v", r, err)
	}
	return recv, first
}

// TestMillionExtents streams a diff of 2^20 extents through the server
// while sampling its memory, cancels such a stream after its first page,
// and runs several at once.
func TestMillionExtents(t *testing.T) {
	v, want := stripedMillion(t)
	// librbd's own extents: an object new since the base is reported whole.
	srv := harness.StartServer(t, "--precision=exact")
	mr := &millionRun{v: v, want: want, srv: srv}

	t.Run("delta-memory", mr.deltaMemory)
	t.Run("allocated-memory", mr.allocatedMemory)
	t.Run("cancel-after-first-page", mr.cancelAfterFirstPage)
	t.Run("sigterm-grace-lets-stream-finish", mr.sigtermGraceLetsStreamFinish)
	t.Run("sigterm-grace-over-cancels-stream", mr.sigtermGraceOverCancelsStream)
	t.Run("huge-max-results", mr.hugeMaxResults)
	t.Run("precise", mr.precise)
	t.Run("concurrent", mr.concurrent)
}

// millionRun is what TestMillionExtents' steps share: the striped volume
// (stripedMillion), its 2^20 extents and the exact server.
type millionRun struct {
	v    harness.RbdVolume
	want []harness.Span
	srv  *harness.Server
}

// deltaMemory: the Delta streams its 2^20 extents without the server's
// RSS growing by more than maxStreamGrowthKiB.
func (mr *millionRun) deltaMemory(t *testing.T) {
	checkStreamMemory(t, mr.srv, harness.MetaReq{Base: mr.v.ID("s1"), Target: mr.v.ID("s2")}, mr.want)
}

// allocatedMemory: the same for the Allocated.
func (mr *millionRun) allocatedMemory(t *testing.T) {
	checkStreamMemory(t, mr.srv, harness.MetaReq{Target: mr.v.ID("s2")}, mr.want)
}

// cancelAfterFirstPage: a Delta cancelled after its first page
// (cancelAfterFirstPage).
func (mr *millionRun) cancelAfterFirstPage(t *testing.T) {
	cancelAfterFirstPage(t, mr.srv, harness.MetaReq{Base: mr.v.ID("s1"), Target: mr.v.ID("s2"), Max: 1000}, mr.want)
}

// sigtermGraceLetsStreamFinish: a stream open at SIGTERM ends whole
// within --grace-period, and the server then exits with status 0.
func (mr *millionRun) sigtermGraceLetsStreamFinish(t *testing.T) {
	s := harness.StartServer(t, "--precision=exact", "--grace-period=60s")
	r := harness.MetaReq{Base: mr.v.ID("s1"), Target: mr.v.ID("s2"), Secrets: harness.CSISecrets(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recv, resp := openFirstPage(ctx, t, s, r)
	s.Sigterm(t)
	time.Sleep(200 * time.Millisecond)
	got := harness.ToPage(resp).Tuples
	for {
		resp, err := recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("%v: after SIGTERM, within the grace period: %v after %d tuples", r, err, len(got))
			}
			break
		}
		got = append(got, harness.ToPage(resp).Tuples...)
	}
	if diff := harness.DiffSpans(mr.want, got); diff != "" {
		t.Errorf("stream across SIGTERM: %s", diff)
	}
	if err, ok := s.Wait(20 * time.Second); !ok || err != nil {
		t.Errorf("after SIGTERM and the last stream: exited %t, %v; want exit status 0", ok, err)
	}
}

// sigtermGraceOverCancelsStream: a stream that does not move at SIGTERM
// is cancelled when --grace-period ends, not answered OK cut short, and
// the server exits with status 0.
func (mr *millionRun) sigtermGraceOverCancelsStream(t *testing.T) {
	s := harness.StartServer(t, "--precision=exact", "--grace-period=1s")
	r := harness.MetaReq{Base: mr.v.ID("s1"), Target: mr.v.ID("s2"), Secrets: harness.CSISecrets(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recv, resp := openFirstPage(ctx, t, s, r)
	t0 := time.Now()
	s.Sigterm(t)
	// The client reads nothing more: the server blocks on a full
	// window until the grace period ends, then cancels the stream.
	if err, ok := s.Wait(20 * time.Second); !ok || err != nil {
		t.Fatalf("after SIGTERM, a stream that does not move: exited %t, %v; want exit status 0 after the 1 s grace period", ok, err)
	}
	t.Logf("exited %v after SIGTERM", time.Since(t0).Round(time.Millisecond))
	n := len(resp.GetBlockMetadata())
	var err error
	for {
		resp, err = recv()
		if err != nil {
			break
		}
		n += len(resp.GetBlockMetadata())
	}
	if errors.Is(err, io.EOF) && n != len(mr.want) {
		t.Errorf("the stream cut by the end of the grace period ended with OK after %d of %d tuples", n, len(mr.want))
	}
	t.Logf("the client got %d of %d tuples, then %v", n, len(mr.want), err)
}

// hugeMaxResults: a max_results of MaxInt32 is answered in pages.
func (mr *millionRun) hugeMaxResults(t *testing.T) {
	// 2^20 tuples in one message would be over gRPC's 4 MiB limit:
	// the server must page them anyway.
	m := mr.srv.Get(t, harness.MetaReq{Target: mr.v.ID("s2"), Max: math.MaxInt32})
	if diff := harness.DiffSpans(mr.want, m.Tuples()); diff != "" {
		t.Errorf("max_results %d: %s", int32(math.MaxInt32), diff)
	}
	t.Logf("max_results %d: %d pages", int32(math.MaxInt32), len(m.Pages))
}

// precise: precise mode answers the 1024 bytes that changed (checkPrecise).
func (mr *millionRun) precise(t *testing.T) {
	// What really changed: one byte at the end of 1024 objects.
	var truth []harness.Span
	for i := 1023; i < len(mr.want); i += 1024 {
		truth = append(truth, harness.Span{Offset: harness.SpanEnd(mr.want[i]) - 1, Length: 1})
	}
	checkPrecise(t, harness.MetaReq{Base: mr.v.ID("s1"), Target: mr.v.ID("s2")}, truth)
}

// concurrent: three streams at once are each answered whole and right.
func (mr *millionRun) concurrent(t *testing.T) {
	v, want, srv := mr.v, mr.want, mr.srv
	// Three streams at once share one cluster connection.
	reqs := []harness.MetaReq{
		{Base: v.ID("s1"), Target: v.ID("s2")},
		{Target: v.ID("s2"), Max: 4096},
		{Base: v.ID("s1"), Target: v.ID("s2"), Start: int64(want[len(want)/2].Offset) + 1},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	got := make([]harness.MetaStream, len(reqs))
	t0 := time.Now()
	for i := range reqs {
		reqs[i].Secrets = harness.CSISecrets(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = srv.Call(ctx, reqs[i])
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent streams in %v", len(reqs), time.Since(t0).Round(time.Millisecond))
	for i, r := range reqs {
		if got[i].Err != nil {
			t.Errorf("%v: %v", r, got[i].Err)
			continue
		}
		harness.CheckStream(t, r, got[i], srv.BlockType(), srv.FixedSize())
		w := harness.ClipSpans(want, r.Start, 1<<62)
		if diff := harness.DiffSpans(w, got[i].Tuples()); diff != "" {
			t.Errorf("%v: %s", r, diff)
		}
	}
}

// cancelAfterFirstPage cancels a stream once its first page has arrived,
// and checks that the call ends with CANCELLED, that the server stopped
// the diff early (its log says how many tuples it sent), that it is still
// up, and that the same request then runs to the end.
func cancelAfterFirstPage(t testing.TB, srv *harness.Server, r harness.MetaReq, want []harness.Span) {
	t.Helper()
	r.Secrets = harness.CSISecrets(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recv, err := srv.Open(ctx, r)
	if err != nil {
		t.Fatalf("%v: %v", r, err)
	}
	first, err := recv()
	if err != nil {
		t.Fatalf("%v: first page: %v", r, err)
	}
	if n := len(first.GetBlockMetadata()); n == 0 || n > int(r.Max) {
		t.Errorf("first page has %d tuples, want 1..%d", n, r.Max)
	}
	cancel()
	t0 := time.Now()
	pages := 1
	for {
		_, err = recv()
		if err != nil {
			break
		}
		pages++
	}
	if status.Code(err) != codes.Canceled {
		t.Errorf("after cancel: %v, want CANCELLED", err)
	}
	t.Logf("cancelled after the first page; %d pages had arrived by the end (%v after the cancel)", pages, time.Since(t0).Round(time.Millisecond))

	// The server's summary of the cancelled stream: it must have stopped
	// before sending everything.
	re := regexp.MustCompile(`"Stream finished".*code="Canceled".* tuples=(\d+)`)
	var sent int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if m := re.FindStringSubmatch(srv.Log()); m != nil {
			sent, _ = strconv.Atoi(m[1])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no \"Stream finished\" line with code Canceled in the server log after 10 s")
		}
	}
	t.Logf("the server sent %d of %d tuples before it stopped", sent, len(want))
	// What the server may still send is what fits in gRPC's flow control
	// window and what it produces before the cancel reaches it: measured
	// at 1-4% of these streams.
	if sent > len(want)/4 {
		t.Errorf("the server sent %d of %d tuples of a stream cancelled after its first page: the diff did not stop", sent, len(want))
	}
	if !srv.Running() {
		t.Fatalf("the server exited after a cancelled stream")
	}
	r.Max = 0
	got := srv.Get(t, r).Tuples()
	if diff := harness.DiffSpans(want, got); diff != "" {
		t.Errorf("the request after the cancel: %s", diff)
	}
}

// checkPrecise streams r through a --precision=precise server (skipped
// when the binary has none) while sampling its memory, and checks that
// its answer covers truth, the bytes that really changed.
func checkPrecise(t testing.TB, r harness.MetaReq, truth []harness.Span) {
	t.Helper()
	if !harness.ServerHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	ps := harness.StartServer(t, "--precision=precise")
	got, growth := streamMeasured(t, ps, r)
	if miss := harness.Uncovered(truth, harness.MergeSpans(got)); len(miss) > 0 {
		t.Errorf("%d of the %d changed bytes are in no tuple; first missed: %v", harness.TotalBytes(miss), harness.TotalBytes(truth), miss[:min(len(miss), 10)])
	}
	if growth > maxStreamGrowthKiB {
		t.Errorf("the server's RSS grew by %s while streaming, want at most %s", harness.FmtKiB(growth), harness.FmtKiB(maxStreamGrowthKiB))
	}
	t.Logf("precise: %d tuples, %d bytes for %d changed bytes (%s)", len(got), harness.TotalBytes(got), harness.TotalBytes(truth), reportRatio(harness.TotalBytes(got), harness.TotalBytes(truth)))
}

// ----------------------------------------------- many small writes --

// TestManyWrites streams a Delta of many separate writes (100k; 2^20 with
// RSM_E2E_BIG=1, which takes minutes to write) and compares it with
// exactly those writes, sampling the server's memory, then cancels one
// after its first page.
func TestManyWrites(t *testing.T) {
	n := 100_000
	if bigRun() {
		n = 1 << 20
	}
	v, want := harness.ManyWrites(t, n)
	srv := harness.StartServer(t, "--precision=exact")
	t.Run("delta-memory", func(t *testing.T) {
		checkStreamMemory(t, srv, harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2")}, want)
	})
	t.Run("matches-rbd-diff", func(t *testing.T) {
		got := srv.Get(t, harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2")}).Tuples()
		rd := harness.WantFromRbdDiff(harness.RbdDiffOf(t, v, "s1", "s2", false), true)
		if diff := harness.DiffSpans(rd, got); diff != "" {
			t.Fatalf("Delta against rbd diff (want): %s", diff)
		}
	})
	t.Run("cancel-after-first-page", func(t *testing.T) {
		cancelAfterFirstPage(t, srv, harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Max: 100}, want)
	})
	t.Run("precise", func(t *testing.T) {
		// The writes are all that changed (non-zero data over zeros).
		checkPrecise(t, harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2")}, want)
	})
}
