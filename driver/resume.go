package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
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

// iterate runs the diff from the stream's starting offset to the end,
// resuming it after temporary errors.
func (r *streamRun) iterate(ctx context.Context) error {
	from := r.start
	for {
		cause := r.diff.Iterate(ctx, from, r.add)
		if cause != nil && r.addErr == nil && ctx.Err() != nil {
			// Cancelled while librbd waited for the cluster: the
			// stream ends for the cancel, not for the cluster.
			return ctx.Err()
		}
		if cause == nil || r.final(ctx, cause) {
			return r.seamErr(ctx, cause)
		}
		at := r.p.resume()
		failed := time.Now()
		if err := r.reopen(ctx, cause); err != nil {
			r.observeResume(cause, time.Since(failed), false)
			return err
		}
		from = at
		if rs, ok := r.diff.(Resumer); ok {
			from = max(r.start, min(rs.ResumeFrom(at), at))
		}
		from = r.seam.begin(r.diff, r.start, at, from)
		r.resumed(ctx, cause, failed, at, from)
	}
}

// resumed counts and logs one resume: the diff that failed with cause at
// failed is open again, and the stream goes on at offset, the diff from
// diffFrom.
func (r *streamRun) resumed(ctx context.Context, cause error, failed time.Time, offset, diffFrom int64) {
	r.resumes++
	r.observeResume(cause, time.Since(failed), true)
	klog.FromContext(ctx).V(2).Info("Resumed stream", "offset", offset, "diffFrom", diffFrom,
		"reason", resumeReason(cause), "took", time.Since(failed), "resumes", r.resumes, "err", cause)
}

// add hands an extent to the pager, keeping the pager's error: it ends the
// stream (the client's side failed), it is never resumed. While a resumed
// stream checks its seam (seam.go), the extents before the resume point
// are compared instead; a mismatch ends the stream too.
func (r *streamRun) add(e Extent) error {
	if r.seam.checking {
		over, err := r.seam.check(e)
		if err != nil {
			r.addErr = err
			return err
		}
		if !over {
			return nil
		}
	}
	r.seam.record(r.diff, e)
	err := r.p.add(e)
	if err != nil {
		r.addErr = err
	}
	return err
}

// seamErr logs and counts err when it is a failed seam check, and
// returns it.
func (r *streamRun) seamErr(ctx context.Context, err error) error {
	var m errSeamMismatch
	if !errors.As(err, &m) {
		return err
	}
	klog.FromContext(ctx).Error(err, "A resumed diff disagrees with what the stream sent: ending it ABORTED",
		"offset", m.until, "resumes", r.resumes)
	if so, ok := r.d.opts.Observer.(SeamObserver); ok {
		so.SeamMismatch(r.method)
	}
	return err
}

// final reports whether err, from the diff, ends the stream.
func (r *streamRun) final(ctx context.Context, err error) bool {
	return r.d.opts.ResumeBudget <= 0 || ctx.Err() != nil || r.addErr != nil || !temporary(err)
}

// open opens the stream's first diff. An open that fails with a
// temporary error (a backup that starts during an OSD outage, say) is
// tried again, backing off, within the budget, as a re-open is: failing at
// once would make the client's backup a full one. Not when the monitors
// gave no session (see Source). It is counted and logged as a resume.
func (r *streamRun) open(ctx context.Context) error {
	diff, err := r.d.src.Open(ctx, r.req)
	if err == nil {
		r.diff = diff
		return nil
	}
	if r.final(ctx, err) || noSession(err) {
		return err
	}
	cause, failed := err, time.Now()
	if err := r.retryOpen(ctx, cause, sleep, nil); err != nil {
		r.observeResume(cause, time.Since(failed), false)
		return err
	}
	r.resumed(ctx, cause, failed, r.start, r.start)
	return nil
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

// reopen closes the failed diff and opens the snapshots again (retryOpen),
// waiting with the sender, which watches the client meanwhile. The new
// diff must read what the first one read.
func (r *streamRun) reopen(ctx context.Context, cause error) error {
	r.closeDiff(ctx)
	return r.retryOpen(ctx, cause, r.snd.pause, r.sameAsFirst)
}

// sameAsFirst checks that a re-opened diff reads the first one's
// snapshots.
func (r *streamRun) sameAsFirst(diff Diff) error {
	switch {
	case diff.Capacity() != r.capacity:
		return fmt.Errorf(msgCapacityChanged, r.capacity, diff.Capacity())
	case lineageOf(diff) != r.lineage:
		return errLineageChanged{}
	}
	return nil
}

// retryOpen opens the snapshots again, pausing with pause between
// attempts, until one succeeds and check (when set) accepts it, an error
// that lasts comes, ctx is done, pause fails (the client stalls or
// fails), or the budget is spent. The time it takes counts against the
// stream's budget.
func (r *streamRun) retryOpen(ctx context.Context, cause error, pause func(context.Context, time.Duration) error, check func(Diff) error) error {
	began := time.Now()
	defer func() { r.resuming += time.Since(began) }()
	newBackOff := r.d.opts.NewBackOff
	if newBackOff == nil {
		newBackOff = defaultBackOff
	}
	bo := newBackOff()
	last, attempts := cause, 0
	for {
		left := r.d.opts.ResumeBudget - r.resuming - time.Since(began)
		if left <= 0 {
			return status.Errorf(codes.Unavailable, msgResumeBudget, r.d.opts.ResumeBudget,
				(r.resuming + time.Since(began)).Round(time.Millisecond), attempts, last)
		}
		wait := bo.NextBackOff()
		if wait == backoff.Stop || wait > left {
			wait = left
		}
		if err := pause(ctx, wait); err != nil {
			return err
		}
		attempts++
		diff, err := r.d.src.Open(ctx, r.req)
		switch {
		case err == nil && check != nil:
			if err := check(diff); err != nil {
				if cerr := diff.Close(); cerr != nil {
					klog.FromContext(ctx).V(4).Info("Closing a re-opened diff failed", "err", cerr)
				}
				return err
			}
			fallthrough
		case err == nil:
			r.diff = diff
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !temporary(err):
			return err
		}
		last = err
	}
}

// Lineager is implemented by a Diff that names what it reads: its
// snapshots and their parent snapshots, by ID (rbd's Diff.Lineage). A
// re-opened Diff must read what the first one read: had a parent been
// flattened away in between, say, what was sent before the seam may have
// been read from a parent snapshot that was being trimmed, and only the
// first Diff's own check at its end could have told.
type Lineager interface{ Lineage() string }

func lineageOf(diff Diff) string {
	if l, ok := diff.(Lineager); ok {
		return l.Lineage()
	}
	return ""
}

// errLineageChanged ends a stream whose re-opened Diff reads other
// snapshots than the first: ABORTED, since asking again gives a right
// answer.
type errLineageChanged struct{}

func (errLineageChanged) Error() string { return msgLineageChanged }
func (errLineageChanged) Aborted() bool { return true }

// closeDiff closes the failed diff before a re-open, keeping what precise
// mode did in it for the stream's summary.
func (r *streamRun) closeDiff(ctx context.Context) {
	r.ref = mergeRefinement(r.ref, refinementOf(r.diff))
	if err := r.diff.Close(); err != nil {
		klog.FromContext(ctx).V(4).Info("Closing a failed diff failed", "err", err)
	}
	r.diff = nil
}

// observeResume tells the observer about one resume, done or not.
func (r *streamRun) observeResume(cause error, took time.Duration, ok bool) {
	if ro, is := r.d.opts.Observer.(ResumeObserver); is {
		ro.Resumed(r.method, resumeReason(cause), took, ok)
	}
}

// refinementOf returns what precise mode did in diff, if it says.
func refinementOf(diff Diff) Refinement {
	if rf, ok := diff.(Refiner); ok {
		return rf.Refinement()
	}
	return Refinement{}
}

// mergeRefinement adds up what precise mode did in the diffs of one stream.
func mergeRefinement(a, b Refinement) Refinement {
	if !b.On {
		return a
	}
	if !a.On {
		return b
	}
	a.Objects += b.Objects
	a.Checksummed += b.Checksummed
	if b.Candidates != "" {
		a.Candidates = b.Candidates
	}
	if b.ImageFallback != "" {
		a.ImageFallback, a.ImageFallbackDetail = b.ImageFallback, b.ImageFallbackDetail
	}
	if len(b.ObjectFallbacks) > 0 {
		m := make(map[string]int64, len(a.ObjectFallbacks)+len(b.ObjectFallbacks))
		for k, v := range a.ObjectFallbacks {
			m[k] += v
		}
		for k, v := range b.ObjectFallbacks {
			m[k] += v
		}
		a.ObjectFallbacks, a.LastObjectFallback = m, b.LastObjectFallback
	}
	return a
}
