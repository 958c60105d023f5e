package precise

import (
	"context"
	"errors"
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"sync"
)

// candidate is one RADOS object's part of librbd's whole-object diff, in
// raw image offsets: an object the object map marks as changed (delta) or
// holding data (allocated). exists is librbd's flag: false for an object
// that does not exist at the target snapshot.
type candidate struct {
	off, len int64
	exists   bool
	// objs are the objects of a walk's candidate (pipeline.every), which
	// may hold several, not necessarily adjacent; nil: the one object of
	// [off, off+len).
	objs []int64
	// fresh: the object maps say the object exists at the target
	// snapshot and not at the base (pipeline.before), so its delta is
	// its extents at the target (Refiner.delta).
	fresh bool
}

// pipeline sits between librbd's whole-object diff-iterate and Iterate's
// callback. librbd calls feed for each candidate extent, on the thread that
// runs the diff; feed splits it into objects and starts refining each in
// its own goroutine, at most width at once; the refined extents reach emit
// strictly in image order, always from the goroutine that called
// DiffIterate (from feed while librbd runs, from finish after it returns).
//
//   - Order: a window (FIFO) of jobs in image order; only its head is ever
//     delivered.
//   - Memory and backpressure: when the window is full, feed waits for its
//     head, then delivers it; emit blocking blocks feed, and so librbd.
//   - Stopping: emit returning an error, or ctx ending, makes feed return
//     that error, which stops librbd (ObjectScanner); finish then
//     cancels the jobs' context and waits for every job, so that no
//     goroutine outlives Iterate.
//   - Fallback: a job that fails (an error, a panic) delivers its
//     candidate as librbd gave it, whole, and is counted; but a timeout
//     (the cluster did not answer: os.ErrDeadlineExceeded) stops the
//     pipeline with that error, since every later job would time out too
//     and a stream of fallbacks would hide an outage behind an OK.
type pipeline struct {
	ctx      context.Context
	cancel   context.CancelFunc
	objSize  int64
	skipGone bool // allocated: candidates that do not exist hold no data
	width    int  // how many jobs the window holds at most
	batch    int  // objects per candidate of walk; 0 or 1: one
	refine   func(context.Context, candidate) ([]span, error)
	emit     func(off, length int64) error
	fellBack func(error) // counts a fallback

	// forced are ranges whose objects librbd may fail to report,
	// ascending: each of their objects is refined whether librbd names it
	// or not (see Refiner.shrunk), taken one at a time by force.
	forced []span
	next   int64 // where the last candidate started ends
	// before, when set (hasBefore), are the raw ranges of the objects
	// that exist at the base snapshot by its object map, ascending: a
	// candidate that exists at the target outside them is fresh.
	before    []span
	hasBefore bool

	window  []*job
	stopped bool  // feed refuses more candidates
	err     error // the emit, context or timeout error that stopped the pipeline
	wg      sync.WaitGroup
}

// maxRefining bounds the refinements running at once in the process, each
// holding an OS thread in a librados call. Without it, many streams
// against a slow cluster would each hold a window of threads, up to Go's
// limit of 10000 threads, which is a fatal crash. 64 is four full windows.
const maxRefining = 64

// refineSlots holds a token per refinement running.
var refineSlots = make(chan struct{}, maxRefining)

// job is one candidate in the window.
type job struct {
	c     candidate
	done  chan struct{} // closed when out (or fatal) is set
	out   []span
	fatal error // the cluster timed out: the pipeline must stop
}

func newPipeline(ctx context.Context, objSize int64, window int, skipGone bool,
	refine func(context.Context, candidate) ([]span, error), emit func(off, length int64) error, fellBack func(error)) *pipeline {
	ctx, cancel := context.WithCancel(ctx)
	return &pipeline{ctx: ctx, cancel: cancel, objSize: objSize, width: max(window, 1), skipGone: skipGone,
		refine: refine, emit: emit, fellBack: fellBack}
}

// feed is the emit of the object scan (ObjectScanner.ScanObjects). A
// panic in it stops the pipeline, with an error that ends the stream
// non-OK, rather than unwinding with candidates in flight.
func (p *pipeline) feed(off, length int64, exists bool) (err error) {
	defer func() {
		if r := recover(); r != nil {
			p.stopped, p.err = true, fmt.Errorf("precise diff callback panicked: %v", r)
			err = p.err
		}
	}()
	if p.stopped {
		return p.stopErr() // an ObjectScanner may call back after a stop
	}
	if err := p.ctx.Err(); err != nil {
		p.stop(err)
		return err
	}
	if !exists && p.skipGone {
		return nil
	}
	o, end := off, off+length
	if !p.force(o) {
		return p.stopErr()
	}
	for o < end {
		oe := min(end, (o/p.objSize+1)*p.objSize)
		if !p.add(candidate{off: o, len: oe - o, exists: exists, fresh: exists && p.hasBefore && !p.existedBefore(o)}) {
			return p.stopErr()
		}
		o = oe
	}
	return nil
}

// errPipelineStopped is what feed returns once stopped when no reason was
// kept (there always is one: emit's, the context's or a timeout).
var errPipelineStopped = errors.New("precise pipeline stopped")

// stopErr is why the pipeline stopped.
func (p *pipeline) stopErr() error {
	if p.err != nil {
		return p.err
	}
	return errPipelineStopped
}

// every makes every object of the raw ranges rs (ascending, merged, in
// whole objects but at the ends of the Iterate range) a candidate, in
// image order, instead of librbd's whole-object diff naming them: for an
// image without a usable object map, where librbd would run list_snaps on
// each object itself, one at a time. With batch > 1 a candidate holds up
// to batch objects, not necessarily adjacent (candidate.objs). The window
// bounds memory and the queries in flight as for feed; it returns once
// the ranges are walked or the pipeline stopped (finish says why).
func (p *pipeline) every(rs []span) {
	batch := int64(max(p.batch, 1))
	var c candidate
	flush := func() bool {
		if len(c.objs) == 0 {
			return true
		}
		ok := p.add(c)
		c = candidate{}
		return ok
	}
	for _, r := range rs {
		for o := r.off; o < r.end(); {
			if p.stopped {
				return
			}
			if err := p.ctx.Err(); err != nil {
				p.stop(err)
				return
			}
			oe := min(r.end(), (o/p.objSize+1)*p.objSize)
			if len(c.objs) == 0 {
				c = candidate{off: o, exists: true}
			}
			c.objs = append(c.objs, o/p.objSize)
			c.len = oe - c.off
			if int64(len(c.objs)) >= batch && !flush() {
				return
			}
			o = oe
		}
	}
	flush()
}

// existedBefore reports whether the object at raw offset o is within
// p.before; offsets must come in ascending order.
func (p *pipeline) existedBefore(o int64) bool {
	for len(p.before) > 0 && p.before[0].end() <= o {
		p.before = p.before[1:]
	}
	return len(p.before) > 0 && p.before[0].off <= o
}

// add starts c once the window has room.
func (p *pipeline) add(c candidate) bool {
	if !p.deliver(len(p.window) >= p.width) {
		return false
	}
	p.start(c)
	p.next = c.off + c.len
	return true
}

// force adds the forced candidates that start before offset before,
// except those librbd reported already or is reporting now (the one that
// holds before); it reports false once the pipeline is stopped.
func (p *pipeline) force(before int64) bool {
	for len(p.forced) > 0 && p.forced[0].off < before {
		// One object of the first range at a time: a range costs no
		// memory, however many objects it spans.
		r := &p.forced[0]
		end := min(r.end(), r.off-r.off%p.objSize+p.objSize)
		c := span{r.off, end - r.off}
		if *r = (span{end, r.end() - end}); r.len <= 0 {
			p.forced = p.forced[1:]
		}
		if c.end() <= p.next || (c.off <= before && before < c.end()) {
			continue
		}
		if !p.add(candidate{off: c.off, len: c.len, exists: true}) {
			return false
		}
	}
	return true
}

// stop makes the pipeline refuse more work: ctx ended, or the cluster
// timed out.
func (p *pipeline) stop(err error) {
	p.stopped = true
	if p.err == nil {
		p.err = err
	}
}

// deliver emits the jobs at the head of the window that are done; with
// wait, it first waits for the head. It reports false once the pipeline is
// stopped.
func (p *pipeline) deliver(wait bool) bool {
	for len(p.window) > 0 {
		j := p.window[0]
		if wait {
			select {
			case <-j.done:
			case <-p.ctx.Done():
				p.stop(p.ctx.Err())
				return false
			}
			wait = false
		} else {
			select {
			case <-j.done:
			default:
				return true
			}
		}
		p.window[0] = nil
		p.window = p.window[1:]
		if j.fatal != nil {
			p.stop(j.fatal)
			return false
		}
		for _, s := range j.out {
			if err := p.emit(s.off, s.len); err != nil {
				p.stop(err)
				return false
			}
		}
	}
	return true
}

// start refines c in a new goroutine, at the tail of the window.
func (p *pipeline) start(c candidate) {
	j := &job{c: c, done: make(chan struct{})}
	p.window = append(p.window, j)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(j.done)
		j.out, j.fatal = p.run(c)
	}()
}

// run refines one candidate, falling back to the candidate itself; a
// timeout is fatal instead (see the type's comment).
func (p *pipeline) run(c candidate) ([]span, error) {
	out, err := func() (out []span, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = reasoned{ReasonPanic, fmt.Errorf("refining %d+%d panicked: %v", c.off, c.len, r)}
			}
		}()
		// Each query is a synchronous librados call on an OS thread
		// of its own: the slot bounds them across all streams.
		select {
		case refineSlots <- struct{}{}:
		case <-p.ctx.Done():
			return nil, p.ctx.Err()
		}
		defer func() { <-refineSlots }()
		return p.refine(p.ctx, c)
	}()
	if err != nil {
		if p.ctx.Err() != nil {
			return nil, nil // stopping anyway; finish reports why
		}
		// Only an unanswered query stops: EOPNOTSUPP (cepherr.ErrUnavailable,
		// also UNAVAILABLE to the client) is what an erasure-coded pool may
		// answer to a query that a replicated one serves, and that object
		// falls back.
		if err = cepherr.Classify(err); cepherr.Unanswered(err) {
			return nil, fmt.Errorf("refine the changes at %d+%d: %w", c.off, c.len, err)
		}
		p.fellBack(err)
		return []span{{c.off, c.len}}, nil
	}
	return clip(normalize(out), c.off, c.off+c.len), nil
}

// release cancels the jobs' context and waits for every job. finish ends
// with it; Iterate also defers it, so that no job outlives Iterate when
// emit panics (the panic goes on once the jobs ended): the jobs read
// image handles that the caller closes next, and hold refinement slots.
// It may run more than once.
func (p *pipeline) release() {
	p.cancel()
	p.wg.Wait()
}

// finish ends the pipeline after librbd returned err: when the diff
// completed, it delivers the rest of the window; in every case it cancels
// and waits for the jobs. It returns the context error that stopped the
// pipeline, if any, else err. A nil pipeline returns err.
func (p *pipeline) finish(err error) error {
	if p == nil {
		return err
	}
	if err == nil && !p.stopped {
		p.force(1<<63 - 1)
	}
	for err == nil && !p.stopped && len(p.window) > 0 {
		p.deliver(true)
	}
	p.release()
	p.window = nil
	if p.err != nil {
		return p.err
	}
	return err
}
