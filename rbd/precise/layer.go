package precise

// The layers of an image, as precise mode reads them: the image at a
// snapshot, then its parent at the parent snapshot, up the clone chain.

import (
	"context"
	"fmt"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/header"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"
)

// layer is an image at one snapshot, as precise mode reads it: an object
// that does not exist there reads from the parent layer within overlap.
type layer struct {
	ioctx     *rados.IOContext // the data pool, reading at the layer's snapshot
	pool, ns  string           // where the image's data objects are: its pool or its data pool
	data      *dataQuery       // how the data pool says where data lies
	prefix    string           // the image's block name prefix
	oldFormat bool             // a format 1 image
	objSize   int64
	overlap   int64 // bytes backed by parent
	parent    *layer
}

func (l *layer) object(objno int64) string { return dataObject(l.prefix, l.oldFormat, objno) }

// dataObject is the name of data object objno of an image with the block
// name prefix prefix (rbd_data.<image id> in format 2, rb.0.<...> in
// format 1), as librbd's util::data_object_name forms it: 12 hex digits in
// format 1, 16 in format 2.
func dataObject(prefix string, oldFormat bool, objno int64) string {
	if oldFormat {
		return fmt.Sprintf("%s.%012x", prefix, objno)
	}
	return fmt.Sprintf("%s.%016x", prefix, objno)
}

// ioctx opens an ioctx reading at snap, closed with the Refiner.
func (r *Refiner) ioctx(conn *rados.Conn, pool, ns string, snap uint64) (*rados.IOContext, error) {
	ioctx, err := conn.OpenIOContext(pool)
	if err != nil {
		return nil, cepherr.Wrap("open pool "+pool, err)
	}
	r.ioctxs = append(r.ioctxs, ioctx)
	ioctx.SetNamespace(ns)
	if err := ioctx.SetReadSnap(rados.SnapID(snap)); err != nil {
		return nil, cepherr.Wrap("set read snapshot", err)
	}
	return ioctx, nil
}

// layer describes image imageID (format 2) of pool and namespace ns at
// snapshot snap, and its parents, from their header objects (see package
// header): one read of a header per layer, where opening each parent would
// open the chain below it again. A chain with more than
// header.MaxCloneDepth parents is not refined (the lineage check refuses
// it anyway).
//
// Implements (through go-ceph): rados_ioctx_create, rados_read_op_exec
// (cls_rbd get_snapcontext, get_features, parent_get, parent_overlap_get,
// get_size, get_object_prefix, get_stripe_unit_count, get_data_pool),
// rados_pool_reverse_lookup, rados_ioctx_snap_set_read.
func (r *Refiner) layer(conn *rados.Conn, pool, ns, imageID string, snap uint64, depth int) (*layer, error) {
	hio, err := conn.OpenIOContext(pool)
	if err != nil {
		return nil, cepherr.Wrap("open pool "+pool, err)
	}
	defer hio.Destroy()
	hio.SetNamespace(ns)
	h, err := header.Read(hio, imageID, snap)
	if err != nil {
		return nil, cepherr.Wrap(fmt.Sprintf("read the header of image %s at snapshot %d", imageID, snap), err)
	}
	lay, err := header.ReadLayout(hio, imageID, snap, h.Features)
	if err != nil {
		return nil, cepherr.Wrap(fmt.Sprintf("read the layout of image %s at snapshot %d", imageID, snap), err)
	}
	// With one object per stripe, the stripe unit does not matter: byte b
	// of the image is in object b / object size (a clone inherits its
	// parent's stripe unit, which can be smaller than its objects).
	if lay.StripeUnit == 0 || lay.ObjectSize%lay.StripeUnit != 0 || lay.StripeCount != 1 {
		return nil, unrefinable{ReasonStriping, fmt.Sprintf("non-default striping (object size %d, stripe unit %d, stripe count %d)", lay.ObjectSize, lay.StripeUnit, lay.StripeCount)}
	}
	dataPool := pool
	if lay.DataPoolID >= 0 {
		// Ceph-CSI's dataPool: the header here, the data objects in
		// the data pool (nearly always erasure-coded), same namespace.
		if dataPool, err = conn.GetPoolByID(lay.DataPoolID); err != nil {
			return nil, cepherr.Wrap(fmt.Sprintf("look up data pool %d", lay.DataPoolID), err)
		}
	}
	ioctx, err := r.ioctx(conn, dataPool, ns, snap)
	if err != nil {
		return nil, err
	}
	l := &layer{ioctx: ioctx, pool: dataPool, ns: ns, data: r.query(dataPool), prefix: lay.Prefix, objSize: int64(lay.ObjectSize)}
	if !h.HasParent || h.Overlap == 0 {
		return l, nil
	}
	if depth >= header.MaxCloneDepth {
		return nil, unrefinable{ReasonCloneDepth, fmt.Sprintf("a clone chain deeper than %d", header.MaxCloneDepth)}
	}
	ppool, err := conn.GetPoolByID(h.Parent.PoolID)
	if err != nil {
		return nil, cepherr.Wrap(fmt.Sprintf("look up parent pool %d", h.Parent.PoolID), err)
	}
	if l.parent, err = r.layer(conn, ppool, h.Parent.Namespace, h.Parent.ImageID, h.Parent.SnapID, depth+1); err != nil {
		return nil, err
	}
	l.overlap = int64(h.Overlap)
	return l, nil
}

// format1Layer describes format 1 image img, set to snapshot snap: no
// parent, no data pool, no striping.
//
// Implements (through go-ceph): rbd_stat, rados_ioctx_create,
// rados_ioctx_snap_set_read.
func (r *Refiner) format1Layer(conn *rados.Conn, pool, ns string, img *librbd.Image, snap uint64) (*layer, error) {
	st, err := img.Stat()
	if err != nil {
		return nil, cepherr.Wrap("stat image", err)
	}
	ioctx, err := r.ioctx(conn, pool, ns, snap)
	if err != nil {
		return nil, err
	}
	return &layer{ioctx: ioctx, pool: pool, ns: ns, data: r.query(pool), prefix: st.Block_name_prefix, oldFormat: true, objSize: int64(st.Obj_size)}, nil
}

// query returns the dataQuery of pool, made on first use.
func (r *Refiner) query(pool string) *dataQuery {
	if r.queries == nil {
		r.queries = map[string]*dataQuery{}
	}
	q := r.queries[pool]
	if q == nil {
		q = &dataQuery{summed: &r.summed}
		r.queries[pool] = q
	}
	return q
}

// allocated refines an allocated candidate: the data the image holds in
// it at the target snapshot, from its parents where its object is missing.
func (r *Refiner) allocated(ctx context.Context, c candidate) ([]span, error) {
	r.objects.Add(1)
	return r.top.view(ctx, c.off, c.off+c.len)
}

// view returns the allocated extents of the layer in [off, end), image
// offsets.
func (l *layer) view(ctx context.Context, off, end int64) ([]span, error) {
	var out []span
	err := l.eachObject(ctx, off, end, func(o, oe, base int64, name string) error {
		ext, err := l.data.extents(l.ioctx, name, o-base, oe-o, -1)
		if err != nil {
			return err
		}
		ext = clip(shift(ext, base), o, oe)
		if l.underParent(base) && !l.data.noMapext.Load() && spanBytes(ext) > copyUpDense {
			// Maybe copied up densely: leave its zeros out (checksums
			// already did, where the pool refuses mapext).
			if ext, err = l.withoutZeros(ctx, ext); err != nil {
				return err
			}
		}
		out = append(out, ext...)
		return nil
	}, func(o, oe int64) error {
		p, err := l.parentView(ctx, o, oe)
		out = append(out, p...)
		return err
	})
	return out, err
}

// eachObject calls own for each of the layer's objects that [off, end)
// (image offsets) meets: the part [o, oe) of the range in it, where the
// object starts, and its name. Where own finds that the object does not
// exist (radosErr(-ENOENT)), the layer reads its parent chain instead:
// eachObject calls parent for the part.
func (l *layer) eachObject(ctx context.Context, off, end int64, own func(o, oe, base int64, name string) error, parent func(o, oe int64) error) error {
	for o := off; o < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		base := o - o%l.objSize
		oe := min(end, base+l.objSize)
		err := own(o, oe, base, l.object(base/l.objSize))
		if isNoEnt(err) {
			err = parent(o, oe)
		}
		if err != nil {
			return err
		}
		o = oe
	}
	return nil
}

// parentView returns what the layer reads from its parent chain in
// [off, end), image offsets: nothing beyond the overlap.
func (l *layer) parentView(ctx context.Context, off, end int64) ([]span, error) {
	if l.parent == nil || off >= l.overlap {
		return nil, nil
	}
	return l.parent.view(ctx, off, min(end, l.overlap))
}
