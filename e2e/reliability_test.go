//go:build e2e

package e2e

// Faults against the real cluster: the OSD stopped (SIGSTOP) or killed
// (SIGKILL) in the middle of a stream, the monitors unreachable or hung at
// request time, and the server itself killed in the middle of a stream.
// The cluster is shared by every test of the run: every fault is undone
// in a t.Cleanup (SIGCONT, or the OSD started again), and the test waits
// until the cluster serves I/O again. This file sorts after the other
// reliability files, so that these tests run after nearly all others
// (revocation_test.go's TestRevokedKey runs after them).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// The librados timeouts of the fault tests' servers.
const (
	relOpTimeout      = 5 * time.Second
	relConnectTimeout = 3 * time.Second
)

// relBound is how long a fault may take to end a stream or a request:
// several times the timeout, for a loaded machine, but far from librados'
// defaults (300 s to connect, no limit on operations).
func relBound(timeout time.Duration) time.Duration { return 4*timeout + 10*time.Second }

// TestReliabilityFaults runs the fault cases in turn on one volume whose
// Delta and Allocated have more than 16k tuples: a stream of one tuple a
// page fills gRPC's flow control window after a few thousand, and the
// diff waits there, in the middle of the image, until the client reads on.
func TestReliabilityFaults(t *testing.T) {
	v, _ := harness.SharedManyWrites(t, 16384)
	t.Run("monitors", func(t *testing.T) { relMonitors(t, v) })
	t.Run("server-killed", func(t *testing.T) { relServerKilled(t, v) })
	for _, mode := range []string{"exact", "precise"} {
		t.Run("osd-sigstop/"+mode, func(t *testing.T) {
			relOSDFault(t, v, mode, func(t *testing.T) func() { return harness.PauseOSD(t).Resume })
		})
	}
	// The OSD killed and restarted (as cluster.sh starts it: harness.KillOSD).
	t.Run("osd-sigkill/exact", func(t *testing.T) {
		relOSDFault(t, v, "exact", func(t *testing.T) func() { return harness.KillOSD(t) })
	})
}

// relOSDFault stops the OSD in the middle of a stream with fault, which
// returns the function that undoes it. The stream must end non-OK within
// a bound set by the OSD op timeout, with a prefix of the answer; once the
// OSD is back, the same server must answer as before the fault.
func relOSDFault(t *testing.T, v harness.RbdVolume, mode string, fault func(*testing.T) func()) {
	if mode == "precise" && !harness.ServerHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	r := startOSDFault(t, v, mode)
	q := r.qs[1]
	q.Max, q.Secrets = 1, harness.CSISecrets(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	recv, got := r.openStream(t, ctx, q)
	// Let the server fill the flow control window and wait there.
	time.Sleep(500 * time.Millisecond)
	undo := fault(t)
	t0 := time.Now()
	var err error
	for {
		var resp harness.MetaResponse
		if resp, err = recv(); err != nil {
			break
		}
		got = append(got, harness.ToPage(resp).Tuples...)
	}
	took := time.Since(t0)
	r.checkFaulted(t, q, got, err, took)
	undo()
	harness.WaitClusterIO(t)
	r.answersAgain(t)
}

// osdFault is what relOSDFault's steps share: the mode, its server with
// --resume-budget=0, the Allocated and Delta of the volume and their
// answers before the fault.
type osdFault struct {
	mode string
	srv  *harness.Server
	qs   []harness.MetaReq
	want [][]harness.Span
}

// startOSDFault starts the server of mode and gets its answers before the
// fault.
func startOSDFault(t *testing.T, v harness.RbdVolume, mode string) *osdFault {
	// --resume-budget=0: the behaviour without resuming, which
	// reliability_resume_test.go compares with.
	srv := harness.StartServer(t, "--precision="+mode, "--ceph-op-timeout="+relOpTimeout.String(), "--resume-budget=0")
	qs := []harness.MetaReq{{Target: v.ID("s2")}, {Base: v.ID("s1"), Target: v.ID("s2")}}
	want := make([][]harness.Span, len(qs))
	for i := range qs {
		want[i] = srv.Get(t, qs[i]).Tuples()
	}
	return &osdFault{mode: mode, srv: srv, qs: qs, want: want}
}

// openStream opens q on a slow reader and reads its first page.
func (r *osdFault) openStream(t *testing.T, ctx context.Context, q harness.MetaReq) (func() (harness.MetaResponse, error), []harness.Span) {
	// A connection of its own with a fixed 64 KiB flow control window (no
	// BDP growth) and pages of one tuple: the server can send only a few
	// thousand of the 16k tuples before it waits, so the diff is still
	// running, with Ceph work left, when the fault comes.
	recv, err := harness.SlowReader(t, r.srv.Sock).Open(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := recv()
	if err != nil {
		t.Fatalf("%v: first page: %v", q, err)
	}
	return recv, harness.ToPage(resp).Tuples
}

// checkFaulted checks the stream q, which ended with err took after the
// fault: non-OK, within relBound of the op timeout, with a prefix of the
// answer (in precise mode, covering it up to its last tuple).
func (r *osdFault) checkFaulted(t *testing.T, q harness.MetaReq, got []harness.Span, err error, took time.Duration) {
	want := r.want[1]
	t.Logf("%v with the OSD down: %d of %d tuples, then %v, %v after the fault", q, len(got), len(want), err, took.Round(time.Millisecond))
	if errors.Is(err, io.EOF) {
		t.Errorf("the stream ended OK with the OSD down (%d of %d tuples); want a non-OK status", len(got), len(want))
	}
	if r.mode == "exact" {
		if diff := harness.DiffSpans(want[:min(len(got), len(want))], got); diff != "" {
			t.Errorf("the tuples received are not a prefix of the answer: %s", diff)
		}
	} else if len(got) > 0 {
		// Precise mode may fall back to whole objects (more, never less):
		// what arrived must cover the answer up to its last tuple.
		if miss := harness.Uncovered(harness.ClipSpans(want, 0, harness.SpanEnd(got[len(got)-1])), harness.MergeSpans(got)); len(miss) > 0 {
			t.Errorf("the tuples received miss %d changed bytes before their end", harness.TotalBytes(miss))
		}
	}
	if len(got) >= len(want) && r.mode == "exact" {
		t.Errorf("all %d tuples arrived before the fault: the test proves nothing; make the volume bigger", len(got))
	}
	if took > relBound(relOpTimeout) {
		t.Errorf("the stream took %v to end after the fault, want about the op timeout of %v", took.Round(time.Millisecond), relOpTimeout)
	}

	if errors.Is(err, io.EOF) {
		// Never less than changed, at least?
		if miss := harness.Uncovered(want, harness.MergeSpans(got)); len(miss) > 0 {
			t.Errorf("the OK stream with the OSD down misses %d changed bytes", harness.TotalBytes(miss))
		}
		t.Logf("OK with the OSD down: %d tuples covering %d bytes, for %d changed bytes", len(got), harness.TotalBytes(got), harness.TotalBytes(want))
	}
}

// answersAgain checks that the same server, its cached connection,
// answers as before the fault once the OSD is back (asking again every
// second for 30 s), and is still running.
func (r *osdFault) answersAgain(t *testing.T) {
	// The same server, its cached connection, must answer again once the
	// OSD is back: librados learns from the monitor that the OSD is up
	// again (marked down and booted again, or restarted).
	t1 := time.Now()
	for attempt := 1; ; attempt++ {
		if !r.attempt(t, attempt) {
			break
		}
		if time.Since(t1) > 30*time.Second {
			// Is it the cached connection? Another user makes a new one.
			q := r.qs[1]
			q.Secrets = map[string]string{"userID": harness.ClusterEnv(t, "CEPH_USER"), "userKey": harness.ClusterEnv(t, "CEPH_KEY")}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			m := r.srv.Call(ctx, q)
			cancel()
			t.Fatalf("the server still fails 30 s after the OSD came back; through a new connection (user admin): %d tuples, %v\n%s",
				len(m.Tuples()), m.Err, harness.ClusterState(t))
		}
		time.Sleep(time.Second)
	}
	t.Logf("the server answers as before the fault %v after the OSD came back", time.Since(t1).Round(time.Millisecond))
	if !r.srv.Running() {
		t.Fatalf("the server exited")
	}
}

// attempt asks the server for both answers once; it reports whether a
// request failed (an answer that differs is an error of the test).
func (r *osdFault) attempt(t *testing.T, attempt int) (failed bool) {
	for i, q := range r.qs {
		q.Secrets = harness.CSISecrets(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		m := r.srv.Call(ctx, q)
		cancel()
		switch {
		case m.Err != nil:
			failed = true
			t.Logf("attempt %d, %v after the OSD came back: %v", attempt, q, m.Err)
		default:
			if diff := harness.DiffSpans(r.want[i], m.Tuples()); diff != "" {
				t.Errorf("%v after the OSD came back: %s", q, diff)
			}
		}
	}
	return failed
}

// relMonitors: a cluster ID whose monitor address has no listener, and the
// monitor hung (SIGSTOP) while a new connection is made, must both give
// UNAVAILABLE within about the connect timeout, while requests to the
// cluster go on being served; once the monitor is back, a new connection
// works and answers as before.
func relMonitors(t *testing.T, v harness.RbdVolume) {
	config := relConfig(t, map[string][]string{
		"rsm-rel-down": {harness.FreeTCPAddr(t)},
		// The live monitor under another cluster ID: its own connections.
		"rsm-rel-hung": {harness.ClusterEnv(t, "CEPH_MON_V1")},
	})
	srv := harness.StartServer(t, "--ceph-connect-timeout="+relConnectTimeout.String(), "--ceph-op-timeout="+relOpTimeout.String(),
		"--clusterconfig", config)
	q := harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2")}
	want := srv.Get(t, q).Tuples()
	bound := relBound(relConnectTimeout)

	call := func(r harness.MetaReq) (harness.MetaStream, time.Duration) {
		if r.Secrets == nil {
			r.Secrets = harness.CSISecrets(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
		defer cancel()
		t0 := time.Now()
		m := srv.Call(ctx, r)
		return m, time.Since(t0)
	}
	type res struct {
		m harness.MetaStream
		d time.Duration
	}
	down := make(chan res, 1)
	go func() {
		m, d := call(harness.MetaReq{Target: "rsm-rel-down/rbd/" + v.Name + "@s2"})
		down <- res{m, d}
	}()
	// Served meanwhile, through the cached connection.
	if m, _ := call(q); m.Err != nil || harness.DiffSpans(want, m.Tuples()) != "" {
		t.Errorf("%v while another request waits for unreachable monitors: %v", q, m.Err)
	}
	r := <-down
	t.Logf("no monitor listening: %v after %v", r.m.Err, r.d.Round(time.Millisecond))
	if status.Code(r.m.Err) != codes.Unavailable || r.d > bound {
		t.Errorf("no monitor listening: %v after %v; want UNAVAILABLE within about %v", r.m.Err, r.d.Round(time.Millisecond), relConnectTimeout)
	}

	// The monitor hung: the server needs a new connection for the admin
	// user (none is cached), and cannot get a session.
	adminQ := harness.MetaReq{Base: "rsm-rel-hung/rbd/" + v.Name + "@s1", Target: "rsm-rel-hung/rbd/" + v.Name + "@s2",
		Secrets: map[string]string{"userID": harness.ClusterEnv(t, "CEPH_USER"), "userKey": harness.ClusterEnv(t, "CEPH_KEY")}}
	resume := harness.PauseDaemon(t, "mon.a")
	m, d := call(adminQ)
	// The cached connection of the other user still reaches the OSD.
	cached, cd := call(q)
	resume()
	t.Logf("monitor hung: a new connection: %v after %v; the cached one: %d tuples, %v after %v",
		m.Err, d.Round(time.Millisecond), len(cached.Tuples()), cached.Err, cd.Round(time.Millisecond))
	if status.Code(m.Err) != codes.Unavailable || d > bound {
		t.Errorf("monitor hung (SIGSTOP): %v after %v; want UNAVAILABLE within about %v (a hung monitor is not a wrong key)",
			m.Err, d.Round(time.Millisecond), relConnectTimeout)
	}
	if cached.Err == nil && harness.DiffSpans(want, cached.Tuples()) != "" {
		t.Errorf("%v through the cached connection while the monitor hung: OK, but wrong: %s", q, harness.DiffSpans(want, cached.Tuples()))
	}

	// The monitor is back: a new connection works.
	deadline := time.Now().Add(time.Minute)
	for {
		m, _ := call(adminQ)
		if m.Err == nil {
			if diff := harness.DiffSpans(want, m.Tuples()); diff != "" {
				t.Errorf("%v after the monitor came back: %s", adminQ, diff)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v a minute after the monitor came back: %v", adminQ, m.Err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if m, _ := call(q); m.Err != nil || harness.DiffSpans(want, m.Tuples()) != "" {
		t.Errorf("%v after the monitor came back: %v", q, m.Err)
	}
}

// relServerKilled kills the server (SIGKILL) in the middle of a stream
// that the client library reads, and starts a new one on the same socket
// (the killed one left its socket file: the new one must replace it). The
// client must resume and hand over exactly the tuples of a stream that
// was never interrupted; both block types.
func relServerKilled(t *testing.T, v harness.RbdVolume) {
	for _, bt := range []struct {
		name  string
		flags []string
	}{
		{"VARIABLE_LENGTH", nil},
		{"FIXED_LENGTH", []string{"--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"}},
	} {
		for _, q := range []harness.MetaReq{{Target: v.ID("s2")}, {Base: v.ID("s1"), Target: v.ID("s2")}} {
			name := fmt.Sprintf("%s/%s", bt.name, map[bool]string{true: "allocated", false: "delta"}[q.Base == ""])
			t.Run(name, func(t *testing.T) {
				ref := harness.StartServer(t, bt.flags...)
				want := ref.Get(t, q).Tuples()

				sock := harness.ShortSocket(t)
				logPath := filepath.Join(t.TempDir(), "server.log")
				p := harness.StartProc(t, sock, logPath, bt.flags...)
				cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Fatal(err)
				}
				defer cc.Close()
				c := client.New(cc)
				c.MaxRetries = 100 // at 200 ms: about 20 s for the new server to come up
				c.NewBackOff = func() backoff.BackOff { return backoff.NewConstantBackOff(200 * time.Millisecond) }

				var (
					got    []harness.Span
					pages  int
					killed = -1
					typ    csi.BlockMetadataType
				)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard
				defer cancel()
				prog, err := c.Stream(ctx, client.Request{Base: q.Base, Target: q.Target, MaxResults: 4, Secrets: harness.CSISecrets(t)},
					func(pg client.Page) error {
						typ = pg.Type
						got = append(got, pg.Extents...)
						pages++
						if pages == 3 {
							killed = len(got)
							p.Kill(t)
							p = harness.StartProc(t, sock, logPath, bt.flags...)
						}
						return nil
					})
				if err != nil {
					t.Fatalf("Stream across a killed server: %v (progress %+v)", err, prog)
				}
				if typ != ref.BlockType() {
					t.Errorf("type %v, want %v", typ, ref.BlockType())
				}
				if diff := harness.DiffSpans(want, got); diff != "" {
					t.Errorf("across a killed server: %s", diff)
				}
				if prog.Retries == 0 {
					t.Errorf("the client never resumed (progress %+v): the server had sent everything before it was killed", prog)
				}
				t.Logf("killed after %d of %d tuples; the client resumed %d times and got all %d", killed, len(want), prog.Retries, len(got))
			})
		}
	}
}
