package driver

import (
	"context"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/report"
)

// Source opens snapshots for diffing. The rbd package implements it on top
// of librbd, adapted by package rbddriver; tests use a fake. It is all the
// driver knows about Ceph.
//
// Errors returned by a Source (from Open, Iterate or Close) are classified
// with errors.Is against these standard sentinels, so that the Source needs
// to import neither this package nor gRPC. toStatus gives each class its
// gRPC code; docs/errors.md is the table of codes, and when to retry:
//
//	fs.ErrNotExist          cluster, pool, namespace, image or snapshot unknown,
//	                        or removed while the diff read it (then from Iterate)
//	fs.ErrInvalid           malformed ID, base not older than target, snapshots
//	                        of different volumes, secrets missing
//	Unauthenticated() bool  an error with this method, returning true, says the
//	                        credentials were refused (wrong key, unknown user)
//	Aborted() bool          another client changed a snapshot while the diff
//	                        read it (a parent flattened away); asking again
//	                        gives a right answer
//	fs.ErrPermission        the Ceph user lacks the caps
//	errors.ErrUnsupported   the cluster cannot answer this (librbd too old,
//	                        clone flattened: a full backup is needed)
//	os.ErrDeadlineExceeded  the cluster did not answer in time (temporary)
//	Temporary() bool        an error with this method, returning true, goes
//	                        away by itself (a connection reset or shut down, an
//	                        OSD restarting, a monitor failover)
//
// An error that is temporary (os.ErrDeadlineExceeded, or Temporary()
// true, and none of the classes above it) from Iterate does not end the
// stream within Options.ResumeBudget: the driver closes the Diff, backs
// off, Opens the same request again (a temporary error from that Open is
// retried too; any other ends the stream with its code: a snapshot
// deleted meanwhile is NOT_FOUND) and Iterates from where the stream
// stopped (see Resumer). A Source must therefore not hand a re-Open a
// connection that failed with a temporary error. A temporary error may
// have a method Reason() string: a short, fixed label for the metric of
// resumes ("timeout", "connection reset"); never a name or an ID.
//
// A temporary error from the first Open of a request is retried the same
// way, within the same budget (a backup that starts during an OSD outage
// then gets its answer, not an error that its tool turns into a full
// backup), unless it has a method NoSession() bool returning true: the
// cluster's monitors gave no session (unreachable, or no quorum). That
// ends the request with UNAVAILABLE at once: nothing shows those monitors
// ever answered, and a wrong monitor list, the usual cause, must be seen
// at once, not after the budget.
//
// Context errors map to CANCELLED or DEADLINE_EXCEEDED; anything else is
// INTERNAL. Error texts reach the client, so they must never contain secrets.
type Source interface {
	// Open resolves the snapshots of req and prepares one diff: the
	// allocated extents of Target when Base is empty, otherwise the extents
	// that changed from Base to Target. The caller must Close the Diff.
	Open(ctx context.Context, req OpenRequest) (Diff, error)
}

// OpenRequest names the snapshots of one RPC.
type OpenRequest struct {
	// Base is the older snapshot's ID for a delta, empty for allocated.
	Base string
	// Target is the snapshot whose data is described.
	Target string
	// Secrets are the request's credentials (Ceph-CSI's userID and userKey).
	Secrets map[string]string
}

// Diff is one prepared diff of an open snapshot pair.
type Diff interface {
	// Capacity is the size of the target snapshot in bytes, as the user
	// of the volume sees it.
	Capacity() int64
	// Iterate runs the diff once, from offset to the end of the volume,
	// calling emit for each extent in ascending order of Offset, without
	// overlap. Extents lie within [offset, Capacity()). When emit returns an
	// error, the diff stops at once and Iterate returns that error. Iterate
	// also stops with ctx's error when ctx is done. It returns nil only if
	// every extent was delivered and the snapshots outlived the diff: a
	// snapshot removed while it ran may have made extents go missing, and
	// then Iterate fails (NOT_FOUND), so that the stream never ends OK.
	Iterate(ctx context.Context, offset int64, emit func(Extent) error) error
	// Close releases the snapshot (open images, the cluster connection).
	Close() error
}

// Resumer is implemented by a Diff whose Iterate, started at an offset
// inside one of its units (an RBD object), may report that unit otherwise
// than an Iterate that started before it: librbd may report the rest of
// an object, precise mode refines whole objects. A stream resumed at
// offset then Iterates from ResumeFrom(offset), the start of the unit,
// at or below offset, from which Iterate reports [offset, Capacity())
// exactly as an uninterrupted Iterate did; the driver drops the extents
// below offset, which the stream already has. Without Resumer, the driver
// resumes at offset itself.
type Resumer interface {
	ResumeFrom(offset int64) int64
}

// Lineager is implemented by a Diff that names what it reads: its
// snapshots and their parent snapshots, by ID (rbd's Diff.Lineage). A
// re-opened Diff must read what the first one read: had a parent been
// flattened away in between, say, what was sent before the seam may have
// been read from a parent snapshot that was being trimmed, and only the
// first Diff's own check at its end could have told.
type Lineager interface{ Lineage() string }

// Extent is a byte range of a volume: [Offset, Offset+Length).
type Extent struct {
	Offset int64
	Length int64
}

// RefinementReporter is implemented by a Diff that may refine librbd's
// extents to the bytes that changed (precise mode) and says what precise
// mode did. The stream's log line and metrics (RefinementObserver) report
// it, fallbacks above all: each one reports more than changed, never
// less, but many of them mean precise mode is not working.
type RefinementReporter interface {
	Refinement() Refinement
}

// Refinement is what precise mode did in one stream: report.Refinement,
// which precise mode fills and metrics counts, declared there so that
// neither needs the driver.
type Refinement = report.Refinement
