//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rbd"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// bigRun tells whether RSM_E2E_BIG=1 asks for the slow variants.
func bigRun() bool { return os.Getenv("RSM_E2E_BIG") == "1" }

// ------------------------------------------------------------ memory --

// memSampler samples a process's VmRSS from /proc until stopped.
type memSampler struct {
	pid      int
	stop     chan struct{}
	done     chan struct{}
	peakRSS  int64 // KiB
	samples  int
	baseline int64 // KiB, VmRSS when sampling started
}

// procStatus returns the fields of /proc/PID/status that are in KiB.
func procStatus(t testing.TB, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/status: %v", pid, err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 10, 64)
		if err == nil {
			m[k] = n
		}
	}
	return m
}

func sampleMemory(t testing.TB, pid int) *memSampler {
	t.Helper()
	s := &memSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	s.baseline = procStatus(t, pid)["VmRSS"]
	s.peakRSS = s.baseline
	go func() {
		defer close(s.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				return
			}
			if i := bytes.Index(b, []byte("VmRSS:")); i >= 0 {
				var kb int64
				fmt.Sscan(string(b[i+len("VmRSS:"):]), &kb)
				s.peakRSS = max(s.peakRSS, kb)
				s.samples++
			}
		}
	}()
	return s
}

// finish stops sampling and returns a summary; VmHWM is the kernel's peak
// RSS since the process started.
func (s *memSampler) finish(t testing.TB) (peakRSS, hwm int64) {
	t.Helper()
	close(s.stop)
	<-s.done
	return s.peakRSS, procStatus(t, s.pid)["VmHWM"]
}

func fmtKiB(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// streamMeasured runs r on a server while sampling its memory, checks the
// stream's invariants, and logs the numbers.
func streamMeasured(t testing.TB, s *rsmServer, r metaReq) ([]span, int64) {
	t.Helper()
	mem := sampleMemory(t, s.pid())
	t0 := time.Now()
	m := s.get(t, r)
	d := time.Since(t0)
	peak, hwm := mem.finish(t)
	tuples := m.tuples()
	t.Logf("%v: %d tuples in %d pages in %v (%.0f tuples/s); server RSS %s before, peak %s sampled (%d samples), VmHWM %s",
		r, len(tuples), len(m.pages), d.Round(time.Millisecond), float64(len(tuples))/d.Seconds(),
		fmtKiB(mem.baseline), fmtKiB(peak), mem.samples, fmtKiB(hwm))
	return tuples, max(peak, hwm) - mem.baseline
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
func stripedMillion(t testing.TB) (rbdVolume, []span) {
	t.Helper()
	const (
		unit  = 4 << 10
		count = 2
		sets  = 1024
		set   = count * objSize // 8 MiB of the image
	)
	conn := connectAdmin(t)
	v, img := createVolume(t, conn, "", "million", sets*set, rbd.FeatureLayering|rbd.FeatureStripingV2, func(o *rbd.ImageOptions) {
		if err := o.SetUint64(rbd.ImageOptionStripeUnit, unit); err != nil {
			t.Fatal(err)
		}
		if err := o.SetUint64(rbd.ImageOptionStripeCount, count); err != nil {
			t.Fatal(err)
		}
	})
	snapshot(t, img, "s1")
	t0 := time.Now()
	lastUnit := uint64(objSize/unit-1) * count * unit // of the set's first object
	for s := uint64(0); s < sets; s++ {
		if _, err := img.WriteAt([]byte{1}, int64(s*set+lastUnit+unit-1)); err != nil {
			t.Fatal(err)
		}
	}
	snapshot(t, img, "s2")
	want := make([]span, 0, sets*objSize/unit)
	for s := uint64(0); s < sets; s++ {
		for u := uint64(0); u < objSize/unit; u++ {
			want = append(want, span{Offset: int64(s*set + u*count*unit), Length: unit})
		}
	}
	t.Logf("volume %s: %d writes made %d extents in %v", v.spec(), sets, len(want), time.Since(t0).Round(time.Millisecond))
	return v, want
}

// checkStreamMemory streams r, which must answer want, while sampling the
// server's memory, which must not grow by more than maxStreamGrowthKiB.
func checkStreamMemory(t *testing.T, srv *rsmServer, r metaReq, want []span) {
	t.Helper()
	got, growth := streamMeasured(t, srv, r)
	if diff := diffSpans(want, got); diff != "" {
		t.Fatalf("%v: %s", r, diff)
	}
	if growth > maxStreamGrowthKiB {
		t.Errorf("the server's RSS grew by %s while streaming, want at most %s: does it hold the whole answer?", fmtKiB(growth), fmtKiB(maxStreamGrowthKiB))
	}
}

// openFirstPage starts r on s and receives its first page.
func openFirstPage(ctx context.Context, t *testing.T, s *rsmServer, r metaReq) (recv func() (metaResponse, error), first metaResponse) {
	t.Helper()
	recv, err := s.open(ctx, r)
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
	srv := startServer(t, "--precision=exact")

	t.Run("delta-memory", func(t *testing.T) {
		checkStreamMemory(t, srv, metaReq{base: v.id("s1"), target: v.id("s2")}, want)
	})
	t.Run("allocated-memory", func(t *testing.T) {
		checkStreamMemory(t, srv, metaReq{target: v.id("s2")}, want)
	})
	t.Run("cancel-after-first-page", func(t *testing.T) {
		cancelAfterFirstPage(t, srv, metaReq{base: v.id("s1"), target: v.id("s2"), max: 1000}, want)
	})
	t.Run("sigterm-grace-lets-stream-finish", func(t *testing.T) {
		s := startServer(t, "--precision=exact", "--grace-period=60s")
		r := metaReq{base: v.id("s1"), target: v.id("s2"), secrets: csiSecrets(t)}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		recv, resp := openFirstPage(ctx, t, s, r)
		s.sigterm(t)
		time.Sleep(200 * time.Millisecond)
		got := toPage(resp).tuples
		for {
			resp, err := recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("%v: after SIGTERM, within the grace period: %v after %d tuples", r, err, len(got))
				}
				break
			}
			got = append(got, toPage(resp).tuples...)
		}
		if diff := diffSpans(want, got); diff != "" {
			t.Errorf("stream across SIGTERM: %s", diff)
		}
		if err, ok := s.wait(20 * time.Second); !ok || err != nil {
			t.Errorf("after SIGTERM and the last stream: exited %t, %v; want exit status 0", ok, err)
		}
	})
	t.Run("sigterm-grace-over-cancels-stream", func(t *testing.T) {
		s := startServer(t, "--precision=exact", "--grace-period=1s")
		r := metaReq{base: v.id("s1"), target: v.id("s2"), secrets: csiSecrets(t)}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		recv, resp := openFirstPage(ctx, t, s, r)
		t0 := time.Now()
		s.sigterm(t)
		// The client reads nothing more: the server blocks on a full
		// window until the grace period ends, then cancels the stream.
		if err, ok := s.wait(20 * time.Second); !ok || err != nil {
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
		if errors.Is(err, io.EOF) && n != len(want) {
			t.Errorf("the stream cut by the end of the grace period ended with OK after %d of %d tuples", n, len(want))
		}
		t.Logf("the client got %d of %d tuples, then %v", n, len(want), err)
	})
	t.Run("huge-max-results", func(t *testing.T) {
		// 2^20 tuples in one message would be over gRPC's 4 MiB limit:
		// the server must page them anyway.
		m := srv.get(t, metaReq{target: v.id("s2"), max: math.MaxInt32})
		if diff := diffSpans(want, m.tuples()); diff != "" {
			t.Errorf("max_results %d: %s", int32(math.MaxInt32), diff)
		}
		t.Logf("max_results %d: %d pages", int32(math.MaxInt32), len(m.pages))
	})
	t.Run("precise", func(t *testing.T) {
		// What really changed: one byte at the end of 1024 objects.
		var truth []span
		for i := 1023; i < len(want); i += 1024 {
			truth = append(truth, span{Offset: spanEnd(want[i]) - 1, Length: 1})
		}
		checkPrecise(t, metaReq{base: v.id("s1"), target: v.id("s2")}, truth)
	})
	t.Run("concurrent", func(t *testing.T) {
		// Three streams at once share one cluster connection.
		reqs := []metaReq{
			{base: v.id("s1"), target: v.id("s2")},
			{target: v.id("s2"), max: 4096},
			{base: v.id("s1"), target: v.id("s2"), start: int64(want[len(want)/2].Offset) + 1},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		got := make([]metaStream, len(reqs))
		t0 := time.Now()
		for i := range reqs {
			reqs[i].secrets = csiSecrets(t)
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i] = srv.call(ctx, reqs[i])
			}()
		}
		wg.Wait()
		t.Logf("%d concurrent streams in %v", len(reqs), time.Since(t0).Round(time.Millisecond))
		for i, r := range reqs {
			if got[i].err != nil {
				t.Errorf("%v: %v", r, got[i].err)
				continue
			}
			checkStream(t, r, got[i], srv.blockType(), srv.fixedSize())
			w := clipSpans(want, r.start, 1<<62)
			if diff := diffSpans(w, got[i].tuples()); diff != "" {
				t.Errorf("%v: %s", r, diff)
			}
		}
	})
}

// cancelAfterFirstPage cancels a stream once its first page has arrived,
// and checks that the call ends with CANCELLED, that the server stopped
// the diff early (its log says how many tuples it sent), that it is still
// up, and that the same request then runs to the end.
func cancelAfterFirstPage(t testing.TB, srv *rsmServer, r metaReq, want []span) {
	t.Helper()
	r.secrets = csiSecrets(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recv, err := srv.open(ctx, r)
	if err != nil {
		t.Fatalf("%v: %v", r, err)
	}
	first, err := recv()
	if err != nil {
		t.Fatalf("%v: first page: %v", r, err)
	}
	if n := len(first.GetBlockMetadata()); n == 0 || n > int(r.max) {
		t.Errorf("first page has %d tuples, want 1..%d", n, r.max)
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
		if m := re.FindStringSubmatch(srv.log()); m != nil {
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
	if !srv.running() {
		t.Fatalf("the server exited after a cancelled stream")
	}
	r.max = 0
	got := srv.get(t, r).tuples()
	if diff := diffSpans(want, got); diff != "" {
		t.Errorf("the request after the cancel: %s", diff)
	}
}

// checkPrecise streams r through a --precision=precise server (skipped
// when the binary has none) while sampling its memory, and checks that
// its answer covers truth, the bytes that really changed.
func checkPrecise(t testing.TB, r metaReq, truth []span) {
	t.Helper()
	if !serverHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	ps := startServer(t, "--precision=precise")
	got, growth := streamMeasured(t, ps, r)
	if miss := uncovered(truth, mergeSpans(got)); len(miss) > 0 {
		t.Errorf("%d of the %d changed bytes are in no tuple; first missed: %v", totalBytes(miss), totalBytes(truth), miss[:min(len(miss), 10)])
	}
	if growth > maxStreamGrowthKiB {
		t.Errorf("the server's RSS grew by %s while streaming, want at most %s", fmtKiB(growth), fmtKiB(maxStreamGrowthKiB))
	}
	t.Logf("precise: %d tuples, %d bytes for %d changed bytes (%s)", len(got), totalBytes(got), totalBytes(truth), reportRatio(totalBytes(got), totalBytes(truth)))
}

// ----------------------------------------------- many small writes --

// importDiff writes records to the image with `rbd import-diff -`: one
// process, librbd's own write concurrency, far faster than synchronous
// go-ceph writes. Each record is written as one write of len(data) bytes.
func importDiff(t testing.TB, v rbdVolume, offsets func(yield func(off uint64) bool), data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rbd", "import-diff", "--no-progress", "--rbd-concurrent-management-ops", "32", "-", v.spec())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("rbd import-diff: %v", err)
	}
	w := bufio.NewWriterSize(in, 1<<20)
	var hdr [17]byte
	werr := func() error {
		if _, err := io.WriteString(w, "rbd diff v1\n"); err != nil {
			return err
		}
		for off := range offsets {
			hdr[0] = 'w'
			binary.LittleEndian.PutUint64(hdr[1:], off)
			binary.LittleEndian.PutUint64(hdr[9:], uint64(len(data)))
			w.Write(hdr[:])
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
		w.WriteByte('e')
		return w.Flush()
	}()
	in.Close()
	if err := cmd.Wait(); err != nil || werr != nil {
		t.Fatalf("rbd import-diff - %s: %v (writing: %v)\n%s", v.spec(), err, werr, stderr.Bytes())
	}
}

// manyWrites builds a volume (Ceph-CSI's features) whose Delta from s1 to
// s2 is exactly n separate 512-byte writes, 256 per 4 MiB object, 16 KiB
// apart. Every object exists at s1 with its full size (one byte at its
// end), so that librbd's diff is exact: the writes and nothing else.
func manyWrites(t testing.TB, n int) (rbdVolume, []span) {
	t.Helper()
	const (
		per    = 256
		stride = objSize / per
		size   = 512
	)
	objects := uint64((n + per - 1) / per)
	conn := connectAdmin(t)
	v, img := createVolume(t, conn, "", "writes", objects*objSize, imageFeatures)
	img.Close() // rbd import-diff takes the exclusive lock
	snap := func(name string) {
		rbdCLI(t, "snap", "create", "--no-progress", v.spec()+"@"+name)
	}
	t0 := time.Now()
	importDiff(t, v, func(yield func(uint64) bool) {
		for o := uint64(0); o < objects; o++ {
			if !yield(o*objSize + objSize - 1) {
				return
			}
		}
	}, []byte{0xff})
	snap("s1")
	t1 := time.Now()
	data := bytes.Repeat([]byte{0x5a}, size)
	importDiff(t, v, func(yield func(uint64) bool) {
		// Object by object in the inner loop, so that concurrent writes
		// go to different objects.
		for k := uint64(0); k < uint64(n); k++ {
			if !yield(k%objects*objSize + k/objects*stride) {
				return
			}
		}
	}, data)
	snap("s2")
	d := time.Since(t1)
	t.Logf("volume %s: %d objects created in %v; %d writes of %d bytes in %v (%.0f writes/s)",
		v.spec(), objects, t1.Sub(t0).Round(time.Millisecond), n, size, d.Round(time.Millisecond), float64(n)/d.Seconds())
	want := make([]span, 0, n)
	for o := uint64(0); o < objects; o++ {
		for k := o; k < uint64(n); k += objects {
			want = append(want, span{Offset: int64(o*objSize + k/objects*stride), Length: size})
		}
	}
	return v, want
}

// TestManyWrites streams a Delta of many separate writes (100k; 2^20 with
// RSM_E2E_BIG=1, which takes minutes to write) and compares it with
// exactly those writes, sampling the server's memory, then cancels one
// after its first page.
func TestManyWrites(t *testing.T) {
	n := 100_000
	if bigRun() {
		n = 1 << 20
	}
	v, want := manyWrites(t, n)
	srv := startServer(t, "--precision=exact")
	t.Run("delta-memory", func(t *testing.T) {
		checkStreamMemory(t, srv, metaReq{base: v.id("s1"), target: v.id("s2")}, want)
	})
	t.Run("matches-rbd-diff", func(t *testing.T) {
		got := srv.get(t, metaReq{base: v.id("s1"), target: v.id("s2")}).tuples()
		rd := wantFromRbdDiff(rbdDiffOf(t, v, "s1", "s2", false), true)
		if diff := diffSpans(rd, got); diff != "" {
			t.Fatalf("Delta against rbd diff (want): %s", diff)
		}
	})
	t.Run("cancel-after-first-page", func(t *testing.T) {
		cancelAfterFirstPage(t, srv, metaReq{base: v.id("s1"), target: v.id("s2"), max: 100}, want)
	})
	t.Run("precise", func(t *testing.T) {
		// The writes are all that changed (non-zero data over zeros).
		checkPrecise(t, metaReq{base: v.id("s1"), target: v.id("s2")}, want)
	})
}
