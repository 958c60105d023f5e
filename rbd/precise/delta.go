package precise

// The refinement of a delta candidate: the snap set of its object
// (list_snaps), then its extents where the rules of rules.go need them.

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
)

// isNoEnt reports whether a radospp call found no such object.
func isNoEnt(err error) bool {
	var e radosErr
	return errors.As(err, &e) && e == -radosErr(syscall.ENOENT)
}

// delta refines a delta candidate by the rules of deltaSpans.
func (r *Refiner) delta(ctx context.Context, c candidate) ([]span, error) {
	r.objects.Add(1)
	objno := c.off / r.top.objSize
	name := r.top.object(objno)
	if c.fresh {
		out, err := r.freshDelta(ctx, objno, name)
		if !isNoEnt(err) {
			return out, err
		}
	}
	ss, err := listSnaps(r.dir, name)
	return r.deltaOf(ctx, objno, name, ss, err, false)
}

// freshDelta is the delta of an object that the object maps say is new
// since the base snapshot (candidate.fresh), with one query instead of
// two: its allocated extents at the target (deltaSpans' rule for an
// object new since s1 without parent data, which list_snaps would only
// confirm). The maps' existence bits are what the candidates come from
// anyway; an object in a range where they may be wrong (r.shrunk,
// r.lostParent) takes the full path, and so does one that mapext does not
// find at the target (it returns that ENOENT), and one within the base's
// parent overlap, whose parent data the full path weighs.
func (r *Refiner) freshDelta(ctx context.Context, objno int64, name string) ([]span, error) {
	size := r.top.objSize
	base := objno * size
	obj := span{base, size}
	if r.shrunk.overlaps(obj) || r.lostParent.overlaps(obj) || (r.base.parent != nil && base < r.base.overlap) {
		return nil, radosErr(-int(syscall.ENOENT))
	}
	own2, err := r.top.data.extents(r.top.ioctx, name, 0, size, -1)
	if isNoEnt(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("at snapshot %d: %w", r.s2, err)
	}
	return normalize(shift(own2, base)), nil
}

// batchDelta refines a delta candidate of the walk: up to walkBatch whole
// objects, whose snap sets one rsm_list_snaps_batch call asks for all at
// once. An object that the image itself has at neither snapshot (most
// answer ENOENT) changed nowhere, since where it is absent the image reads
// its parent's snapshot, which does not change, except where the target
// lost parent data (r.lostParent). An object whose refinement fails falls
// back to its whole extent, alone; a timeout fails the candidate.
func (r *Refiner) batchDelta(ctx context.Context, c candidate) ([]span, error) {
	size := r.top.objSize
	objs := c.objs
	if objs == nil {
		for o := c.off / size; o <= (c.off+c.len-1)/size; o++ {
			objs = append(objs, o)
		}
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		names = append(names, r.top.object(o))
	}
	sss, errs, err := listSnapsBatch(r.dir, names)
	if err != nil {
		return nil, reasoned{ReasonListSnaps, fmt.Errorf("list_snaps %s and %d more: %w", names[0], len(names)-1, err)}
	}
	r.objects.Add(int64(len(names)))
	var out []span
	for i, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		objno := objs[i]
		s, err := r.deltaOf(ctx, objno, name, sss[i], errs[i], true)
		if err != nil {
			if cepherr.Unanswered(err) || ctx.Err() != nil {
				return nil, err
			}
			r.fellBack(cepherr.Classify(err))
			s = []span{{objno * size, size}}
		}
		out = append(out, s...)
	}
	return out, nil
}

// deltaOf refines object objno, named name, from its snap set ss (or the
// error of list_snaps); batched: as batchDelta says.
func (r *Refiner) deltaOf(ctx context.Context, objno int64, name string, ss snapSet, err error, batched bool) ([]span, error) {
	size := r.top.objSize
	base := objno * size
	switch {
	case isNoEnt(err):
		// No version at all, so none at s1 or s2 (one that existed at a
		// snapshot lives on as a clone): nothing changed in the object,
		// as librbd's exact diff also concludes. The object map can
		// still list it, when it lived only between two snapshots.
		ss = snapSet{}
	case err != nil:
		return nil, reasoned{ReasonListSnaps, fmt.Errorf("list_snaps %s: %w", name, err)}
	}
	od, err := diffSnapSet(ss, r.s1, r.s2)
	if err != nil {
		return nil, reasoned{ReasonSnapSet, fmt.Errorf("object %s: %w", name, err)}
	}
	if batched && !od.exists1 && !od.exists2 && !r.lostParent.overlaps(span{base, size}) {
		return nil, nil
	}
	n := od.needs()
	// A large change inside an object that exists at both snapshots is
	// most often a discard: keep only what is data at one of them.
	holes := od.exists1 && od.exists2 && spanBytes(clip(od.changed, 0, min(od.size1, od.size2))) > copyUpDense
	if holes {
		n.own1, n.own2 = true, true
	}
	var own1, own2, parent1, parent2 []span
	// Where the object grew or shrank, only [min, max) of its two sizes
	// is read: the overlap diff answers below.
	lo := int64(0)
	if od.exists1 && od.exists2 && !holes {
		lo = min(od.size1, od.size2)
	}
	if n.own1 {
		if own1, err = r.base.data.extents(r.base.ioctx, name, lo, size-lo, od.size1); err != nil {
			return nil, fmt.Errorf("at snapshot %d: %w", r.s1, err)
		}
	}
	if n.own2 {
		if own2, err = r.top.data.extents(r.top.ioctx, name, lo, size-lo, od.size2); err != nil {
			return nil, fmt.Errorf("at snapshot %d: %w", r.s2, err)
		}
	}
	if n.parent1 {
		if parent1, err = r.base.parentView(ctx, base, base+size); err != nil {
			return nil, err
		}
	}
	if n.parent2 {
		if parent2, err = r.top.parentView(ctx, base, base+size); err != nil {
			return nil, err
		}
	}
	changed := deltaSpans(od, own1, own2, shift(parent1, -base), shift(parent2, -base))
	if holes {
		changed = withoutHoles(changed, own1, own2, min(od.size1, od.size2))
	}
	changed = shift(changed, base)
	if len(changed) > 0 && (!(od.exists1 && od.exists2) || holes) && (r.base.underParent(base) || r.top.underParent(base)) {
		// The object hides parent data at one snapshot, maybe a copy of
		// it, or a large change hit one that a copy-up filled with zeros
		// (copyup.go): compare the content.
		return r.changedChunks(ctx, changed)
	}
	return changed, nil
}
