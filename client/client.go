// Package client reads the allocated or changed blocks of snapshots from
// any CSI SnapshotMetadata server, and resumes broken streams.
//
// # What it guarantees
//
// Stream hands the caller's function every tuple of one logical stream, in
// pages, in strictly ascending order and without overlap, across resumes
// too. When Stream returns nil, the caller has seen every tuple from the
// request's starting offset to the end of the volume: the server ended its
// stream with OK. When it returns an error, the caller has seen a prefix
// of that stream, and Progress tells where it ends, so that a later call
// can go on from there.
//
// # When it retries
//
// A stream that fails with UNAVAILABLE, ABORTED, RESOURCE_EXHAUSTED, or
// with DEADLINE_EXCEEDED or CANCELLED while the caller's own context is
// still live (a broken connection, a restarted server, the sidecar's cap on
// a stream's time), is re-issued from the byte after the last tuple
// received, as the CSI spec allows, after an exponential backoff. The
// backoff starts again after each stream that made progress. Retries end
// when the caller's context ends, or after MaxRetries failures in a row
// without progress. Any other code (INVALID_ARGUMENT, NOT_FOUND,
// OUT_OF_RANGE, FAILED_PRECONDITION, UNAUTHENTICATED, PERMISSION_DENIED,
// INTERNAL, ...) returns at once.
//
// # What a resumed stream may do
//
// A server may start a resumed stream with a tuple that begins before the
// resume point (a FIXED_LENGTH block that holds it, or an extent it did not
// clip). Tuples that end at or before the resume point are dropped; a
// VARIABLE_LENGTH tuple that straddles it is clipped to start there. A
// FIXED_LENGTH tuple cannot be clipped and still be FIXED_LENGTH, so one
// that straddles the resume point, or a change of block type or volume
// capacity between resumes, fails the stream with ErrInconsistent rather
// than hand the caller an overlap or a gap. So does a tuple that is empty,
// negative, ends beyond 2^63-1, lies beyond the volume's capacity (a
// FIXED_LENGTH block may end after it, holding its last byte), or starts
// before the end of the RPC's tuple before it.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrInconsistent means that the server broke the stream's invariants:
// tuples out of order or overlapping, or a resumed stream that does not fit
// the one before.
var ErrInconsistent = errors.New("inconsistent snapshot metadata stream")

// Request names the snapshots and the range to read.
type Request struct {
	// Base is the older snapshot of a delta; empty asks for the allocated
	// blocks of Target.
	Base string
	// Target is the snapshot whose blocks are read.
	Target string
	// StartingOffset is the first byte of interest.
	StartingOffset int64
	// MaxResults caps the tuples of a page; 0 lets the server choose.
	MaxResults int32
	// Secrets are passed to the server with every request.
	Secrets map[string]string
}

// Extent is a byte range of the volume: [Offset, Offset+Length).
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// Page is one message of a stream.
type Page struct {
	Type     csi.BlockMetadataType
	Capacity int64
	Extents  []Extent
}

// Progress describes how far a stream got.
type Progress struct {
	// Next is the byte after the last tuple handed to the caller: where a
	// resumed stream starts.
	Next int64
	// Extents and Bytes count the tuples handed to the caller.
	Extents int64
	Bytes   int64
	// Retries counts the streams re-issued.
	Retries int
}

// Client reads snapshot metadata over a gRPC connection.
type Client struct {
	sm csi.SnapshotMetadataClient
	// MaxRetries caps the failed streams in a row, without progress, that
	// are retried. Default 8.
	MaxRetries int
	// NewBackOff makes the backoff of one Stream call. Default: cenkalti's
	// exponential backoff, 100 ms doubling to 10 s.
	NewBackOff func() backoff.BackOff
}

// New returns a Client that uses conn.
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{sm: csi.NewSnapshotMetadataClient(conn), MaxRetries: 8}
}

func defaultBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	return b
}

// Stream reads all tuples of req and calls fn with each page, resuming
// broken streams as the package comment describes. A page's Extents are
// valid only during the call. An error from fn stops the stream and is
// returned as it is. The Progress returned is valid with any error.
func (c *Client) Stream(ctx context.Context, req Request, fn func(Page) error) (Progress, error) {
	newBackOff := c.NewBackOff
	if newBackOff == nil {
		newBackOff = defaultBackOff
	}
	bo := newBackOff()
	s := &stream{fn: fn, next: req.StartingOffset}
	s.p.Next = req.StartingOffset
	failures := 0
	for {
		before := s.p.Extents
		err := c.once(ctx, req, s)
		if err == nil {
			return s.p, nil
		}
		if s.callerErr || !retryable(ctx, err) {
			return s.p, err
		}
		if s.p.Extents > before {
			bo.Reset()
			failures = 0
		}
		failures++
		if failures > c.MaxRetries {
			return s.p, fmt.Errorf("giving up after %d failed attempts: %w", failures, err)
		}
		wait := bo.NextBackOff()
		if wait == backoff.Stop {
			return s.p, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return s.p, fmt.Errorf("%w (last stream error: %v)", ctx.Err(), err)
		case <-t.C:
		}
		s.p.Retries++
	}
}

// stream is the state of one logical stream across resumes.
type stream struct {
	fn        func(Page) error
	p         Progress
	next      int64
	started   bool
	typ       csi.BlockMetadataType
	capacity  int64
	callerErr bool
	// rpcTuples is set once the current RPC has sent a tuple, which ends
	// at rpcEnd: the RPC's next tuple must not start before.
	rpcTuples bool
	rpcEnd    int64
	buf       []Extent
}

// once runs one RPC from s.next and hands its pages to the caller.
func (c *Client) once(ctx context.Context, req Request, s *stream) error {
	s.rpcTuples = false
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var recv func() (response, error)
	if req.Base == "" {
		st, err := c.sm.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{
			SnapshotId: req.Target, StartingOffset: s.next, MaxResults: req.MaxResults, Secrets: req.Secrets})
		if err != nil {
			return err
		}
		recv = func() (response, error) { return st.Recv() }
	} else {
		st, err := c.sm.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{
			BaseSnapshotId: req.Base, TargetSnapshotId: req.Target, StartingOffset: s.next, MaxResults: req.MaxResults, Secrets: req.Secrets})
		if err != nil {
			return err
		}
		recv = func() (response, error) { return st.Recv() }
	}
	for {
		m, err := recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.page(m); err != nil {
			return err
		}
	}
}

// response is what both RPCs' messages have in common.
type response interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}

// page checks one message against the stream so far, drops or clips what
// a resumed stream repeats, and hands the rest to the caller.
func (s *stream) page(m response) error {
	typ, capacity := m.GetBlockMetadataType(), m.GetVolumeCapacityBytes()
	if !s.started {
		s.started, s.typ, s.capacity = true, typ, capacity
	} else if typ != s.typ || capacity != s.capacity {
		return fmt.Errorf("%w: type %v and capacity %d changed to %v and %d", ErrInconsistent, s.typ, s.capacity, typ, capacity)
	}
	s.buf = s.buf[:0]
	for _, b := range m.GetBlockMetadata() {
		e := Extent{b.GetByteOffset(), b.GetSizeBytes()}
		switch {
		case e.Length <= 0 || e.Offset < 0:
			return fmt.Errorf("%w: tuple %+v is empty or negative", ErrInconsistent, e)
		case e.Offset > math.MaxInt64-e.Length:
			return fmt.Errorf("%w: tuple %+v ends beyond 2^63-1", ErrInconsistent, e)
		case e.Offset >= capacity || (typ != csi.BlockMetadataType_FIXED_LENGTH && e.Offset+e.Length > capacity):
			// A FIXED_LENGTH block may hold the volume's last byte and
			// end after it; no tuple may start beyond.
			return fmt.Errorf("%w: tuple %+v lies beyond the volume's capacity %d", ErrInconsistent, e, capacity)
		case s.rpcTuples && e.Offset < s.rpcEnd:
			// Within one RPC, tuples must not go back, not even among
			// those a resumed stream repeats.
			return fmt.Errorf("%w: tuple %+v starts before the end %d of the one before", ErrInconsistent, e, s.rpcEnd)
		}
		s.rpcTuples, s.rpcEnd = true, e.Offset+e.Length
		end := e.Offset + e.Length
		if e.Offset < s.next {
			switch {
			case end <= s.next:
				continue // a resumed stream repeats what was received
			case typ == csi.BlockMetadataType_VARIABLE_LENGTH:
				e = Extent{s.next, end - s.next}
			case s.p.Extents > 0:
				return fmt.Errorf("%w: FIXED_LENGTH tuple %+v straddles the resume point %d", ErrInconsistent, e, s.next)
			}
		}
		s.buf = append(s.buf, e)
		s.next = end
	}
	if len(s.buf) == 0 {
		return nil
	}
	if err := s.fn(Page{Type: typ, Capacity: capacity, Extents: s.buf}); err != nil {
		s.callerErr = true
		return err
	}
	for _, e := range s.buf {
		s.p.Extents++
		s.p.Bytes += e.Length
	}
	s.p.Next = s.next
	return nil
}

// retryable tells whether a failed stream may be re-issued.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}
