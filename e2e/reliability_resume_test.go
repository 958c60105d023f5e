//go:build e2e

package e2e

// A stream survives an OSD outage longer than the op timeout: the server
// resumes it inside the stream (--resume-budget), and the client gets the
// answer of an uninterrupted stream. Every mode runs as a concurrent stream
// during one outage, so that the test costs one outage, not eight.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// The outage: the OSD stopped (SIGSTOP) for relOutage, four times the op
// timeout; the budget of the server that must give up.
const (
	relOutage      = 20 * time.Second
	relShortBudget = 5 * time.Second
)

// resumeStream is one stream of TestReliabilityResume.
type resumeStream struct {
	name   string
	srv    *harness.Server
	q      harness.MetaReq
	want   []harness.Span
	giveUp bool            // its server's budget is shorter than the outage
	late   bool            // requested during the outage: its first open fails
	slow   *harness.Server // a late stream's connection, made before the outage

	recv  func() (harness.MetaResponse, error)
	got   []harness.Span
	err   error
	ended time.Time
}

// readToEnd reads the stream's pages until it ends, and records how and
// when.
func (s *resumeStream) readToEnd() { s.readPaced(0) }

// readPaced is readToEnd waiting every after each page: a consumer's pace.
func (s *resumeStream) readPaced(every time.Duration) {
	for {
		resp, err := s.recv()
		if err != nil {
			s.err, s.ended = err, time.Now()
			return
		}
		s.got = append(s.got, harness.ToPage(resp).Tuples...)
		time.Sleep(every)
	}
}

// TestReliabilityResume stops the OSD for relOutage in the middle of
// concurrent streams: exact and precise, VARIABLE_LENGTH and FIXED_LENGTH,
// Allocated and Delta, pages of 1 and 3 tuples, and a Delta requested
// during the outage (a backup that starts then: its first open fails).
// Each must end OK with the tuples of an uninterrupted stream; a server whose budget is shorter than
// the outage must end its stream UNAVAILABLE within its budget plus one op
// timeout and one backoff; every server answers at once after the outage.
func TestReliabilityResume(t *testing.T) {
	if !harness.ServerHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	r := startResume(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	r.openStreams(t, ctx)
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	crecv, copened := r.openCancelled(t, cctx)
	t0, back, tc := r.outage(t, ctx, crecv, ccancel)
	for _, s := range r.streams {
		if s.giveUp {
			s.checkGaveUp(t, t0)
			continue
		}
		s.checkResumed(t, t0, back)
	}
	harness.WaitClusterIO(t)
	checkCancelled(t, r.cancelled, copened, tc)
	checkResumedServers(t, r.streams, r.metrics)
}

// resumeRun is what TestReliabilityResume's steps share: the volume, the
// base flags of its servers, the streams and the metrics addresses of
// their servers, and the server of the stream to cancel with its request.
type resumeRun struct {
	v         harness.RbdVolume
	base      []string
	streams   []*resumeStream
	metrics   map[*harness.Server]string
	cancelled *harness.Server
	cq        harness.MetaReq
}

// startResume: the servers, one a mode and block type (with metrics; the
// exact VARIABLE_LENGTH one also serves the late Delta), the one with the
// short budget and the one whose stream is cancelled, and their streams'
// uninterrupted answers.
func startResume(t *testing.T) *resumeRun {
	v, _ := harness.SharedManyWrites(t, 16384)
	r := &resumeRun{v: v, base: []string{"--ceph-op-timeout=" + relOpTimeout.String(), "--fixed-block-size", "4096"},
		metrics: map[*harness.Server]string{}}
	for _, mode := range []string{"exact", "precise"} {
		for _, typ := range []string{"VARIABLE_LENGTH", "FIXED_LENGTH"} {
			addr := harness.FreeTCPAddr(t)
			srv := harness.StartServer(t, append(r.base, "--precision="+mode, "--block-metadata-type", typ, "--metrics-address="+addr)...)
			r.metrics[srv] = addr
			r.add(t, mode+"/"+typ, srv, false)
			if mode == "exact" && typ == "VARIABLE_LENGTH" {
				q := harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Max: 100}
				want := srv.Get(t, q).Tuples()
				q.Secrets = harness.CSISecrets(t)
				r.streams = append(r.streams, &resumeStream{name: "late/" + q.String(), srv: srv, q: q, want: want, late: true})
			}
		}
	}
	short := harness.StartServer(t, append(r.base, "--precision=exact", "--resume-budget="+relShortBudget.String())...)
	r.add(t, "budget", short, true)
	// A stream cancelled while its server backs off or re-opens.
	r.cancelled = harness.StartServer(t, append(r.base, "--precision=exact")...)
	r.cq = harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Max: 1, Secrets: harness.CSISecrets(t)}
	return r
}

// add adds srv's streams, named after name: an Allocated in pages of 2
// tuples (not if it gives up) and a Delta in pages of 1, with their
// uninterrupted answers.
func (r *resumeRun) add(t *testing.T, name string, srv *harness.Server, giveUp bool) {
	qs := []harness.MetaReq{{Target: r.v.ID("s2"), Max: 2}, {Base: r.v.ID("s1"), Target: r.v.ID("s2"), Max: 1}}
	if giveUp {
		qs = qs[1:]
	}
	for _, q := range qs {
		want := srv.Get(t, q).Tuples()
		q.Secrets = harness.CSISecrets(t)
		r.streams = append(r.streams, &resumeStream{name: name + "/" + q.String(), srv: srv, q: q, want: want, giveUp: giveUp})
	}
}

// openStreams opens every stream but the late ones and reads its first
// page; a late stream gets its connection only.
func (r *resumeRun) openStreams(t *testing.T, ctx context.Context) {
	for _, s := range r.streams {
		if s.late {
			s.slow = harness.SlowReader(t, s.srv.Sock)
			continue
		}
		// A connection of its own with a fixed 64 KiB window and small
		// pages: the diff waits in the middle of the image, with Ceph
		// work left, when the fault comes (see relOSDFault).
		var err error
		if s.recv, err = harness.SlowReader(t, s.srv.Sock).Open(ctx, s.q); err != nil {
			t.Fatal(err)
		}
		resp, err := s.recv()
		if err != nil {
			t.Fatalf("%s: first page: %v", s.name, err)
		}
		s.got = harness.ToPage(resp).Tuples
	}
}

// openCancelled opens the stream to cancel, on cctx, and reads its first
// page; it returns the stream and when it was opened.
func (r *resumeRun) openCancelled(t *testing.T, cctx context.Context) (crecv func() (harness.MetaResponse, error), copened time.Time) {
	slow := harness.SlowReader(t, r.cancelled.Sock)
	copened = time.Now()
	crecv, err := slow.Open(cctx, r.cq)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crecv(); err != nil {
		t.Fatalf("the stream to cancel: first page: %v", err)
	}
	return crecv, copened
}

// outage, half a second after the streams opened, stops the OSD for
// relOutage while every stream is read to its end (the late ones opened
// a second into it) and the stream to cancel is cancelled (ccancel) at
// tc; it returns when the OSD stopped (t0) and came back, once every
// stream ended.
func (r *resumeRun) outage(t *testing.T, ctx context.Context, crecv func() (harness.MetaResponse, error), ccancel context.CancelFunc) (t0, back, tc time.Time) {
	time.Sleep(500 * time.Millisecond)
	osd := harness.PauseOSD(t)
	t0 = time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, err := crecv(); err != nil {
				return
			}
		}
	}()
	// The exact diff fails about two op timeouts after the fault; 4 s
	// later the server backs off or re-opens.
	const cancelAt = 2*relOpTimeout + 4*time.Second
	time.AfterFunc(cancelAt, ccancel)
	tc = t0.Add(cancelAt)
	for _, s := range r.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.late {
				time.Sleep(time.Second)
				var err error
				if s.recv, err = s.slow.Open(ctx, s.q); err != nil {
					s.err, s.ended = err, time.Now()
					return
				}
			}
			s.readToEnd()
		}()
	}
	osd.Outage(relOutage)
	back = time.Now()
	wg.Wait()
	t.Logf("OSD stopped for %v; all streams ended %v after it came back", back.Sub(t0).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	return t0, back, tc
}

// checkGaveUp checks a stream of the short budget's server, faulted at
// t0: it ended UNAVAILABLE naming --resume-budget, within its budget plus
// one op timeout and one backoff, with a prefix of the answer.
func (s *resumeStream) checkGaveUp(t *testing.T, t0 time.Time) {
	took := s.ended.Sub(t0).Round(time.Millisecond)
	bound := relOpTimeout + relShortBudget + relOpTimeout + 10*time.Second
	t.Logf("%s: %d of %d tuples, %v, %v after the fault", s.name, len(s.got), len(s.want), s.err, took)
	if status.Code(s.err) != codes.Unavailable || !strings.Contains(s.err.Error(), "--resume-budget") {
		t.Errorf("%s: %v; want UNAVAILABLE naming --resume-budget", s.name, s.err)
	}
	if took > bound {
		t.Errorf("%s: gave up %v after the fault, want within %v", s.name, took, bound)
	}
	if d := harness.DiffSpans(s.want[:min(len(s.got), len(s.want))], s.got); d != "" {
		t.Errorf("%s: not a prefix: %s", s.name, d)
	}
}

// checkResumed checks a stream that resumes through the outage (t0 to
// back): it ended OK with the tuples of an uninterrupted stream, a late
// one not before the OSD came back.
func (s *resumeStream) checkResumed(t *testing.T, t0, back time.Time) {
	took := s.ended.Sub(t0).Round(time.Millisecond)
	t.Logf("%s: %d tuples, %v, ended %v after the fault (%v after the OSD came back)", s.name, len(s.got), s.err, took, s.ended.Sub(back).Round(time.Millisecond))
	switch {
	case s.late && s.ended.Before(back):
		t.Errorf("%s: requested during the outage, it ended before the OSD came back", s.name)
	case s.ended.Before(back):
		t.Logf("%s: ended before the OSD came back: its diff had no Ceph work left; it proves nothing", s.name)
	}
	if !errors.Is(s.err, io.EOF) {
		t.Errorf("%s: %v after %d of %d tuples; want OK", s.name, s.err, len(s.got), len(s.want))
	}
	if d := harness.DiffSpans(s.want, s.got); d != "" {
		t.Errorf("%s: the resumed stream differs from an uninterrupted one: %s", s.name, d)
	}
}

// checkCancelled checks, from its server's summary line, that the stream
// cancelled at tc during an outage ended CANCELLED at once: during a
// backoff, or after the re-open in flight in librbd, within the op
// timeout.
func checkCancelled(t *testing.T, srv *harness.Server, opened, tc time.Time) {
	for _, l := range strings.Split(srv.Log(), "\n") {
		if !strings.Contains(l, `"Stream finished"`) || !strings.Contains(l, `code="Canceled"`) {
			continue
		}
		_, after, _ := strings.Cut(l, ` duration="`)
		ds, _, _ := strings.Cut(after, `"`)
		d, err := time.ParseDuration(ds)
		if err != nil {
			t.Fatalf("no duration in %q", l)
		}
		lag := opened.Add(d).Sub(tc)
		t.Logf("cancelled during the outage: the server ended the stream CANCELLED about %v after the cancel", lag.Round(time.Millisecond))
		if lag > relOpTimeout+2*time.Second {
			t.Errorf("the cancelled stream ended %v after the cancel, want within the op timeout of %v", lag, relOpTimeout)
		}
		return
	}
	t.Errorf("no stream ended CANCELLED:\n%s", harness.Tail(srv.Log(), 10))
}

// checkResumedServers checks, after the outage, that each server answers at
// once, logged its resumes, and counted them in its metrics.
func checkResumedServers(t *testing.T, streams []*resumeStream, metrics map[*harness.Server]string) {
	seen := map[*harness.Server]bool{}
	for _, s := range streams {
		if seen[s.srv] {
			continue
		}
		seen[s.srv] = true
		t1 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m := s.srv.Call(ctx, s.q)
		cancel()
		if m.Err != nil || harness.DiffSpans(s.want, m.Tuples()) != "" {
			t.Errorf("%s after the outage: %d tuples, %v", s.name, len(m.Tuples()), m.Err)
		}
		log := s.srv.Log()
		resumed := strings.Count(log, `"Resumed stream"`)
		t.Logf("%s: the server answers %v after the outage; %d resumes logged", s.name, time.Since(t1).Round(time.Millisecond), resumed)
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, `"Resumed stream"`) {
				t.Logf("  %s", l[strings.Index(l, `"Resumed`):])
			}
		}
		addr, ok := metrics[s.srv]
		if !ok {
			continue
		}
		if resumed == 0 {
			t.Errorf("%s: no resume logged", s.name)
		}
		body := harness.Scrape(t, addr)
		var n float64
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "rbd_snapshot_metadata_stream_resumes_total{") {
				var v float64
				fmt.Sscanf(l[strings.LastIndex(l, " ")+1:], "%g", &v)
				n += v
				t.Logf("  %s", l)
			}
		}
		if n != float64(resumed) {
			t.Errorf("%s: %v resumes in the metrics, %d logged", s.name, n, resumed)
		}
	}
}

// TestReliabilityMonitorLeader runs a stream on a cluster of three
// monitors (cluster.sh's RSM_CEPH_MONS=3) and SIGKILLs the quorum's
// leader in the middle of it: the stream must end OK with the tuples of an
// uninterrupted one, and a new request, which needs a monitor session, is
// then served by the two that are left.
func TestReliabilityMonitorLeader(t *testing.T) {
	free := func(p int) bool {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
	var c *harness.ExtraCluster
	for b := 18000; b < 18500 && c == nil; b += 100 {
		if free(b) && free(b+1) && free(b+2) && free(b+3) && free(b+4) && free(b+5) && free(b+10) {
			c = harness.StartExtraCluster(t, "127.0.0.1", b, b, b+1, "RSM_CEPH_MONS=3")
		}
	}
	if c == nil {
		t.Fatal("no free port block on 127.0.0.1 among 18000..18400")
	}
	conn := harness.ConnectTo(t, c.Env["CEPH_MON_HOST"], c.Env["CEPH_USER"], c.Env["CEPH_KEY"])
	// 4096 writes of 512 bytes, 16 KiB apart: a Delta of 4096 tuples, in
	// pages of one tuple more than a 64 KiB window holds.
	v, img := harness.CreateVolume(t, conn, "", "monlead", 64*harness.MiB, harness.ImageFeatures)
	harness.Snapshot(t, img, "s1")
	for i := uint64(0); i < 4096; i++ {
		harness.FillAt(t, img, i*16<<10, 512)
	}
	harness.Snapshot(t, img, "s2")
	srv := harness.StartServer(t, "--clusterconfig", filepath.Join(c.Dir, "csi-config.json"), "--ceph-op-timeout="+relOpTimeout.String())
	secrets := map[string]string{"userID": c.Env["CEPH_CSI_USER"], "userKey": c.Env["CEPH_CSI_KEY"]}
	q := harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Max: 1, Secrets: secrets}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	want := srv.Call(ctx, q)
	if want.Err != nil || len(want.Tuples()) != 4096 {
		t.Fatalf("before the fault: %d tuples, %v", len(want.Tuples()), want.Err)
	}

	recv, err := harness.SlowReader(t, srv.Sock).Open(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := recv()
	if err != nil {
		t.Fatalf("first page: %v", err)
	}
	got := harness.ToPage(resp).Tuples
	time.Sleep(500 * time.Millisecond)
	out, err := exec.CommandContext(ctx, "ceph", "--conf", c.Env["CEPH_CONF"], "--connect-timeout", "20", "quorum_status").Output()
	if err != nil {
		t.Fatalf("ceph quorum_status: %v", err)
	}
	var qs struct {
		Leader string `json:"quorum_leader_name"`
	}
	if err := json.Unmarshal(out, &qs); err != nil || qs.Leader == "" {
		t.Fatalf("quorum_status: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, "run", "ceph-mon."+qs.Leader+".pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL mon.%s (pid %d): %v", qs.Leader, pid, err)
	}
	t0 := time.Now()
	t.Logf("SIGKILL the leader, mon.%s (pid %d), after %d tuples", qs.Leader, pid, len(got))
	for {
		resp, err = recv()
		if err != nil {
			break
		}
		got = append(got, harness.ToPage(resp).Tuples...)
	}
	t.Logf("the stream ended %v after the kill: %d tuples, %v", time.Since(t0).Round(time.Millisecond), len(got), err)
	if !errors.Is(err, io.EOF) {
		t.Errorf("the stream ended with %v, want OK", err)
	}
	if d := harness.DiffSpans(want.Tuples(), got); d != "" {
		t.Errorf("the stream differs from an uninterrupted one: %s", d)
	}
	// A new connection (another user) needs a monitor session now.
	t1 := time.Now()
	admin := q
	admin.Secrets = map[string]string{"userID": c.Env["CEPH_USER"], "userKey": c.Env["CEPH_KEY"]}
	m := srv.Call(ctx, admin)
	t.Logf("a request on a new connection after the kill: %d tuples, %v, in %v; %d resumes logged",
		len(m.Tuples()), m.Err, time.Since(t1).Round(time.Millisecond), strings.Count(srv.Log(), `"Resumed stream"`))
	if m.Err != nil || harness.DiffSpans(want.Tuples(), m.Tuples()) != "" {
		t.Errorf("after the leader's kill: %v", m.Err)
	}
}

// TestReliabilityResumeOSDKilled SIGKILLs the OSD in the middle of an
// exact and a precise Delta and starts it again relOutage later (as
// cluster.sh starts it): both streams end OK with the tuples of an
// uninterrupted stream.
func TestReliabilityResumeOSDKilled(t *testing.T) {
	if !harness.ServerHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	v, _ := harness.SharedManyWrites(t, 16384)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	var streams []*resumeStream
	for _, mode := range []string{"exact", "precise"} {
		srv := harness.StartServer(t, "--ceph-op-timeout="+relOpTimeout.String(), "--precision="+mode)
		q := harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Max: 1}
		s := &resumeStream{name: mode + "/" + q.String(), srv: srv, want: srv.Get(t, q).Tuples()}
		q.Secrets = harness.CSISecrets(t)
		s.q = q
		var err error
		if s.recv, err = harness.SlowReader(t, srv.Sock).Open(ctx, q); err != nil {
			t.Fatal(err)
		}
		resp, err := s.recv()
		if err != nil {
			t.Fatalf("%s: first page: %v", s.name, err)
		}
		s.got = harness.ToPage(resp).Tuples
		streams = append(streams, s)
	}
	time.Sleep(500 * time.Millisecond)
	restart := harness.KillOSD(t)
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.readToEnd()
		}()
	}
	time.Sleep(relOutage)
	restart()
	back := time.Now()
	wg.Wait()
	t.Logf("OSD killed, started again %v later and serving %v after that", relOutage, back.Sub(t0.Add(relOutage)).Round(time.Millisecond))
	for _, s := range streams {
		t.Logf("%s: %d tuples, %v, ended %v after the kill (%v after the OSD served again); %d resumes logged",
			s.name, len(s.got), s.err, s.ended.Sub(t0).Round(time.Millisecond), s.ended.Sub(back).Round(time.Millisecond),
			strings.Count(s.srv.Log(), `"Resumed stream"`))
		if !errors.Is(s.err, io.EOF) {
			t.Errorf("%s: %v after %d of %d tuples; want OK", s.name, s.err, len(s.got), len(s.want))
		}
		if d := harness.DiffSpans(s.want, s.got); d != "" {
			t.Errorf("%s: the resumed stream differs from an uninterrupted one: %s", s.name, d)
		}
		t1 := time.Now()
		m := s.srv.Call(ctx, s.q)
		if m.Err != nil || harness.DiffSpans(s.want, m.Tuples()) != "" {
			t.Errorf("%s after the outage: %d tuples, %v", s.name, len(m.Tuples()), m.Err)
		}
		t.Logf("%s: the server answers %v after the outage", s.name, time.Since(t1).Round(time.Millisecond))
	}
}

// The outage of TestReliabilityResumeNoHole: longer than one op timeout,
// shorter than two, so that the list-snaps requests in flight when the
// OSD stops time out, and the one librbd sends next is answered once the
// OSD continues, before librbd returns the error (issue 27); shorter
// than laggyAfter, so that the OSD only continues.
const holeOutage = relOpTimeout + relOpTimeout/2

// The pace of TestReliabilityResumeNoHole's streams, and when the OSD
// stops: a quarter of the way in.
const (
	holePace    = 30 * time.Second // how long a paced stream lasts
	holeFaultAt = holePace / 4
)

// TestReliabilityResumeNoHole reads streams at a consumer's pace over
// small windows, so that each diff waits with pages buffered and Ceph work
// left, and stops the OSD for holeOutage a quarter of the way in: exact,
// object and precise modes, VARIABLE_LENGTH and FIXED_LENGTH, Allocated
// and Delta. A failed librbd diff has then delivered the extents of a
// later object while up to rbd_concurrent_management_ops objects before
// it delivered nothing. Every stream must end OK with exactly the answer
// of an uninterrupted one (the Deltas of exact and precise mode also
// exactly the bytes written), or with a retryable error; never OK with a
// hole.
func TestReliabilityResumeNoHole(t *testing.T) {
	if !harness.ServerHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	r := startHole(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	t0 := r.readThroughOutage(t, ctx)
	r.checkStreams(t, t0)
	r.checkServers(t)
	harness.WaitClusterIO(t)
}

// pacedStream is one stream of TestReliabilityResumeNoHole, read a page
// every every.
type pacedStream struct {
	resumeStream
	every  time.Duration
	oracle bool // the Delta of an exact answer: the writes themselves
}

// holeRun is what TestReliabilityResumeNoHole's steps share: the bytes
// written between the snapshots, the streams, and their servers by mode
// and block type.
type holeRun struct {
	written []harness.Span
	streams []*pacedStream
	servers map[string]*harness.Server
}

// startHole: a server a mode and block type, and its Allocated and Delta
// streams, in about 256 pages each, with their uninterrupted answers and
// their pace.
func startHole(t *testing.T) *holeRun {
	v, written := harness.ManyWrites(t, 32768)
	base := []string{"--ceph-op-timeout=" + relOpTimeout.String(), "--fixed-block-size", "4096"}
	r := &holeRun{written: written, servers: map[string]*harness.Server{}}
	for _, m := range []struct{ mode, typ string }{
		// Object mode in FIXED_LENGTH: in VARIABLE_LENGTH its whole
		// objects merge into one tuple.
		{"exact", "VARIABLE_LENGTH"}, {"exact", "FIXED_LENGTH"}, {"object", "FIXED_LENGTH"},
		{"precise", "VARIABLE_LENGTH"}, {"precise", "FIXED_LENGTH"},
	} {
		name := m.mode + "/" + m.typ
		srv := harness.StartServer(t, append(base, "--precision="+m.mode, "--block-metadata-type", m.typ)...)
		r.servers[name] = srv
		for _, q := range []harness.MetaReq{{Target: v.ID("s2")}, {Base: v.ID("s1"), Target: v.ID("s2")}} {
			want := srv.Get(t, q).Tuples()
			// About 256 pages a stream, whatever its length.
			q.Max = int32(max(1, len(want)/256))
			q.Secrets = harness.CSISecrets(t)
			pages := (len(want) + int(q.Max) - 1) / int(q.Max)
			r.streams = append(r.streams, &pacedStream{
				resumeStream: resumeStream{name: name + "/" + q.String(), srv: srv, q: q, want: want},
				every:        holePace / time.Duration(max(pages, 1)),
				oracle:       q.Base != "" && m.mode != "object" && m.typ == "VARIABLE_LENGTH",
			})
		}
	}
	return r
}

// readThroughOutage opens the streams and reads each at its pace to its
// end, while the OSD stops for holeOutage holeFaultAt in; it returns when
// the OSD stopped, once every stream ended.
func (r *holeRun) readThroughOutage(t *testing.T, ctx context.Context) (t0 time.Time) {
	var wg sync.WaitGroup
	for _, s := range r.streams {
		var err error
		if s.recv, err = harness.SlowReader(t, s.srv.Sock).Open(ctx, s.q); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.readPaced(s.every)
		}()
	}
	time.Sleep(holeFaultAt)
	osd := harness.PauseOSD(t)
	t0 = time.Now()
	time.Sleep(holeOutage)
	osd.Resume()
	back := time.Now()
	wg.Wait()
	t.Logf("OSD stopped for %v; all streams ended %v after it came back", back.Sub(t0).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	return t0
}

// checkStreams checks that every stream, faulted at t0, ended OK with
// exactly the uninterrupted answer (and the bytes written, for the
// oracle's), or with a retryable error after a prefix of it.
func (r *holeRun) checkStreams(t *testing.T, t0 time.Time) {
	for _, s := range r.streams {
		resumes := strings.Count(s.srv.Log(), `"Resumed stream"`)
		t.Logf("%s: %d of %d tuples, %v, ended %v after the fault; its server resumed %d times",
			s.name, len(s.got), len(s.want), s.err, s.ended.Sub(t0).Round(time.Millisecond), resumes)
		switch c := status.Code(s.err); {
		case errors.Is(s.err, io.EOF):
			if d := harness.DiffSpans(s.want, s.got); d != "" {
				t.Errorf("%s: ended OK with another answer than an uninterrupted stream's: %s", s.name, d)
			}
			if d := harness.DiffSpans(r.written, s.got); s.oracle && d != "" {
				t.Errorf("%s: ended OK with another answer than the bytes written: %s", s.name, d)
			}
		case c == codes.Unavailable || c == codes.Aborted:
			if d := harness.DiffSpans(s.want[:min(len(s.got), len(s.want))], s.got); d != "" {
				t.Errorf("%s: ended %v, and what it sent is not a prefix of the answer: %s", s.name, c, d)
			}
		default:
			t.Errorf("%s: %v after %d of %d tuples; want OK, or a retryable error", s.name, s.err, len(s.got), len(s.want))
		}
	}
}

// checkServers checks that the exact server resumed (the fault came while
// its diff had Ceph work left) and that no server's seam check caught a
// hole; it logs their resumes.
func (r *holeRun) checkServers(t *testing.T) {
	// The hole needs a diff that has Ceph work left when the OSD stops:
	// librbd's exact diff of the Delta must have failed and resumed.
	if log := r.servers["exact/VARIABLE_LENGTH"].Log(); !strings.Contains(log, `"Resumed stream"`) {
		t.Errorf("the exact server resumed no stream: the fault came when no diff had Ceph work left, and the test proves nothing")
	}
	for name, srv := range r.servers {
		// The seam check ends a stream ABORTED when a resumed diff has
		// changes the stream lacks: a hole that rbd's holdback let
		// through.
		if strings.Contains(srv.Log(), "A resumed diff disagrees") {
			t.Errorf("%s: the seam check caught a hole that the holdback let through", name)
		}
		for _, l := range strings.Split(srv.Log(), "\n") {
			if strings.Contains(l, `"Resumed stream"`) {
				t.Logf("%s:  %s", name, l[strings.Index(l, `"Resumed`):])
			}
		}
	}
}
