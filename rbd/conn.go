package rbd

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"github.com/ceph/go-ceph/rados"
)

// connParams is what a connection is made from.
type connParams struct {
	monHost string   // librados mon_host
	dial    []string // the monitors' TCP addresses, for diagnosis
	user    string   // cephx user without "client."
	key     string   // cephx key; never in an error or a log
}

// connKey identifies a cached connection. It holds a hash of the key, so
// that the cache holds the key itself only inside librados.
type connKey struct {
	monHost string
	user    string
	keySum  [sha256.Size]byte
}

func (p connParams) cacheKey() connKey {
	return connKey{monHost: p.monHost, user: p.user, keySum: sha256.Sum256([]byte(p.key))}
}

// cachedConn is one cluster connection, shared by every Diff that uses the
// same monitors and credentials.
type cachedConn struct {
	key   connKey
	ready chan struct{} // closed when the connect attempt has returned

	// Set before ready is closed, then never changed.
	conn *rados.Conn // nil when the connect failed
	err  error

	// Guarded by connCache.mu.
	refs      int       // Opens waiting for it plus open Diffs
	idleSince time.Time // when refs last dropped to 0
	born      time.Time // when it connected
}

// maxConnecting bounds the connect attempts in flight. Each is a librados
// handle with its threads (messenger, timers) for up to
// client_mount_timeout; eight serve a cold start of many users quickly.
const maxConnecting = 8

// errCacheClosed is returned by get after close.
var errCacheClosed = errors.New("rbd source is closed")

// connCache shares cluster connections between Diffs. Connections are
// reference-counted: get takes a reference, release drops it. A connection
// that nobody has used for the idle time is shut down by a janitor
// goroutine, and close shuts down every connection once it is released.
//
// No get returns a connection older than maxAge, however busy it is: a
// cephx key that was revoked or replaced keeps working on a live session,
// so a connection that lived forever would keep serving requests that carry
// the old key. Streams that hold an older connection keep it until they end.
//
// Concurrent gets of the same key share one connect attempt (singleflight):
// it runs in its own goroutine, so that a get can return when its context
// is done while the attempt goes on. A connection made for nobody stays
// cached, idle. A failed attempt is forgotten: the next get tries again.
//
// Invariant: a cachedConn is in conns while it connects or is usable. Who
// removes a connected one with refs == 0 shuts it down; when it leaves with
// refs > 0 (on close), the last release shuts it down.
type connCache struct {
	connect  func(connParams) (*rados.Conn, error)
	shutdown func(*rados.Conn) // (*rados.Conn).Shutdown; tests count calls
	idle     time.Duration
	maxAge   time.Duration

	// dialing holds a token per connect attempt in flight: at most
	// maxConnecting at once, so that a burst of requests with distinct
	// (bad) credentials cannot pile up librados handles and their
	// threads. A get waits for a token as long as its context lets it.
	dialing chan struct{}

	mu     sync.Mutex
	conns  map[connKey]*cachedConn
	closed bool

	stop chan struct{}  // closed by close, stops the janitor
	wg   sync.WaitGroup // the janitor and connect goroutines
}

// newConnCache starts a cache and its janitor; close stops it.
func newConnCache(connect func(connParams) (*rados.Conn, error), idle, maxAge time.Duration) *connCache {
	c := &connCache{
		connect:  connect,
		shutdown: (*rados.Conn).Shutdown,
		idle:     idle,
		maxAge:   maxAge,
		dialing:  make(chan struct{}, maxConnecting),
		conns:    make(map[connKey]*cachedConn),
		stop:     make(chan struct{}),
	}
	c.wg.Add(1)
	go c.janitor()
	return c
}

// get returns a connected connection for p and takes a reference to it,
// which the caller must release. It returns ctx's error when ctx is done
// before the connection is made.
func (c *connCache) get(ctx context.Context, p connParams) (*cachedConn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	k := p.cacheKey()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errCacheClosed
	}
	cc := c.conns[k]
	var old *rados.Conn // too old and unused: shut down here
	if cc != nil && cc.conn != nil && time.Since(cc.born) >= c.maxAge {
		delete(c.conns, k) // its last release shuts it down
		if cc.refs == 0 {
			old = cc.conn
		}
		cc = nil
	}
	if cc == nil {
		// A new attempt: first a token, waiting without the lock.
		c.mu.Unlock()
		if old != nil {
			c.shutdown(old)
			old = nil
		}
		select {
		case c.dialing <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			<-c.dialing
			return nil, errCacheClosed
		}
		if cc = c.conns[k]; cc != nil {
			<-c.dialing // another get started it meanwhile
		} else {
			cc = &cachedConn{key: k, ready: make(chan struct{})}
			c.conns[k] = cc
			c.wg.Add(1)
			go c.dial(cc, p) // gives the token back
		}
	}
	cc.refs++
	c.mu.Unlock()

	select {
	case <-cc.ready:
	case <-ctx.Done():
		c.release(cc)
		return nil, ctx.Err()
	}
	if cc.err != nil {
		c.release(cc)
		return nil, cc.err
	}
	return cc, nil
}

// dial runs one connect attempt for cc, holding a token of c.dialing.
func (c *connCache) dial(cc *cachedConn, p connParams) {
	defer c.wg.Done()
	conn, err := c.connect(p)
	<-c.dialing

	c.mu.Lock()
	cc.conn, cc.err = conn, err
	cc.idleSince = time.Now()
	cc.born = cc.idleSince
	cached := c.conns[cc.key] == cc
	if err != nil && cached {
		delete(c.conns, cc.key)
	}
	shut := err == nil && !cached && cc.refs == 0 // removed by close meanwhile
	close(cc.ready)
	c.mu.Unlock()

	if shut {
		c.shutdown(conn)
	}
}

// release drops a reference taken by get.
func (c *connCache) release(cc *cachedConn) {
	c.mu.Lock()
	cc.refs--
	if cc.refs > 0 {
		c.mu.Unlock()
		return
	}
	cc.idleSince = time.Now()
	shut := cc.conn != nil && c.conns[cc.key] != cc
	c.mu.Unlock()

	if shut {
		c.shutdown(cc.conn)
	}
}

// discard stops sharing cc: the next get connects anew, and cc is shut
// down at its last release. After an OSD or monitor outage, a connection
// can keep timing out long after a new one would work.
func (c *connCache) discard(cc *cachedConn) {
	c.mu.Lock()
	if c.conns[cc.key] == cc {
		delete(c.conns, cc.key)
	}
	shut := cc.conn != nil && cc.refs == 0
	c.mu.Unlock()
	if shut {
		c.shutdown(cc.conn)
	}
}

// janitor shuts down connections idle for longer than c.idle, and unused
// ones older than c.maxAge.
func (c *connCache) janitor() {
	defer c.wg.Done()
	tick := min(max(min(c.idle, c.maxAge)/4, 10*time.Millisecond), time.Minute)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.reap(now)
		}
	}
}

// reap shuts down the unused connections idle since before now-c.idle or
// born before now-c.maxAge.
func (c *connCache) reap(now time.Time) {
	var shut []*rados.Conn
	c.mu.Lock()
	for k, cc := range c.conns {
		if cc.conn != nil && cc.refs == 0 && (now.Sub(cc.idleSince) >= c.idle || now.Sub(cc.born) >= c.maxAge) {
			delete(c.conns, k)
			shut = append(shut, cc.conn)
		}
	}
	c.mu.Unlock()
	for _, conn := range shut {
		c.shutdown(conn)
	}
}

// close shuts down the idle connections at once, and the others as they are
// released or finish connecting. It waits for the janitor and for connect
// attempts in flight (at most about client_mount_timeout).
func (c *connCache) close() {
	var shut []*rados.Conn
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for k, cc := range c.conns {
		delete(c.conns, k)
		if cc.conn != nil && cc.refs == 0 {
			shut = append(shut, cc.conn)
		}
	}
	close(c.stop)
	c.mu.Unlock()

	for _, conn := range shut {
		c.shutdown(conn)
	}
	c.wg.Wait()
}

// Stats counts a Source's cluster connections.
type Stats struct {
	// Conns is the number of cached connections, connected or connecting.
	Conns int
	// Connecting is how many of them are still connecting.
	Connecting int
	// Refs is the number of references to them: open Diffs plus Opens
	// waiting for a connection. It is 0 when everything was closed.
	Refs int
}

func (c *connCache) stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s Stats
	for _, cc := range c.conns {
		s.Conns++
		if cc.conn == nil {
			s.Connecting++
		}
		s.Refs += cc.refs
	}
	return s
}
