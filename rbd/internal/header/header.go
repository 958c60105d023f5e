// Package header reads what librbd keeps in a format 2 image's header
// object (rbd_header.<image id>) with cls_rbd's methods, in compound
// RADOS reads, without opening the image: opening a clone opens its whole
// parent chain too, so walking a chain of d images by opening each costs
// about d²/2 opens, and reading the headers d reads. Both the lineage
// check (package rbd) and precise mode's layers (rbd/precise) walk clone
// chains this way, to the one depth limit MaxCloneDepth.
package header

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"
)

// MaxCloneDepth bounds the clone chains that are walked: a chain with more
// parents than this is refused. Far deeper than any real one: Ceph-CSI
// flattens at 8 (--rbdhardmaxclonedepth), and librbd sets no limit.
const MaxCloneDepth = 64

// Header is what Read found in a format 2 image's header object.
type Header struct {
	Read      bool            // the snapshot list was read: the header exists
	Snaps     map[uint64]bool // every snapshot of the image, any namespace
	HasParent bool            // snapshot snap has a parent
	Parent    Spec            // its parent, when HasParent
	Overlap   uint64          // the bytes of the image that its parent backs at snap, when HasParent
	Features  uint64          // the image's features (librbd.Feature*)
}

// NoSnap is CEPH_NOSNAP: Read's snap for the image's head.
const NoSnap = 1<<64 - 2

// Spec is cls::rbd::ParentImageSpec.
type Spec struct {
	PoolID    int64
	Namespace string
	ImageID   string
	SnapID    uint64
}

// Read reads, in one compound read of rbd_header.<imageID>, the
// image's snapshot IDs (cls_rbd get_snapcontext), its features
// (get_features), its parent (parent_get) and whether snapshot snap (NoSnap:
// the head) has one, over how many bytes (parent_overlap_get: none without
// layering or once flattened). parent_overlap_get fails with ENOENT for a
// snapshot that does not exist; the snapshot list is then read alone, so
// that h.Read tells a missing image from a missing snapshot.
func Read(ioctx *rados.IOContext, imageID string, snap uint64) (Header, error) {
	oid := "rbd_header." + imageID
	op := rados.CreateReadOp()
	defer op.Release()
	sc := op.Exec("rbd", "get_snapcontext", nil)
	gf := op.Exec("rbd", "get_features", binary.LittleEndian.AppendUint64(nil, NoSnap))
	pg := op.Exec("rbd", "parent_get", nil)
	po := op.Exec("rbd", "parent_overlap_get", binary.LittleEndian.AppendUint64(nil, snap))
	err := opError(op.Operate(ioctx, oid, rados.OperationNoFlag))
	if err != nil {
		if !errors.Is(err, rados.ErrNotFound) {
			return Header{}, err
		}
		// Which is missing: the image, or the snapshot?
		op2 := rados.CreateReadOp()
		defer op2.Release()
		sc2 := op2.Exec("rbd", "get_snapcontext", nil)
		if err2 := opError(op2.Operate(ioctx, oid, rados.OperationNoFlag)); err2 != nil {
			return Header{}, err2
		}
		h, derr := snapContext(sc2)
		if derr != nil {
			return Header{}, derr
		}
		return h, err
	}
	h, err := snapContext(sc)
	if err != nil {
		return h, err
	}
	// features (u64), then the incompatible ones (u64).
	b, err := gf.Bytes()
	if err != nil {
		return h, err
	}
	if len(b) < 8 {
		return h, fmt.Errorf("get_features: %d bytes", len(b))
	}
	h.Features = binary.LittleEndian.Uint64(b)
	if b, err = po.Bytes(); err != nil {
		return h, err
	}
	// std::optional<uint64_t>: a bool, then the value when set.
	d := decoder{b: b}
	if d.u8() == 0 {
		if d.err != nil {
			return h, fmt.Errorf("parent_overlap_get: %w", d.err)
		}
		return h, nil
	}
	if h.Overlap = d.u64(); d.err != nil {
		return h, fmt.Errorf("parent_overlap_get: %w", d.err)
	}
	if b, err = pg.Bytes(); err != nil {
		return h, err
	}
	if h.Parent, err = decodeParentSpec(b); err != nil {
		return h, err
	}
	h.HasParent = h.Parent.PoolID >= 0
	return h, nil
}

// Layout is how a format 2 image lays its data out at a snapshot.
type Layout struct {
	ObjectSize  uint64 // 1 << order
	Prefix      string // the block name prefix that names the data objects
	StripeUnit  uint64
	StripeCount uint64
	DataPoolID  int64 // -1: the data objects are in the image's own pool
}

// ReadLayout reads the layout of image imageID at snapshot snap (NoSnap:
// the head), whose features Read returned: get_size (order and size),
// get_object_prefix, and, as the features say they are set,
// get_stripe_unit_count (which fails without striping v2: one object per
// stripe then) and get_data_pool, in one compound read.
func ReadLayout(ioctx *rados.IOContext, imageID string, snap, features uint64) (Layout, error) {
	op := rados.CreateReadOp()
	defer op.Release()
	gs := op.Exec("rbd", "get_size", binary.LittleEndian.AppendUint64(nil, snap))
	gp := op.Exec("rbd", "get_object_prefix", nil)
	var st, dp *rados.ReadOpExecStep
	if features&librbd.FeatureStripingV2 != 0 {
		st = op.Exec("rbd", "get_stripe_unit_count", nil)
	}
	if features&librbd.FeatureDataPool != 0 {
		dp = op.Exec("rbd", "get_data_pool", nil)
	}
	if err := opError(op.Operate(ioctx, "rbd_header."+imageID, rados.OperationNoFlag)); err != nil {
		return Layout{}, err
	}
	var l Layout
	// get_size: order (u8), size (u64).
	b, err := gs.Bytes()
	if err != nil {
		return l, err
	}
	d := decoder{b: b}
	order := d.u8()
	d.u64() // the size
	if d.err == nil && order > 63 {
		d.err = fmt.Errorf("order %d", order)
	}
	if d.err != nil {
		return Layout{}, fmt.Errorf("get_size: %w", d.err)
	}
	l.ObjectSize = 1 << order
	if b, err = gp.Bytes(); err != nil {
		return Layout{}, err
	}
	d = decoder{b: b}
	if l.Prefix = d.str(); d.err != nil {
		return Layout{}, fmt.Errorf("get_object_prefix: %w", d.err)
	}
	l.StripeUnit, l.StripeCount, l.DataPoolID = l.ObjectSize, 1, -1
	if st != nil {
		if b, err = st.Bytes(); err != nil {
			return Layout{}, err
		}
		d = decoder{b: b}
		if l.StripeUnit, l.StripeCount = d.u64(), d.u64(); d.err != nil {
			return Layout{}, fmt.Errorf("get_stripe_unit_count: %w", d.err)
		}
	}
	if dp != nil {
		if b, err = dp.Bytes(); err != nil {
			return Layout{}, err
		}
		d = decoder{b: b}
		if l.DataPoolID = int64(d.u64()); d.err != nil {
			return Layout{}, fmt.Errorf("get_data_pool: %w", d.err)
		}
	}
	return l, nil
}

// opError returns the error of a compound operation as a whole: go-ceph's
// OperationError carries it (and each step's) without unwrapping to it.
func opError(err error) error {
	var oe rados.OperationError
	if errors.As(err, &oe) && oe.OpError != nil {
		return oe.OpError
	}
	return err
}

// snapContext decodes get_snapcontext's answer: the snap_seq (u64), then
// the snapshot IDs (u32 count, u64 each).
func snapContext(step *rados.ReadOpExecStep) (Header, error) {
	b, err := step.Bytes()
	if err != nil {
		return Header{}, err
	}
	d := decoder{b: b}
	d.u64() // snap_seq
	n := d.u32()
	h := Header{Read: true, Snaps: map[uint64]bool{}}
	for i := uint32(0); i < n && d.err == nil; i++ {
		h.Snaps[d.u64()] = true
	}
	if d.err != nil {
		return Header{}, fmt.Errorf("get_snapcontext: %w", d.err)
	}
	return h, nil
}

// decodeParentSpec decodes cls::rbd::ParentImageSpec: a versioned struct
// (u8 version, u8 compat, u32 length) of pool ID (i64), pool namespace,
// image ID (strings: u32 length and bytes) and snapshot ID (u64).
func decodeParentSpec(b []byte) (Spec, error) {
	d := decoder{b: b}
	d.u8()
	d.u8()
	n := d.u32()
	if d.err == nil && int(n) > len(d.b) {
		d.err = fmt.Errorf("struct of %d bytes in %d", n, len(d.b))
	}
	p := Spec{PoolID: int64(d.u64()), Namespace: d.str(), ImageID: d.str(), SnapID: d.u64()}
	if d.err != nil {
		return Spec{}, fmt.Errorf("parent_get: %w", d.err)
	}
	return p, nil
}

// decoder reads Ceph's little-endian encoding; the first short read sets
// err and makes every later read return zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("short answer: want %d more bytes, have %d", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) str() string {
	n := d.u32()
	if int(n) > len(d.b) {
		d.take(int(n))
		return ""
	}
	return string(d.take(int(n)))
}
