package driver

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// The sender's timed tests run in a synctest bubble: the sender's
// goroutine, channels and stall timers are the bubble's, time there is a
// fake clock that moves only when every goroutine of the bubble is blocked,
// and synctest.Wait returns once they all are. What these tests assert
// about time is exact, and no load on the machine can change it.

// stuckClient is a send that blocks until free is called (at most once
// matters; free may be called again).
func stuckClient() (send func([]*csi.BlockMetadata) error, free func()) {
	release := make(chan struct{})
	var once sync.Once
	return func([]*csi.BlockMetadata) error { <-release; return nil }, func() { once.Do(func() { close(release) }) }
}

// waitOnce calls s.wait at most once, so that endSender can call it
// again on the way out.
func waitOnce(s *sender) func() error {
	var once sync.Once
	var err error
	return func() error { once.Do(func() { err = s.wait() }); return err }
}

// endSender is deferred by the tests below: it frees the client (unless
// free is nil), calls wait unless the test did, and waits for the
// sender's goroutine to return. A goroutine of the bubble still running
// when a failed test leaves it makes synctest panic, burying the failure.
func endSender(s *sender, wait func() error, free func()) {
	if free != nil {
		free()
	}
	_ = wait()
	<-s.done
}

func TestSenderOrderAndBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		var got []int64
		s := startSender(func(page []*csi.BlockMetadata) error {
			<-release
			got = append(got, page[0].ByteOffset)
			return nil
		}, 0)
		wait := waitOnce(s)
		defer endSender(s, wait, free)
		page := func(off int64) []*csi.BlockMetadata { return []*csi.BlockMetadata{{ByteOffset: off}} }
		// One page is being sent, one waits: the third put must block.
		for i := range int64(2) {
			if err := s.put(page(i)); err != nil {
				t.Fatal(err)
			}
		}
		third := make(chan error, 1)
		go func() { third <- s.put(page(2)) }()
		// Returns once every other goroutine of the bubble is blocked:
		// the sender in the send, the third put wherever it waits.
		synctest.Wait()
		select {
		case <-third:
			t.Fatal("a third page was taken while two were in flight")
		default:
		}
		free()
		if err := <-third; err != nil {
			t.Fatal(err)
		}
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
			t.Errorf("sent %v, want [0 1 2]", got)
		}
	})
}

func TestSenderFailureStopsPuts(t *testing.T) {
	gone := errors.New("client gone")
	s := startSender(func([]*csi.BlockMetadata) error { return gone }, 0)
	var err error
	for i := 0; i < 10 && err == nil; i++ {
		err = s.put(newPage(1)[:1])
	}
	if !errors.Is(err, gone) {
		t.Fatalf("put after a failed send: %v, want the send's error", err)
	}
	if err := s.wait(); !errors.Is(err, gone) {
		t.Errorf("wait: %v", err)
	}
}

func TestSenderPanicIsAnError(t *testing.T) {
	s := startSender(func([]*csi.BlockMetadata) error { panic("bug") }, 0)
	_ = s.put(newPage(1)[:1])
	if err := s.wait(); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("wait: %v, want the panic as an error", err)
	}
}

// TestSenderStall plays a client that stops reading: once both places are
// taken, put gives up after the stall timeout, and wait then returns at
// once; a client that keeps reading, however slowly, is never cut off.
func TestSenderStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stall = 100 * time.Millisecond
		send, free := stuckClient()
		s := startSender(send, stall)
		wait := waitOnce(s)
		defer endSender(s, wait, free)
		for range 2 {
			if err := s.put(newPage(1)[:1]); err != nil {
				t.Fatal(err)
			}
		}
		began := time.Now()
		err := s.put(newPage(1)[:1])
		var se *stallError
		if !errors.As(err, &se) {
			t.Fatalf("put to a stalled client: %v, want a stall error", err)
		}
		if d := time.Since(began); d != stall {
			t.Errorf("put gave up after %v, want %v", d, stall)
		}
		began = time.Now()
		if err := wait(); !errors.As(err, &se) || time.Since(began) != 0 {
			t.Errorf("wait after the stall: %v after %v, want the stall error at once", err, time.Since(began))
		}

		// Each page takes a fifth of the stall timeout to send: slow, but
		// never a stall, though the stream outlasts the timeout twice.
		const pages = 10
		slow := startSender(func([]*csi.BlockMetadata) error { time.Sleep(stall / 5); return nil }, stall)
		slowWait := waitOnce(slow)
		defer endSender(slow, slowWait, nil)
		began = time.Now()
		for i := range pages {
			if err := slow.put(newPage(1)[:1]); err != nil {
				t.Fatalf("page %d to a slow reader: %v", i, err)
			}
		}
		if err := slowWait(); err != nil {
			t.Fatalf("wait for a slow reader: %v", err)
		}
		if d, want := time.Since(began), pages*stall/5; d != want {
			t.Errorf("the slow stream took %v, want %v (beyond the stall timeout)", d, want)
		}
	})
}

// TestSenderStallInWait: the last pages are queued, the client stops
// reading; wait gives up after the stall timeout.
func TestSenderStallInWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stall = 100 * time.Millisecond
		send, free := stuckClient()
		s := startSender(send, stall)
		wait := waitOnce(s)
		defer endSender(s, wait, free)
		if err := s.put(newPage(1)[:1]); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		var se *stallError
		if err := wait(); !errors.As(err, &se) || time.Since(began) != stall {
			t.Errorf("wait: %v after %v, want a stall error after %v", err, time.Since(began), stall)
		}
	})
}
