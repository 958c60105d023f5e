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
	})
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
	s := startSender(func([]*csi.BlockMetadata) error { return gone })
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
	s := startSender(func([]*csi.BlockMetadata) error { panic("bug") })
	_ = s.put(newPage(1)[:1])
	if err := s.wait(); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("wait: %v, want the panic as an error", err)
	}
}
