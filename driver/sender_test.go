package driver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

func TestSenderOrderAndBackpressure(t *testing.T) {
	release := make(chan struct{})
	var got []int64
	s := startSender(func(page []*csi.BlockMetadata) error {
		<-release
		got = append(got, page[0].ByteOffset)
		return nil
	}, 0)
	page := func(off int64) []*csi.BlockMetadata { return []*csi.BlockMetadata{{ByteOffset: off}} }
	// One page is being sent, one waits: the third put must block.
	for i := range int64(2) {
		if err := s.put(page(i)); err != nil {
			t.Fatal(err)
		}
	}
	third := make(chan error, 1)
	go func() { third <- s.put(page(2)) }()
	select {
	case <-third:
		t.Fatal("a third page was taken while two were in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if err := s.wait(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Errorf("sent %v, want [0 1 2]", got)
	}
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
	const stall = 100 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	s := startSender(func([]*csi.BlockMetadata) error { <-release; return nil }, stall)
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
	if d := time.Since(began); d < stall || d > 10*stall {
		t.Errorf("put gave up after %v, want about %v", d, stall)
	}
	began = time.Now()
	if err := s.wait(); !errors.As(err, &se) || time.Since(began) > stall/2 {
		t.Errorf("wait after the stall: %v after %v, want the stall error at once", err, time.Since(began))
	}

	// Each page takes a fifth of the stall timeout to send: slow, but
	// never a stall (a generous margin for loaded machines).
	const slowStall = 10 * stall
	slow := startSender(func([]*csi.BlockMetadata) error { time.Sleep(slowStall / 5); return nil }, slowStall)
	for i := range 6 {
		if err := slow.put(newPage(1)[:1]); err != nil {
			t.Fatalf("page %d to a slow reader: %v", i, err)
		}
	}
	if err := slow.wait(); err != nil {
		t.Fatalf("wait for a slow reader: %v", err)
	}
}

// TestSenderStallInWait: the last pages are queued, the client stops
// reading; wait gives up after the stall timeout.
func TestSenderStallInWait(t *testing.T) {
	const stall = 100 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	s := startSender(func([]*csi.BlockMetadata) error { <-release; return nil }, stall)
	if err := s.put(newPage(1)[:1]); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var se *stallError
	if err := s.wait(); !errors.As(err, &se) || time.Since(began) < stall {
		t.Errorf("wait: %v after %v, want a stall error after %v", err, time.Since(began), stall)
	}
}
