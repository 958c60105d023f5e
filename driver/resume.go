package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Resuming a stream inside the server.
//
// A diff that fails with an error that goes away by itself (temporary: an
// OSD that did not answer within the op timeout, a connection reset, an
// OSD restarting without its object classes yet, a monitor failover) does
// not end the stream when Options.ResumeBudget allows: the diff is closed
// (the Source stops caching a connection that failed so), the driver backs
// off, opens the same snapshots again and goes on from the end of the
// extents the pager received, with the pager, its unsent page and its
// pending tuple as they were. The client sees pages flow again, and the
// same tuples as from an uninterrupted diff: the snapshots are immutable,
// and a Diff that reports a unit (an RBD object) differently when started
// inside it says where to restart (Resumer), the pager dropping what it
// already received. A request's first open that fails so is retried the
// same way, before any page (open), unless the monitors gave no session.
//
// What ends the stream anyway: an error that does not go away (NOT_FOUND,
// PERMISSION_DENIED, UNAUTHENTICATED, INVALID_ARGUMENT, ...) at once, also
// from a re-open; the budget spent (UNAVAILABLE, saying how long it tried
// and what failed last); cancellation and the stall timeout at once, also
// during a backoff; and any error of the client's side (a failed send).

// Backoff between the re-opens of one stream; see Options.NewBackOff.
const (
	resumeInitialWait = time.Second
	resumeMaxWait     = 10 * time.Second
)

func defaultBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = resumeInitialWait
	b.Multiplier = 2
	b.RandomizationFactor = 0.5
	b.MaxInterval = resumeMaxWait
	return b
}

// temporary reports whether err goes away by itself (see Source): a
// stream may be resumed after it. Context errors and the classes that last
// are never temporary.
func temporary(err error) bool {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrInvalid), errors.Is(err, fs.ErrPermission),
		unauthenticated(err), errors.Is(err, errors.ErrUnsupported):
		return false
	case errors.Is(err, os.ErrDeadlineExceeded):
		return true
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// resumeReason is the short reason of a temporary error, for the metric's
// label: the error's own Reason() when it has one (see Source).
func resumeReason(err error) string {
	var r interface{ Reason() string }
	if errors.As(err, &r) && r.Reason() != "" {
		return r.Reason()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return "timeout"
	}
	return "temporary"
}

// noSession reports whether err says the cluster's monitors gave no
// session (see Source).
func noSession(err error) bool {
	var ns interface{ NoSession() bool }
	return errors.As(err, &ns) && ns.NoSession()
}

// sleep waits for d, or until ctx is done: the backoff of a first open,
// before any page.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
