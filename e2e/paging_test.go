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
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// pagingVolume builds a 64 MiB volume whose Allocated(s2) and Delta(s1,
// s2) have a few dozen tuples of varied sizes, some unaligned, some
// adjacent: objects 0 and 1 exist at s1 with their full size, so their
// delta is exact (each write), and each of objects 2 to 15 gets one small
// write after s1, which librbd reports from the object's start.
func pagingVolume(t testing.TB, conn *rados.Conn) harness.RbdVolume {
	t.Helper()
	v, img := harness.CreateVolume(t, conn, "", "paging", 64*harness.MiB, harness.ImageFeatures)
	for o := uint64(0); o < 2; o++ {
		harness.FillAt(t, img, o*harness.ObjSize+harness.ObjSize-4*harness.KiB, 4*harness.KiB)
	}
	harness.Snapshot(t, img, "s1")
	for o := uint64(0); o < 2; o++ {
		base := o * harness.ObjSize
		for j := uint64(0); j < 10; j++ {
			off := base + j*300*harness.KiB + o*1000
			harness.FillAt(t, img, off, 4*harness.KiB+j*1000)
			if j%3 == 0 {
				harness.FillAt(t, img, off+4*harness.KiB+j*1000, 100) // adjacent: merged
			}
		}
		harness.FillAt(t, img, base+3*harness.MiB-2*harness.KiB, 8*harness.KiB) // across a 64 KiB boundary
	}
	for o := uint64(2); o < 16; o++ {
		harness.FillAt(t, img, o*harness.ObjSize+o*64*harness.KiB+1000, 3000)
	}
	harness.Snapshot(t, img, "s2")
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
	conn := harness.ConnectAdmin(t)
	v := pagingVolume(t, conn)
	variable := harness.StartServer(t)
	fixed := harness.StartServer(t, "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536")

	for _, q := range []harness.MetaReq{{Target: v.ID("s2")}, {Base: v.ID("s1"), Target: v.ID("s2")}} {
		full := variable.Get(t, q)
		capacity := full.Capacity()
		tuples := full.Tuples()
		if len(tuples) < 10 {
			t.Fatalf("%v: only %d tuples; the test needs more", q, len(tuples))
		}
		k := len(tuples) / 2
		mid := tuples[k]
		var gap int64 = -1
		for i := 1; i < len(tuples); i++ {
			if tuples[i].Offset > harness.SpanEnd(tuples[i-1])+1 {
				gap = harness.SpanEnd(tuples[i-1]) + 1
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
			{"last byte of a tuple", harness.SpanEnd(mid) - 1},
			{"in a gap", gap},
			{"last tuple", tuples[len(tuples)-1].Offset + 1},
			{"capacity-1", capacity - 1},
			{"capacity (empty)", capacity},
		}
		for _, srv := range []*harness.Server{variable, fixed} {
			name := fmt.Sprintf("%s/%v", map[bool]string{true: "allocated", false: "delta"}[q.Base == ""], srv.BlockType())
			t.Run(name, func(t *testing.T) {
				full := srv.Get(t, q).Tuples()
				if srv == fixed {
					if diff := harness.DiffSpans(harness.RoundOut(tuples, srv.FixedSize()), full); diff != "" {
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
					want := harness.ClipSpans(tuples, o.off, capacity)
					if srv == fixed {
						want = harness.RoundOut(want, srv.FixedSize())
					}
					for _, max := range []int32{0, 1, 3, math.MaxInt32} {
						r := q
						r.Start, r.Max = o.off, max
						m := srv.Get(t, r)
						if diff := harness.DiffSpans(want, m.Tuples()); diff != "" {
							t.Errorf("%v (%s): %s", r, o.name, diff)
						}
						if len(m.Pages) > 0 && m.Capacity() != capacity {
							t.Errorf("%v: capacity %d, want %d", r, m.Capacity(), capacity)
						}
					}
				}

				for _, off := range []int64{capacity + 1, capacity + 4096, math.MaxInt64, -1, -4096, math.MinInt64} {
					r := q
					r.Start, r.Secrets = off, harness.CSISecrets(t)
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					m := srv.Call(ctx, r)
					cancel()
					if status.Code(m.Err) != codes.OutOfRange || len(m.Pages) > 0 {
						t.Errorf("%v: %d pages, %v; want no page and OUT_OF_RANGE", r, len(m.Pages), m.Err)
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
	conn := harness.ConnectAdmin(t)
	v := pagingVolume(t, conn)
	for _, srv := range []*harness.Server{
		harness.StartServer(t),
		harness.StartServer(t, "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"),
	} {
		for _, q := range []harness.MetaReq{{Target: v.ID("s2")}, {Base: v.ID("s1"), Target: v.ID("s2")}} {
			name := fmt.Sprintf("%s/%v", map[bool]string{true: "allocated", false: "delta"}[q.Base == ""], srv.BlockType())
			t.Run(name, func(t *testing.T) {
				want := srv.Get(t, q).Tuples()
				var got []harness.Span
				calls := 0
				for next := int64(0); ; calls++ {
					if calls > len(want)+1 {
						t.Fatalf("%d calls for %d tuples", calls, len(want))
					}
					r := q
					r.Start, r.Max, r.Secrets = next, 1, harness.CSISecrets(t)
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					recv, err := srv.Open(ctx, r)
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
					p := harness.ToPage(resp)
					if len(p.Tuples) != 1 {
						t.Fatalf("%v: a page of %d tuples", r, len(p.Tuples))
					}
					b := p.Tuples[0]
					if harness.SpanEnd(b) <= next {
						t.Fatalf("%v: first tuple %+v ends at or before starting_offset", r, b)
					}
					if len(got) > 0 && b.Offset < harness.SpanEnd(got[len(got)-1]) {
						t.Fatalf("%v: tuple %+v overlaps the one before, %+v", r, b, got[len(got)-1])
					}
					got = append(got, b)
					next = harness.SpanEnd(b)
				}
				if diff := harness.DiffSpans(want, got); diff != "" {
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
	conn := harness.ConnectAdmin(t)
	v := pagingVolume(t, conn)
	for _, srv := range []*harness.Server{
		harness.StartServer(t),
		harness.StartServer(t, "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"),
	} {
		var breaks atomic.Int32
		cc, err := grpc.NewClient("unix://"+srv.Sock,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStreamInterceptor(breakAfter(2, &breaks)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		c := client.New(cc)
		c.NewBackOff = func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

		for _, q := range []harness.MetaReq{{Target: v.ID("s2")}, {Base: v.ID("s1"), Target: v.ID("s2")}} {
			name := fmt.Sprintf("%s/%v", map[bool]string{true: "allocated", false: "delta"}[q.Base == ""], srv.BlockType())
			t.Run(name, func(t *testing.T) {
				want := srv.Get(t, q).Tuples()
				breaks.Store(0)
				var got []harness.Span
				var typ csi.BlockMetadataType
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				p, err := c.Stream(ctx, client.Request{Base: q.Base, Target: q.Target, MaxResults: 3, Secrets: harness.CSISecrets(t)},
					func(pg client.Page) error {
						typ = pg.Type
						got = append(got, pg.Extents...)
						return nil
					})
				if err != nil {
					t.Fatalf("Stream: %v (progress %+v)", err, p)
				}
				if typ != srv.BlockType() {
					t.Errorf("type %v, want %v", typ, srv.BlockType())
				}
				if diff := harness.DiffSpans(want, got); diff != "" {
					t.Errorf("through broken streams: %s", diff)
				}
				if p.Extents != int64(len(want)) || p.Bytes != harness.TotalBytes(want) || p.Retries == 0 || int32(p.Retries) != breaks.Load() {
					t.Errorf("progress %+v; want %d extents, %d bytes, and as many retries as breaks (%d)", p, len(want), harness.TotalBytes(want), breaks.Load())
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
