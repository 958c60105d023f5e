package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// A streamRun is one RPC's stream: its diff, re-opened after temporary
// errors, the pager and the sender. Its whole life is in this file, from
// the first open to the summary line; resume.go holds the policy of its
// resumes (which errors, how long to wait, the backoff).
type streamRun struct {
	d        *Driver
	method   string
	req      OpenRequest
	start    int64
	diff     Diff // nil after a failed re-open
	capacity int64
	lineage  string // the first diff's (Lineager); a re-open must match
	p        *pager
	snd      *sender
	emitErr  error         // the pager's error: the client's side failed
	resumes  int           // diffs re-opened
	resuming time.Duration // spent re-opening, in all
	ref      Refinement    // what precise mode did in the diffs closed
	seam     seam          // the check of a resumed diff (seam.go)
}

// stream runs one diff and sends its pages; both RPCs end here. Every
// error leaves through toStatus.
func (d *Driver) stream(ctx context.Context, method string, req OpenRequest, start int64, maxResults int32,
	send func(capacity int64, page []*csi.BlockMetadata) error) (err error) {
	pageSize, err := checkStream(req, start, maxResults)
	if err != nil {
		return err
	}
	r := &streamRun{d: d, method: method, req: req, start: start}
	if err := r.open(ctx); err != nil {
		return toStatus(err)
	}
	defer func() {
		if r.diff == nil {
			return
		}
		if cerr := r.diff.Close(); cerr != nil && err == nil {
			err = toStatus(fmt.Errorf("close snapshot: %w", cerr))
		}
	}()
	r.capacity, r.lineage = r.diff.Capacity(), lineageOf(r.diff)
	if start > r.capacity {
		return status.Errorf(codes.OutOfRange, msgOffsetBeyondSize, start, r.capacity)
	}

	trace := klog.FromContext(ctx).V(5)
	r.snd = startSender(func(page []*csi.BlockMetadata) error {
		if trace.Enabled() {
			trace.Info("Sending page", "tuples", len(page), "first", page[0].ByteOffset)
		}
		return send(r.capacity, page)
	}, d.opts.StallTimeout)
	sent := false
	defer func() {
		if !sent {
			_ = r.snd.wait() // on every error path: no goroutine left behind
		}
	}()
	r.p = newPager(d.opts.BlockMetadataType, d.opts.FixedBlockSize, start, r.capacity, pageSize, r.snd.put)
	began := time.Now()
	var diffTime time.Duration
	defer func() { r.finished(ctx, err, time.Since(began), diffTime) }()
	if start == r.capacity {
		return nil
	}
	err = r.iterate(ctx)
	diffTime = time.Since(began)
	if err != nil {
		return toStatus(err)
	}
	// A diff that returned without error has delivered every extent, but
	// a cancel that came in just then must not end the stream with OK
	// unless the rest was sent.
	if err := r.p.finish(); err != nil {
		return toStatus(err)
	}
	sent = true
	if err := r.snd.wait(); err != nil {
		return toStatus(err)
	}
	return toStatus(ctx.Err())
}

// checkStream checks what both RPCs share and returns the page size.
func checkStream(req OpenRequest, start int64, maxResults int32) (int, error) {
	if maxResults < 0 {
		return 0, status.Errorf(codes.InvalidArgument, msgNegativeMax, maxResults)
	}
	if err := checkSecrets(req.Secrets); err != nil {
		return 0, err
	}
	if start < 0 {
		return 0, status.Errorf(codes.OutOfRange, msgNegativeOffset, start)
	}
	pageSize := int(maxResults)
	if pageSize == 0 {
		pageSize = defaultPage
	}
	return min(pageSize, maxPage), nil
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

// iterate runs the diff from the stream's starting offset to the end,
// resuming it after temporary errors.
func (r *streamRun) iterate(ctx context.Context) error {
	from := r.start
	for {
		cause := r.diff.Iterate(ctx, from, r.emit)
		if cause != nil && r.emitErr == nil && ctx.Err() != nil {
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

// emit is the stream's end of the chain of emits (Diff.Iterate's
// callback): it hands an extent to the pager, keeping the pager's error:
// it ends the stream (the client's side failed), it is never resumed.
// While a resumed stream checks its seam (seam.go), the extents before the
// resume point are compared instead; a mismatch ends the stream too.
func (r *streamRun) emit(e Extent) error {
	if r.seam.checking {
		over, err := r.seam.check(e)
		if err != nil {
			r.emitErr = err
			return err
		}
		if !over {
			return nil
		}
	}
	r.seam.record(r.diff, e)
	err := r.p.add(e)
	if err != nil {
		r.emitErr = err
	}
	return err
}

// final reports whether err, from the diff, ends the stream.
func (r *streamRun) final(ctx context.Context, err error) bool {
	return r.d.opts.ResumeBudget <= 0 || ctx.Err() != nil || r.emitErr != nil || !temporary(err)
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

// finished logs the stream's summary line and reports it to the observer.
func (r *streamRun) finished(ctx context.Context, err error, took, diffTime time.Duration) {
	p := r.p
	kv := []any{"code", status.Code(err), "duration", took,
		"capacity", r.capacity, "startingOffset", r.start, "pages", p.pages, "tuples", p.tuples, "bytes", p.bytes,
		"resumes", r.resumes}
	if r.resumes > 0 || r.resuming > 0 {
		kv = append(kv, "resuming", r.resuming)
	}
	ref := mergeRefinement(r.ref, refinementOf(r.diff))
	if ref.On {
		kv = append(kv, refinementLog(ref)...)
	}
	klog.FromContext(ctx).V(2).Info("Stream finished", append(kv, "err", err)...)
	if o := r.d.opts.Observer; o != nil {
		o.Streamed(r.method, p.tuples, p.bytes, diffTime)
		if ro, ok := o.(RefinementObserver); ok && ref.On {
			ro.Refined(r.method, ref)
		}
	}
}

// refinementLog returns the key/value pairs of a stream's log line that
// say what precise mode did.
func refinementLog(r Refinement) []any {
	kv := []any{"refinedObjects", r.Objects}
	if r.Candidates != "" {
		kv = append(kv, "candidates", r.Candidates)
	}
	if r.Checksummed > 0 {
		kv = append(kv, "checksummedQueries", r.Checksummed)
	}
	if r.ImageFallback != "" {
		kv = append(kv, "imageFallback", r.ImageFallback, "imageFallbackDetail", r.ImageFallbackDetail)
	}
	if n := r.ObjectFallbackCount(); n > 0 {
		kv = append(kv, "objectFallbacks", n, "objectFallbackReasons", r.ObjectFallbacks, "lastObjectFallback", r.LastObjectFallback)
	}
	return kv
}

// refinementOf returns what precise mode did in diff, if it says.
func refinementOf(diff Diff) Refinement {
	if rf, ok := diff.(RefinementReporter); ok {
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

// lineageOf returns what diff reads (Lineager), empty when it does not
// say.
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
