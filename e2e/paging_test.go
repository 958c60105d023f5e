//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/ceph/go-ceph/rados"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
)

// pagingVolume builds a 64 MiB volume whose Allocated(s2) and Delta(s1,
// s2) have a few dozen tuples of varied sizes, some unaligned, some
// adjacent: objects 0 and 1 exist at s1 with their full size, so their
// delta is exact (each write), and each of objects 2 to 15 gets one small
// write after s1, which librbd reports from the object's start.
func pagingVolume(t testing.TB, conn *rados.Conn) rbdVolume {
	t.Helper()
	v, img := createVolume(t, conn, "", "paging", 64*mib, imageFeatures)
	for o := uint64(0); o < 2; o++ {
		fillAt(t, img, o*objSize+objSize-4*kib, 4*kib)
	}
	snapshot(t, img, "s1")
	for o := uint64(0); o < 2; o++ {
		base := o * objSize
		for j := uint64(0); j < 10; j++ {
			off := base + j*300*kib + o*1000
			fillAt(t, img, off, 4*kib+j*1000)
			if j%3 == 0 {
				fillAt(t, img, off+4*kib+j*1000, 100) // adjacent: merged
			}
		}
		fillAt(t, img, base+3*mib-2*kib, 8*kib) // across a 64 KiB boundary
	}
	for o := uint64(2); o < 16; o++ {
		fillAt(t, img, o*objSize+o*64*kib+1000, 3000)
	}
	snapshot(t, img, "s2")
	return v
}

// TestStartingOffsetAndMaxResults calls both RPCs, VARIABLE_LENGTH and
// FIXED_LENGTH, from many starting offsets and with several max_results,
// checks the spec's invariants on each raw stream, and that each answer is
// the full answer from that offset on: the VARIABLE_LENGTH tuples clipped
// to it, and for FIXED_LENGTH those rounded out to blocks (the blocks that
// hold data at or after the offset). Offsets beyond the capacity and
// negative ones are OUT_OF_RANGE.
func TestStartingOffsetAndMaxResults(t *testing.T) {
	conn := connectAdmin(t)
	v := pagingVolume(t, conn)
	variable := startServer(t)
	fixed := startServer(t, "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536")

	for _, q := range []metaReq{{target: v.id("s2")}, {base: v.id("s1"), target: v.id("s2")}} {
		full := variable.get(t, q)
		capacity := full.capacity()
		tuples := full.tuples()
		if len(tuples) < 10 {
			t.Fatalf("%v: only %d tuples; the test needs more", q, len(tuples))
		}
		k := len(tuples) / 2
		mid := tuples[k]
		var gap int64 = -1
		for i := 1; i < len(tuples); i++ {
			if tuples[i].Offset > spanEnd(tuples[i-1])+1 {
				gap = spanEnd(tuples[i-1]) + 1
				break
			}
		}
		offsets := []struct {
			name string
			off  int64
		}{
			{"zero", 0},
			{"tuple start", mid.Offset},
			{"mid-tuple aligned", mid.Offset + mid.Length/2/4096*4096},
			{"mid-tuple unaligned", mid.Offset + mid.Length/2 | 1},
			{"last byte of a tuple", spanEnd(mid) - 1},
			{"in a gap", gap},
			{"last tuple", tuples[len(tuples)-1].Offset + 1},
			{"capacity-1", capacity - 1},
			{"capacity (empty)", capacity},
		}
		for _, srv := range []*rsmServer{variable, fixed} {
			name := fmt.Sprintf("%s/%v", map[bool]string{true: "allocated", false: "delta"}[q.base == ""], srv.blockType())
			t.Run(name, func(t *testing.T) {
				full := srv.get(t, q).tuples()
				if srv == fixed {
					if diff := diffSpans(roundOut(tuples, srv.fixedSize()), full); diff != "" {
						t.Fatalf("%v: FIXED_LENGTH is not VARIABLE_LENGTH rounded out: %s", q, diff)
					}
				}
				for _, o := range offsets {
					if o.off < 0 {
						t.Fatalf("offset %q not found", o.name)
					}
					// The data from the offset on: FIXED_LENGTH rounds it out
					// to blocks, so its first block may start before the
					// offset, but holds data after it.
					want := clipSpans(tuples, o.off, capacity)
					if srv == fixed {
						want = roundOut(want, srv.fixedSize())
					}
					for _, max := range []int32{0, 1, 3, math.MaxInt32} {
						r := q
						r.start, r.max = o.off, max
						m := srv.get(t, r)
						if diff := diffSpans(want, m.tuples()); diff != "" {
							t.Errorf("%v (%s): %s", r, o.name, diff)
						}
						if len(m.pages) > 0 && m.capacity() != capacity {
							t.Errorf("%v: capacity %d, want %d", r, m.capacity(), capacity)
						}
					}
				}

				for _, off := range []int64{capacity + 1, capacity + 4096, math.MaxInt64, -1, -4096, math.MinInt64} {
					r := q
					r.start, r.secrets = off, csiSecrets(t)
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					m := srv.call(ctx, r)
					cancel()
					if status.Code(m.err) != codes.OutOfRange || len(m.pages) > 0 {
						t.Errorf("%v: %d pages, %v; want no page and OUT_OF_RANGE", r, len(m.pages), m.err)
					}
				}
			})
		}
	}
}

// TestResume resumes streams the way the spec allows: a call with
// max_results=1 takes one tuple, is abandoned, and the next one starts
// at the byte after it. The tuples so collected must be exactly those of
// the uninterrupted stream, for both RPCs and both block types.
func TestResume(t *testing.T) {
	conn := connectAdmin(t)
	v := pagingVolume(t, conn)
	for _, srv := range []*rsmServer{
		startServer(t),
		startServer(t, "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"),
	} {
		for _, q := range []metaReq{{target: v.id("s2")}, {base: v.id("s1"), target: v.id("s2")}} {
			name := fmt.Sprintf("%s/%v", map[bool]string{true: "allocated", false: "delta"}[q.base == ""], srv.blockType())
			t.Run(name, func(t *testing.T) {
				want := srv.get(t, q).tuples()
				var got []span
				calls := 0
				for next := int64(0); ; calls++ {
					if calls > len(want)+1 {
						t.Fatalf("%d calls for %d tuples", calls, len(want))
					}
					r := q
					r.start, r.max, r.secrets = next, 1, csiSecrets(t)
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					recv, err := srv.open(ctx, r)
					if err != nil {
						cancel()
						t.Fatalf("%v: %v", r, err)
					}
					resp, err := recv()
					cancel() // abandon the rest of the stream
					if err != nil {
						if errors.Is(err, io.EOF) {
							break
						}
						t.Fatalf("%v: %v", r, err)
					}
					p := toPage(resp)
					if len(p.tuples) != 1 {
						t.Fatalf("%v: a page of %d tuples", r, len(p.tuples))
					}
					b := p.tuples[0]
					if spanEnd(b) <= next {
						t.Fatalf("%v: first tuple %+v ends at or before starting_offset", r, b)
					}
					if len(got) > 0 && b.Offset < spanEnd(got[len(got)-1]) {
						t.Fatalf("%v: tuple %+v overlaps the one before, %+v", r, b, got[len(got)-1])
					}
					got = append(got, b)
					next = spanEnd(b)
				}
				if diff := diffSpans(want, got); diff != "" {
					t.Errorf("resumed one tuple at a time: %s", diff)
				}
				t.Logf("%d calls, %d tuples", calls+1, len(got))
			})
		}
	}
}

// TestClientResumesBrokenStreams reads both RPCs with the Go client over a
// connection that breaks every stream (UNAVAILABLE, as a lost connection)
// after two messages. The client must resume each time and hand over
// exactly the tuples of an unbroken stream.
func TestClientResumesBrokenStreams(t *testing.T) {
	conn := connectAdmin(t)
	v := pagingVolume(t, conn)
	for _, srv := range []*rsmServer{
		startServer(t),
		startServer(t, "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"),
	} {
		var breaks atomic.Int32
		cc, err := grpc.NewClient("unix://"+srv.sock,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStreamInterceptor(breakAfter(2, &breaks)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		c := client.New(cc)
		c.NewBackOff = func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

		for _, q := range []metaReq{{target: v.id("s2")}, {base: v.id("s1"), target: v.id("s2")}} {
			name := fmt.Sprintf("%s/%v", map[bool]string{true: "allocated", false: "delta"}[q.base == ""], srv.blockType())
			t.Run(name, func(t *testing.T) {
				want := srv.get(t, q).tuples()
				breaks.Store(0)
				var got []span
				var typ csi.BlockMetadataType
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				p, err := c.Stream(ctx, client.Request{Base: q.base, Target: q.target, MaxResults: 3, Secrets: csiSecrets(t)},
					func(pg client.Page) error {
						typ = pg.Type
						got = append(got, pg.Extents...)
						return nil
					})
				if err != nil {
					t.Fatalf("Stream: %v (progress %+v)", err, p)
				}
				if typ != srv.blockType() {
					t.Errorf("type %v, want %v", typ, srv.blockType())
				}
				if diff := diffSpans(want, got); diff != "" {
					t.Errorf("through broken streams: %s", diff)
				}
				if p.Extents != int64(len(want)) || p.Bytes != totalBytes(want) || p.Retries == 0 || int32(p.Retries) != breaks.Load() {
					t.Errorf("progress %+v; want %d extents, %d bytes, and as many retries as breaks (%d)", p, len(want), totalBytes(want), breaks.Load())
				}
				t.Logf("%d tuples through %d broken streams", len(got), breaks.Load())
			})
		}
	}
}

// breakAfter is a stream interceptor that fails every stream with
// UNAVAILABLE after n messages, and cancels it underneath.
func breakAfter(n int, breaks *atomic.Int32) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, cancel := context.WithCancel(ctx)
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			cancel()
			return nil, err
		}
		return &brokenStream{ClientStream: cs, left: n, cancel: cancel, breaks: breaks}, nil
	}
}

type brokenStream struct {
	grpc.ClientStream
	left   int
	cancel context.CancelFunc
	breaks *atomic.Int32
}

func (s *brokenStream) RecvMsg(m any) error {
	if s.left == 0 {
		s.cancel()
		s.breaks.Add(1)
		return status.Error(codes.Unavailable, "e2e: stream broken on purpose")
	}
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.left--
	} else {
		s.cancel()
	}
	return err
}
