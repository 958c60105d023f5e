package rbd

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/ceph/go-ceph/rados"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/conn"
)

// Options configure a Source. Zero values select the defaults.
type Options struct {
	// ConfigPath is Ceph-CSI's cluster config file (config.json of the
	// ceph-csi-config ConfigMap). It is re-read when it changes.
	ConfigPath string
	// MountTimeout is librados' client_mount_timeout: how long a connect
	// may wait for a monitor session. Default 10 s (librados': 300 s).
	MountTimeout time.Duration
	// OpTimeout is librados' rados_mon_op_timeout and rados_osd_op_timeout.
	// Default 30 s.
	OpTimeout time.Duration
	// IdleTimeout is how long an unused cluster connection stays cached.
	// Default 5 min.
	IdleTimeout time.Duration
	// MaxConnAge is how long a cluster connection serves new requests,
	// however busy: the bound on how long a revoked or replaced cephx key
	// keeps working. Default 5 min.
	MaxConnAge time.Duration
	// WholeObject reports changes at RADOS object granularity. With
	// fast-diff, librbd then reads only the object map, which is orders of
	// magnitude faster, but extents are rounded out to whole objects.
	WholeObject bool
	// Precise refines the whole-object diff to the bytes that really
	// changed, with RADOS queries per changed object (see rbd/precise).
	// It overrides WholeObject.
	Precise bool
	// TrustObjectMap makes precise mode take a delta's candidates from the
	// object map's dirty bits (librbd's fast-diff) instead of from object
	// existence at either snapshot. Faster on large images with few
	// changes, but it misses changes after operations that leave clean
	// bits on changed objects: `rbd snap rollback`, and copy-on-read
	// clones (rbd_clone_copy_on_read). See rbd/precise.
	TrustObjectMap bool
	// Walk says how precise mode finds the candidates of an image without
	// a usable object map (no fast-diff, or a map flagged invalid):
	// WalkAuto (the default), WalkList, WalkProbe or WalkLibrbd (see
	// rbd/precise/list.go).
	Walk string
}

// Default option values.
const (
	DefaultMountTimeout = 10 * time.Second
	DefaultOpTimeout    = 30 * time.Second
	DefaultIdleTimeout  = 5 * time.Minute
	DefaultMaxConnAge   = 5 * time.Minute
)

// Request names the snapshots of one diff.
type Request struct {
	// Base is the older snapshot's ID for a delta, empty for allocated.
	Base string
	// Target is the snapshot whose data is described.
	Target string
	// Secrets hold Ceph-CSI's credentials: userID and userKey.
	Secrets map[string]string
}

// Secret keys of a Request, as Ceph-CSI names them.
const (
	SecretUserID  = "userID"
	SecretUserKey = "userKey"
)

// Source opens RBD snapshots for diffing. It caches cluster connections,
// shared by all its Diffs. Safe for concurrent use.
type Source struct {
	opts   Options
	config *config
	conns  *conn.Cache
}

// NewSource returns a Source; Close releases it.
func NewSource(o Options) *Source {
	if o.MountTimeout <= 0 {
		o.MountTimeout = DefaultMountTimeout
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = DefaultOpTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxConnAge <= 0 {
		o.MaxConnAge = DefaultMaxConnAge
	}
	t := conn.Timeouts{Mount: o.MountTimeout, Op: o.OpTimeout}
	return &Source{
		opts:   o,
		config: &config{path: o.ConfigPath},
		conns:  conn.NewCache(t, o.IdleTimeout, o.MaxConnAge),
	}
}

// Close shuts down the cached connections: idle ones at once, the others
// when their Diffs close. It waits for connect attempts in flight (at most
// about MountTimeout). Open fails after Close.
func (s *Source) Close() error {
	s.conns.Close()
	return nil
}

// Stats counts a Source's cluster connections.
type Stats = conn.Stats

// Stats counts the cached connections.
func (s *Source) Stats() Stats { return s.conns.Stats() }

// Open resolves the snapshots of req and prepares one diff: the allocated
// extents of Target when Base is empty, otherwise the extents that changed
// from Base to Target, which must be an older snapshot of the same image.
// The caller must Close the Diff. On error, everything Open took is
// released. Errors are classified as documented in the package comment.
//
// In three steps: parse the IDs and the secrets, so that a malformed
// request fails before any connect (parseRequest, credentials); resolve
// the IDs to snapshots, which connects only for Ceph-CSI handles, whose
// journal is in the cluster (resolveIDs); then connect, if resolving did
// not, and open the image (openDiff).
func (s *Source) Open(ctx context.Context, req Request) (*Diff, error) {
	target, base, err := parseRequest(req)
	if err != nil {
		return nil, err
	}
	user, key, err := credentials(req.Secrets)
	if err != nil {
		return nil, err
	}
	cl, err := s.config.lookup(target.clusterID())
	if err != nil {
		return nil, err
	}
	host, dial, err := conn.MonHost(cl.Monitors)
	if err != nil {
		// The server's configuration is broken: not the caller's fault.
		return nil, fmt.Errorf("cluster %q in the cluster config: %v", cl.ID, err)
	}
	lc := &lazyConn{ctx: ctx, cache: s.conns, params: conn.Params{MonHost: host, Dial: dial, User: user, Key: key}}
	defer lc.release() // unless handed to the Diff

	tref, bref, err := resolveIDs(req, cl, target, base, lc.get)
	if err != nil {
		// As openDiff does: the caller may Open again after a temporary
		// error, and must get a new connection then (see driver.Source).
		discardOnTimeout(lc.cache, lc.cc, err)
		return nil, err
	}
	if _, err := lc.get(); err != nil {
		return nil, err
	}
	return s.openDiff(ctx, lc.take(), tref, bref)
}

// parseRequest decodes the target's and the base's IDs (base is nil for
// allocated extents); both must name the same cluster.
func parseRequest(req Request) (target, base reference, err error) {
	if target, err = parseReference(req.Target); err != nil {
		return nil, nil, fmt.Errorf("target: %w", err)
	}
	if req.Base == "" {
		return target, nil, nil
	}
	if base, err = parseReference(req.Base); err != nil {
		return nil, nil, fmt.Errorf("base: %w", err)
	}
	if base.clusterID() != target.clusterID() {
		return nil, nil, fmt.Errorf("snapshots of different volumes: base %q is in cluster %q, target %q in cluster %q: %w",
			req.Base, base.clusterID(), req.Target, target.clusterID(), fs.ErrInvalid)
	}
	return target, base, nil
}

// resolveIDs resolves the target and the base (if any) to snapshots of
// cluster cl, connecting through connect when an ID needs the cluster,
// and checks that they can be diffed: snapshots of the same image, and
// neither flattened by Ceph-CSI. bref is nil when base is.
func resolveIDs(req Request, cl Cluster, target, base reference, connect func() (*rados.Conn, error)) (tref snapRef, bref *snapRef, err error) {
	if tref, err = target.resolve(cl, connect); err != nil {
		return snapRef{}, nil, fmt.Errorf("resolve target %q: %w", req.Target, err)
	}
	if base == nil {
		return tref, nil, nil
	}
	b, err := base.resolve(cl, connect)
	if err != nil {
		return snapRef{}, nil, fmt.Errorf("resolve base %q: %w", req.Base, err)
	}
	// A flattened Ceph-CSI snapshot no longer shares history with the
	// source volume's other snapshots: nothing to diff against.
	for _, f := range []struct {
		id  string
		ref snapRef
	}{{req.Base, b}, {req.Target, tref}} {
		if f.ref.flattened {
			return snapRef{}, nil, fmt.Errorf("snapshot %q was flattened by Ceph-CSI (image %s has no parent), so it cannot be diffed against another snapshot: a full backup is needed (ask for its allocated blocks): %w",
				f.id, f.ref.imageSpec(), errors.ErrUnsupported)
		}
	}
	if !b.sameImage(tref) {
		return snapRef{}, nil, fmt.Errorf("snapshots of different volumes: base %s, target %s: %w", b, tref, fs.ErrInvalid)
	}
	return tref, &b, nil
}

// openDiff opens the image of tref on cc, whose reference it takes, and
// prepares the Diff as the Source's options say. On error it closes the
// Diff, which releases cc, and first discards cc when the error says the
// cluster did not answer in time.
func (s *Source) openDiff(ctx context.Context, cc *conn.Conn, tref snapRef, bref *snapRef) (_ *Diff, err error) {
	d := &Diff{conns: s.conns, cc: cc, target: tref, base: bref, whole: s.opts.WholeObject, trustObjectMap: s.opts.TrustObjectMap, walk: s.opts.Walk}
	defer func() {
		if err != nil {
			discardOnTimeout(d.conns, d.cc, err)
			d.Close()
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := d.open(); err != nil {
		return nil, err
	}
	if d.whole && d.base != nil && !s.opts.Precise {
		// Whole-object deltas across a shrink-snapshot-grow can miss
		// changes (a reef fast-diff bug): take librbd's exact walk then.
		lo, hi, err := d.cutOff()
		if err != nil {
			return nil, err
		}
		d.whole = lo == hi
	}
	if s.opts.Precise {
		if err := d.openPrecise(); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// cephxKeyHeader is the size of a cephx key's header (type, creation time,
// secret length) before the secret itself.
const cephxKeyHeader = 12

// credentials returns the cephx user and key of a request's secrets.
// Errors name a missing secret, never a value.
func credentials(secrets map[string]string) (user, key string, err error) {
	user, key = secrets[SecretUserID], secrets[SecretUserKey]
	for _, s := range []struct{ name, value string }{{SecretUserID, user}, {SecretUserKey, key}} {
		if s.value == "" {
			return "", "", fmt.Errorf("secret %q is missing: %w", s.name, fs.ErrInvalid)
		}
	}
	// librados would print an undecodable key to stderr.
	if b, err := base64.StdEncoding.DecodeString(key); err != nil || len(b) <= cephxKeyHeader {
		return "", "", fmt.Errorf("secret %q is not a cephx key (base64): %w", SecretUserKey, fs.ErrInvalid)
	}
	return user, key, nil
}

// lazyConn gets the cluster connection of one Open when first needed: native
// IDs resolve without it, so that malformed requests fail without a connect.
type lazyConn struct {
	ctx    context.Context
	cache  *conn.Cache
	params conn.Params
	cc     *conn.Conn
}

// get returns the connection, connecting on first use.
func (l *lazyConn) get() (*rados.Conn, error) {
	if l.cc == nil {
		cc, err := l.cache.Get(l.ctx, l.params)
		if err != nil {
			return nil, err
		}
		l.cc = cc
	}
	return l.cc.Rados(), nil
}

// take hands the reference to the caller; release then does nothing.
func (l *lazyConn) take() *conn.Conn {
	cc := l.cc
	l.cc = nil
	return cc
}

// release drops the reference unless it was taken.
func (l *lazyConn) release() {
	if l.cc != nil {
		l.cache.Release(l.cc)
		l.cc = nil
	}
}
