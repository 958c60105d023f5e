package driver

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// A sender sends a stream's pages from a goroutine of its own, so that
// encoding and writing one page overlaps the diff filling the next. It
// holds at most one page waiting besides the one being sent: when both
// places are taken, put blocks, and so does the diff (backpressure). With
// the page the pager fills, a stream holds at most three pages.
//
// Once a send fails (the client went away, the stream was cancelled), put
// returns that error at once, which stops the diff.
//
// A client that takes no page for the stall timeout (it stopped reading,
// or its connection hangs) would hold the diff, its image and its thread
// forever: put and wait then give up with a *stallError, which stops the
// diff. The goroutine may then still be blocked in the send; it returns
// when the handler has returned and gRPC ends the stream.
type sender struct {
	pages  chan []*csi.BlockMetadata
	failed chan struct{} // closed when err is set
	done   chan struct{} // closed when the goroutine has returned
	sent   chan struct{} // a token after each page sent: the client reads
	err    error

	stall   time.Duration // 0: wait for the client forever
	stalled bool          // put or wait gave up; only the diff's side uses it

	// queued counts the pages put and not yet sent; progress is when the
	// client last made progress (a page sent, or a page queued while none
	// was in flight), in UnixNano. pause watches them.
	queued   atomic.Int64
	progress atomic.Int64
}

func startSender(send func([]*csi.BlockMetadata) error, stall time.Duration) *sender {
	s := &sender{
		pages:  make(chan []*csi.BlockMetadata, 1),
		failed: make(chan struct{}),
		done:   make(chan struct{}),
		sent:   make(chan struct{}, 1),
		stall:  stall,
	}
	go s.run(send)
	return s
}

func (s *sender) run(send func([]*csi.BlockMetadata) error) {
	defer close(s.done)
	for page := range s.pages {
		if s.err != nil {
			continue // drain, so that nothing blocks on a failed stream
		}
		if err := safeSend(send, page); err != nil {
			s.err = err
			close(s.failed)
			continue
		}
		s.progress.Store(time.Now().UnixNano())
		s.queued.Add(-1)
		select {
		case s.sent <- struct{}{}:
		default:
		}
	}
}

// safeSend turns a panic of send into an error: this goroutine is not the
// handler's, whose interceptor would recover it.
func safeSend(send func([]*csi.BlockMetadata) error, page []*csi.BlockMetadata) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sending a page panicked: %v", r)
		}
	}()
	return send(page)
}

// put queues a page; it blocks while two pages are in flight, for at most
// the stall timeout without a page sent.
func (s *sender) put(page []*csi.BlockMetadata) error {
	if s.queued.Add(1) == 1 {
		s.progress.Store(time.Now().UnixNano())
	}
	select {
	case <-s.failed:
		return s.err
	case s.pages <- page:
		return nil
	default:
	}
	return s.await(s.pages, page)
}

// await blocks until page is queued (pages non-nil) or, with pages nil,
// until the goroutine is done; it gives up after the stall timeout
// without a page sent.
func (s *sender) await(pages chan []*csi.BlockMetadata, page []*csi.BlockMetadata) error {
	failed := s.failed
	if pages == nil {
		failed = nil // waiting for done, which a failure brings anyway
	}
	var (
		t       *time.Timer
		timeout <-chan time.Time
	)
	if s.stall > 0 {
		t = time.NewTimer(s.stall)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case pages <- page:
			return nil
		case <-failed:
			return s.err
		case <-s.done:
			return s.err
		case <-s.sent:
			if t != nil {
				t.Reset(s.stall)
			}
		case <-timeout:
			s.stalled = true
			return &stallError{s.stall}
		}
	}
}

// pause waits for d, or until ctx is done, while the diff sends nothing
// (a resume's backoff), and watches the client as put does: it returns the
// error of a failed send, ctx's error, or a *stallError when pages are in
// flight and the client has taken none for the stall timeout.
func (s *sender) pause(ctx context.Context, d time.Duration) error {
	wake := time.NewTimer(d)
	defer wake.Stop()
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		var stall <-chan time.Time
		if t != nil {
			t.Stop()
		}
		if s.stall > 0 && s.queued.Load() > 0 {
			left := s.stall - time.Since(time.Unix(0, s.progress.Load()))
			if left <= 0 {
				s.stalled = true
				return &stallError{s.stall}
			}
			t = time.NewTimer(left)
			stall = t.C
		}
		select {
		case <-wake.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-s.failed:
			return s.err
		case <-s.sent:
		case <-stall:
		}
	}
}

// wait sends what is queued and returns the first error of a send. It
// must be called once. Unless the client stalled, the goroutine is gone
// when it returns.
func (s *sender) wait() error {
	close(s.pages)
	if s.stalled {
		return &stallError{s.stall}
	}
	return s.await(nil, nil)
}

// stallError ends a stream whose client took no page for the stall timeout.
type stallError struct{ timeout time.Duration }

func (e *stallError) Error() string { return fmt.Sprintf(msgStalled, e.timeout) }
