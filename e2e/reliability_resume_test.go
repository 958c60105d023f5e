//go:build e2e

package e2e

// A stream survives an OSD outage longer than the op timeout: the server
// resumes it inside the stream (--resume-budget), and the client gets the
// answer of an uninterrupted stream. Every mode runs as a concurrent stream
// during one outage, so that the test costs one outage, not eight.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
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
	srv    *rsmServer
	q      metaReq
	want   []span
	giveUp bool // its server's budget is shorter than the outage

	recv  func() (metaResponse, error)
	got   []span
	err   error
	ended time.Time
}

// TestReliabilityResume stops the OSD for relOutage in the middle of
// concurrent streams: exact and precise, VARIABLE_LENGTH and FIXED_LENGTH,
// Allocated and Delta, pages of 1 and 3 tuples. Each must end OK with the
// tuples of an uninterrupted stream; a server whose budget is shorter than
// the outage must end its stream UNAVAILABLE within its budget plus one op
// timeout and one backoff; every server answers at once after the outage.
func TestReliabilityResume(t *testing.T) {
	if !serverHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	v, _ := manyWrites(t, 16384)
	base := []string{"--ceph-op-timeout=" + relOpTimeout.String(), "--fixed-block-size", "4096"}
	var streams []*resumeStream
	metrics := map[*rsmServer]string{}
	add := func(name string, srv *rsmServer, giveUp bool) {
		qs := []metaReq{{target: v.id("s2"), max: 2}, {base: v.id("s1"), target: v.id("s2"), max: 1}}
		if giveUp {
			qs = qs[1:]
		}
		for _, q := range qs {
			want := srv.get(t, q).tuples()
			q.secrets = csiSecrets(t)
			streams = append(streams, &resumeStream{name: name + "/" + q.String(), srv: srv, q: q, want: want, giveUp: giveUp})
		}
	}
	for _, mode := range []string{"exact", "precise"} {
		for _, typ := range []string{"VARIABLE_LENGTH", "FIXED_LENGTH"} {
			addr := freeTCPAddr(t)
			srv := startServer(t, append(base, "--precision="+mode, "--block-metadata-type", typ, "--metrics-address="+addr)...)
			metrics[srv] = addr
			add(mode+"/"+typ, srv, false)
		}
	}
	short := startServer(t, append(base, "--precision=exact", "--resume-budget="+relShortBudget.String())...)
	add("budget", short, true)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	for _, s := range streams {
		// A connection of its own with a fixed 64 KiB window and small
		// pages: the diff waits in the middle of the image, with Ceph
		// work left, when the fault comes (see relOSDFault).
		cc, err := grpc.NewClient("unix://"+s.srv.sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		if s.recv, err = (&rsmServer{sm: csi.NewSnapshotMetadataClient(cc)}).open(ctx, s.q); err != nil {
			t.Fatal(err)
		}
		resp, err := s.recv()
		if err != nil {
			t.Fatalf("%s: first page: %v", s.name, err)
		}
		s.got = toPage(resp).tuples
	}
	time.Sleep(500 * time.Millisecond)
	resume := pauseDaemon(t, "osd.0")
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := s.recv()
				if err != nil {
					s.err, s.ended = err, time.Now()
					return
				}
				s.got = append(s.got, toPage(resp).tuples...)
			}
		}()
	}
	time.Sleep(relOutage)
	resume()
	back := time.Now()
	wg.Wait()
	t.Logf("OSD stopped for %v; all streams ended %v after it came back", back.Sub(t0).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	for _, s := range streams {
		took := s.ended.Sub(t0).Round(time.Millisecond)
		if s.giveUp {
			bound := relOpTimeout + relShortBudget + relOpTimeout + 10*time.Second
			t.Logf("%s: %d of %d tuples, %v, %v after the fault", s.name, len(s.got), len(s.want), s.err, took)
			if status.Code(s.err) != codes.Unavailable || !strings.Contains(s.err.Error(), "--resume-budget") {
				t.Errorf("%s: %v; want UNAVAILABLE naming --resume-budget", s.name, s.err)
			}
			if took > bound {
				t.Errorf("%s: gave up %v after the fault, want within %v", s.name, took, bound)
			}
			if d := diffSpans(s.want[:min(len(s.got), len(s.want))], s.got); d != "" {
				t.Errorf("%s: not a prefix: %s", s.name, d)
			}
			continue
		}
		t.Logf("%s: %d tuples, %v, ended %v after the fault (%v after the OSD came back)", s.name, len(s.got), s.err, took, s.ended.Sub(back).Round(time.Millisecond))
		if s.ended.Before(back) {
			t.Logf("%s: ended before the OSD came back: its diff had no Ceph work left; it proves nothing", s.name)
		}
		if !errors.Is(s.err, io.EOF) {
			t.Errorf("%s: %v after %d of %d tuples; want OK", s.name, s.err, len(s.got), len(s.want))
		}
		if d := diffSpans(s.want, s.got); d != "" {
			t.Errorf("%s: the resumed stream differs from an uninterrupted one: %s", s.name, d)
		}
	}
	waitClusterIO(t)
	checkResumedServers(t, streams, metrics)
}

// checkResumedServers checks, after the outage, that each server answers at
// once, logged its resumes, and counted them in its metrics.
func checkResumedServers(t *testing.T, streams []*resumeStream, metrics map[*rsmServer]string) {
	seen := map[*rsmServer]bool{}
	for _, s := range streams {
		if seen[s.srv] {
			continue
		}
		seen[s.srv] = true
		t1 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m := s.srv.call(ctx, s.q)
		cancel()
		if m.err != nil || diffSpans(s.want, m.tuples()) != "" {
			t.Errorf("%s after the outage: %d tuples, %v", s.name, len(m.tuples()), m.err)
		}
		log := s.srv.log()
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
		body := scrape(t, addr)
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
