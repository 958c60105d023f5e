package conn

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"github.com/ceph/go-ceph/rados"
)

// Params is what a connection is made from. MonHost and Dial come from
// MonHost; User and Key from the request's secrets.
type Params struct {
	MonHost string   // librados mon_host, the monitors as configured
	Dial    []string // the monitors' TCP addresses, for diagnosis
	User    string   // cephx user without "client."; never in an error
	Key     string   // cephx key; never in an error, a log or the cache's keys
}

// cacheKey identifies a cached connection. It holds a hash of the key, so
// that the cache holds the key itself only inside librados.
type cacheKey struct {
	monHost string
	user    string
	keySum  [sha256.Size]byte
}

func (p Params) cacheKey() cacheKey {
	return cacheKey{monHost: p.MonHost, user: p.User, keySum: sha256.Sum256([]byte(p.Key))}
}

// Conn is one cached cluster connection, shared by every user (rbd's
// Diffs) of the same monitors and credentials. Cache.Get hands out a reference to
// it, which Cache.Release returns.
type Conn struct {
	key   cacheKey
	ready chan struct{} // closed when the connect attempt has returned

	// Set before ready is closed, then never changed.
	conn *rados.Conn // nil when the connect failed
	err  error

	// Guarded by Cache.mu.
	refs      int       // Opens waiting for it plus open Diffs
	idleSince time.Time // when refs last dropped to 0
	born      time.Time // when it connected
}

// maxConnecting bounds the connect attempts in flight. Each is a librados
// handle with its threads (messenger, timers) for up to
// client_mount_timeout; eight serve a cold start of many users quickly.
const maxConnecting = 8

// errClosed is returned by Get after Close.
var errClosed = errors.New("rbd source is closed")

// Cache shares cluster connections between their users (rbd's Diffs). Connections are
// reference-counted: Get takes a reference, Release drops it. A connection
// that nobody has used for the idle time is shut down by a janitor
// goroutine, and Close shuts down every connection once it is released.
//
// No Get returns a connection older than maxAge, however busy it is: a
// cephx key that was revoked or replaced keeps working on a live session,
// so a connection that lived forever would keep serving requests that carry
// the old key. Streams that hold an older connection keep it until they end.
//
// Concurrent Gets of the same key share one connect attempt (singleflight):
// it runs in its own goroutine, so that a Get can return when its context
// is done while the attempt goes on. A connection made for nobody stays
// cached, idle. A failed attempt is forgotten: the next Get tries again.
//
// Invariant: a Conn is in conns while it connects or is usable. Who
// removes a connected one with refs == 0 shuts it down; when it leaves with
// refs > 0 (on Close), the last Release shuts it down.
type Cache struct {
	connect  func(Params) (*rados.Conn, error)
	shutdown func(*rados.Conn) // (*rados.Conn).Shutdown; tests count calls
	idle     time.Duration
	maxAge   time.Duration

	// dialing holds a token per connect attempt in flight: at most
	// maxConnecting at once, so that a burst of requests with distinct
	// (bad) credentials cannot pile up librados handles and their
	// threads. A Get waits for a token as long as its context lets it.
	dialing chan struct{}

	mu     sync.Mutex
	conns  map[cacheKey]*Conn
	closed bool

	stop chan struct{}  // closed by Close, stops the janitor
	wg   sync.WaitGroup // the janitor and connect goroutines
}

// NewCache starts a cache of connections made with the timeouts t, and
// its janitor; Close stops it. idle and maxAge are as Cache says.
func NewCache(t Timeouts, idle, maxAge time.Duration) *Cache {
	return newCache(t.connector(), idle, maxAge)
}

// newCache starts a cache whose connections connect makes.
func newCache(connect func(Params) (*rados.Conn, error), idle, maxAge time.Duration) *Cache {
	c := &Cache{
		connect:  connect,
		shutdown: (*rados.Conn).Shutdown,
		idle:     idle,
		maxAge:   maxAge,
		dialing:  make(chan struct{}, maxConnecting),
		conns:    make(map[cacheKey]*Conn),
		stop:     make(chan struct{}),
	}
	c.wg.Add(1)
	go c.janitor()
	return c
}

// Get returns a connected connection for p and takes a reference to it,
// which the caller must Release. It returns ctx's error when ctx is done
// before the connection is made.
func (c *Cache) Get(ctx context.Context, p Params) (*Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	k := p.cacheKey()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed
	}
	cc := c.conns[k]
	var old *rados.Conn // too old and unused: shut down below
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
			return nil, errClosed
		}
		if cc = c.conns[k]; cc != nil {
			<-c.dialing // another Get started it meanwhile
		} else {
			cc = &Conn{key: k, ready: make(chan struct{})}
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
		c.Release(cc)
		return nil, ctx.Err()
	}
	if cc.err != nil {
		c.Release(cc)
		return nil, cc.err
	}
	return cc, nil
}

// dial runs one connect attempt for cc, holding a token of c.dialing.
func (c *Cache) dial(cc *Conn, p Params) {
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
	shut := err == nil && !cached && cc.refs == 0 // removed by Close meanwhile
	close(cc.ready)
	c.mu.Unlock()

	if shut {
		c.shutdown(conn)
	}
}

// Release drops a reference taken by Get.
func (c *Cache) Release(cc *Conn) {
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

// Rados returns the librados connection. It is valid until cc's last
// reference is released.
func (cc *Conn) Rados() *rados.Conn { return cc.conn }

// Discard stops sharing cc: the next Get connects anew, and cc is shut
// down at its last Release. After an OSD or monitor outage, a connection
// can keep timing out long after a new one would work.
func (c *Cache) Discard(cc *Conn) {
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
func (c *Cache) janitor() {
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
func (c *Cache) reap(now time.Time) {
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

// Close shuts down the idle connections at once, and the others as they are
// released or finish connecting. It waits for the janitor and for connect
// attempts in flight (at most about client_mount_timeout).
func (c *Cache) Close() {
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

// Stats counts a Cache's connections.
type Stats struct {
	// Conns is the number of cached connections, connected or connecting.
	Conns int
	// Connecting is how many of them are still connecting.
	Connecting int
	// Refs is the number of references to them: open Diffs plus Opens
	// waiting for a connection. It is 0 when everything was closed.
	Refs int
}

// Stats counts the cached connections now.
func (c *Cache) Stats() Stats {
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
