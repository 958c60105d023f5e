package driver

import (
	"fmt"

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
type sender struct {
	pages  chan []*csi.BlockMetadata
	failed chan struct{} // closed when err is set
	done   chan struct{} // closed when the goroutine has returned
	err    error
}

func startSender(send func([]*csi.BlockMetadata) error) *sender {
	s := &sender{
		pages:  make(chan []*csi.BlockMetadata, 1),
		failed: make(chan struct{}),
		done:   make(chan struct{}),
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

// put queues a page; it blocks while two pages are in flight.
func (s *sender) put(page []*csi.BlockMetadata) error {
	select {
	case <-s.failed:
		return s.err
	default:
	}
	select {
	case s.pages <- page:
		return nil
	case <-s.failed:
		return s.err
	}
}

// wait sends what is queued and returns the first error of a send. It
// must be called once; the goroutine is gone when it returns.
func (s *sender) wait() error {
	close(s.pages)
	<-s.done
	return s.err
}
