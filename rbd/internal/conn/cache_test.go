package conn

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
)

// fakeConnector makes unconnected rados handles and counts connects and
// shutdowns. Each connect waits for gate to be closed (when set).
type fakeConnector struct {
	gate     chan struct{}
	fail     error
	connects atomic.Int32
	shut     atomic.Int32
}

func (f *fakeConnector) connect(Params) (*rados.Conn, error) {
	f.connects.Add(1)
	if f.gate != nil {
		<-f.gate
	}
	if f.fail != nil {
		return nil, f.fail
	}
	return rados.NewConn()
}

func newTestCache(t *testing.T, f *fakeConnector, idle time.Duration) *Cache {
	t.Helper()
	return newTestCacheAged(t, f, idle, time.Hour)
}

func newTestCacheAged(t *testing.T, f *fakeConnector, idle, maxAge time.Duration) *Cache {
	t.Helper()
	c := newCache(f.connect, idle, maxAge)
	c.shutdown = func(*rados.Conn) { f.shut.Add(1) }
	t.Cleanup(c.Close)
	return c
}

var params = Params{MonHost: "v1:127.0.0.1:1", User: "admin", Key: "k"}

func TestConnCacheSingleflight(t *testing.T) {
	f := &fakeConnector{gate: make(chan struct{})}
	c := newTestCache(t, f, time.Hour)

	const n = 8
	got := make([]*Conn, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := c.Get(context.Background(), params)
			if err != nil {
				t.Error(err)
			}
			got[i] = cc
		}()
	}
	for c.Stats().Refs < n {
		time.Sleep(time.Millisecond)
	}
	if s := c.Stats(); s.Conns != 1 || s.Connecting != 1 {
		t.Errorf("stats while connecting = %+v", s)
	}
	close(f.gate)
	wg.Wait()
	if f.connects.Load() != 1 {
		t.Errorf("%d connects; want 1", f.connects.Load())
	}
	for _, cc := range got {
		if cc != got[0] {
			t.Fatal("gets returned different connections")
		}
	}
	other := params
	other.Key = "other"
	cc2, err := c.Get(context.Background(), other)
	if err != nil {
		t.Fatal(err)
	}
	if cc2 == got[0] || f.connects.Load() != 2 {
		t.Error("another key shared the connection")
	}
	c.Release(cc2)
	for _, cc := range got {
		c.Release(cc)
	}
	if s := c.Stats(); s.Conns != 2 || s.Refs != 0 || s.Connecting != 0 {
		t.Errorf("stats after release = %+v", s)
	}
	if f.shut.Load() != 0 {
		t.Error("an idle connection was shut down before its time")
	}
	c.Close()
	if f.shut.Load() != 2 {
		t.Errorf("%d shutdowns after close; want 2", f.shut.Load())
	}
	if _, err := c.Get(context.Background(), params); !errors.Is(err, errClosed) {
		t.Errorf("get after close: %v", err)
	}
}

func TestConnCacheCancelWhileConnecting(t *testing.T) {
	f := &fakeConnector{gate: make(chan struct{})}
	c := newTestCache(t, f, time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := c.Get(ctx, params)
		done <- err
	}()
	for c.Stats().Refs < 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("get: %v; want context.Canceled", err)
	}
	close(f.gate) // the connect finishes for nobody: cached, idle
	for c.Stats().Connecting > 0 {
		time.Sleep(time.Millisecond)
	}
	if s := c.Stats(); s.Conns != 1 || s.Refs != 0 {
		t.Errorf("stats = %+v", s)
	}
	cc, err := c.Get(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	c.Release(cc)
	if f.connects.Load() != 1 {
		t.Errorf("%d connects; want 1", f.connects.Load())
	}
}

func TestConnCacheCloseWhileConnecting(t *testing.T) {
	f := &fakeConnector{gate: make(chan struct{})}
	c := newTestCache(t, f, time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = c.Get(ctx, params)
	}()
	for c.Stats().Refs < 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("close did not wait for the connect in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(f.gate)
	<-closed
	if f.shut.Load() != 1 {
		t.Errorf("%d shutdowns; want 1", f.shut.Load())
	}
}

func TestConnCacheHeldOverClose(t *testing.T) {
	f := &fakeConnector{}
	c := newTestCache(t, f, time.Hour)
	cc, err := c.Get(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if f.shut.Load() != 0 {
		t.Fatal("close shut down a connection in use")
	}
	c.Release(cc)
	if f.shut.Load() != 1 {
		t.Errorf("%d shutdowns after the last release; want 1", f.shut.Load())
	}
}

func TestConnCacheFailure(t *testing.T) {
	boom := errors.New("boom")
	f := &fakeConnector{fail: boom}
	c := newTestCache(t, f, time.Hour)
	for range 2 {
		if _, err := c.Get(context.Background(), params); !errors.Is(err, boom) {
			t.Fatalf("get: %v; want boom", err)
		}
	}
	if f.connects.Load() != 2 {
		t.Errorf("%d connects; a failure must not be cached", f.connects.Load())
	}
	if s := c.Stats(); s != (Stats{}) {
		t.Errorf("stats = %+v", s)
	}
}

func TestConnCacheIdle(t *testing.T) {
	f := &fakeConnector{}
	c := newTestCache(t, f, 30*time.Millisecond)
	cc, err := c.Get(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(80 * time.Millisecond)
	if f.shut.Load() != 0 {
		t.Fatal("a connection in use was reaped")
	}
	c.Release(cc)
	deadline := time.Now().Add(5 * time.Second)
	for f.shut.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s := c.Stats(); f.shut.Load() != 1 || s.Conns != 0 {
		t.Errorf("after idle: %d shutdowns, stats %+v", f.shut.Load(), s)
	}
}

// TestConnCacheDiscard: a discarded connection is no longer shared, the
// next get connects anew, and the old one is shut down at its last release.
func TestConnCacheDiscard(t *testing.T) {
	f := &fakeConnector{}
	c := newTestCache(t, f, time.Hour)
	old, err := c.Get(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	c.Discard(old)
	fresh, err := c.Get(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if fresh == old || f.connects.Load() != 2 {
		t.Fatalf("after discard: same connection %v, %d connects", fresh == old, f.connects.Load())
	}
	c.Release(old)
	if f.shut.Load() != 1 {
		t.Errorf("the discarded connection was not shut down at its last release")
	}
	c.Release(fresh)
	if s := c.Stats(); s.Conns != 1 || s.Refs != 0 || f.shut.Load() != 1 {
		t.Errorf("stats %+v, %d shutdowns; want the fresh one cached", s, f.shut.Load())
	}
}

// TestConnCacheMaxAge: a connection in constant use is still not handed out
// past its maximum age; the stream that holds it keeps it, and it is shut
// down at its last release.
func TestConnCacheMaxAge(t *testing.T) {
	const maxAge = 50 * time.Millisecond
	f := &fakeConnector{}
	c := newTestCacheAged(t, f, time.Hour, maxAge)
	held, err := c.Get(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	// Busy: always at least one reference, never idle. Get looks at held's
	// age some time between before and after: it must hand out held when
	// after is short of maxAge, and a fresh one when before is past it.
	var fresh *Conn
	for fresh == nil {
		before := time.Since(held.born)
		cc, err := c.Get(context.Background(), params)
		if err != nil {
			t.Fatal(err)
		}
		after := time.Since(held.born)
		switch {
		case cc != held && after < maxAge:
			t.Fatal("a second connection before the first one's maximum age")
		case cc == held && before >= maxAge:
			t.Fatalf("past its maximum age (%v): same connection", before)
		case cc != held:
			fresh = cc
		default:
			c.Release(cc)
			time.Sleep(5 * time.Millisecond)
		}
	}
	if f.connects.Load() != 2 {
		t.Fatalf("past its maximum age: %d connects, want 2", f.connects.Load())
	}
	if f.shut.Load() != 0 {
		t.Fatal("a connection still held was shut down")
	}
	c.Release(held)
	if f.shut.Load() != 1 {
		t.Errorf("the old connection was not shut down at its last release")
	}
	c.Release(fresh)
	// Unused and past its age: the janitor shuts it down.
	deadline := time.Now().Add(5 * time.Second)
	for f.shut.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s := c.Stats(); f.shut.Load() != 2 || s.Conns != 0 {
		t.Errorf("an unused connection past its age: %d shutdowns, stats %+v", f.shut.Load(), s)
	}
}

// TestConnCacheBoundsConnects starts connects for many distinct keys, as a
// burst of requests with bad keys does: at most maxConnecting run at once,
// a get waiting for its turn gives up with its context, and the others
// connect as the first finish.
func TestConnCacheBoundsConnects(t *testing.T) {
	f := &fakeConnector{gate: make(chan struct{}), fail: errors.New("bad key")}
	c := newTestCache(t, f, time.Hour)
	const n = 3 * maxConnecting
	errs := make(chan error, n)
	for i := range n {
		p := params
		p.Key = string(rune('a' + i))
		go func() {
			_, err := c.Get(context.Background(), p)
			errs <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.connects.Load() < maxConnecting && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if got := f.connects.Load(); got != maxConnecting {
		t.Fatalf("%d connects in flight, want %d", got, maxConnecting)
	}
	// One more, whose context ends while it waits for a turn.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p := params
	p.Key = "waiting"
	if _, err := c.Get(ctx, p); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("get waiting for a turn: %v, want its context's error", err)
	}
	close(f.gate)
	for range n {
		if err := <-errs; err == nil || err.Error() != "bad key" {
			t.Errorf("get: %v, want the connect's error", err)
		}
	}
	if got := f.connects.Load(); got != n {
		t.Errorf("%d connects, want %d", got, n)
	}
	if s := c.Stats(); s.Conns != 0 || s.Refs != 0 {
		t.Errorf("stats after failed connects: %+v", s)
	}
}
