package rbd

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ceph/go-ceph/rados"
)

// header is what readHeader found in a format 2 image's header object.
type header struct {
	read      bool            // the snapshot list was read: the header exists
	snaps     map[uint64]bool // every snapshot of the image, any namespace
	hasParent bool            // snapshot snap has a parent
	parent    parentSpec      // its parent, when hasParent
	features  uint64          // the image's features (librbd.Feature*)
}

// noSnap is CEPH_NOSNAP: readHeader's snap for the image's head.
const noSnap = 1<<64 - 2

// parentSpec is cls::rbd::ParentImageSpec.
type parentSpec struct {
	poolID    int64
	namespace string
	imageID   string
	snapID    uint64
}

// readHeader reads, in one compound read of rbd_header.<imageID>, the
// image's snapshot IDs (cls_rbd get_snapcontext), its features
// (get_features), its parent (parent_get) and whether snapshot snap (noSnap:
// the head) has one (parent_overlap_get: none without layering or once
// flattened). parent_overlap_get fails with ENOENT for a
// snapshot that does not exist; the snapshot list is then read alone, so
// that h.read tells a missing image from a missing snapshot.
func readHeader(ioctx *rados.IOContext, imageID string, snap uint64) (header, error) {
	oid := "rbd_header." + imageID
	op := rados.CreateReadOp()
	defer op.Release()
	sc := op.Exec("rbd", "get_snapcontext", nil)
	gf := op.Exec("rbd", "get_features", binary.LittleEndian.AppendUint64(nil, noSnap))
	pg := op.Exec("rbd", "parent_get", nil)
	po := op.Exec("rbd", "parent_overlap_get", binary.LittleEndian.AppendUint64(nil, snap))
	err := opError(op.Operate(ioctx, oid, rados.OperationNoFlag))
	if err != nil {
		if !errors.Is(err, rados.ErrNotFound) {
			return header{}, err
		}
		// Which is missing: the image, or the snapshot?
		op2 := rados.CreateReadOp()
		defer op2.Release()
		sc2 := op2.Exec("rbd", "get_snapcontext", nil)
		if err2 := opError(op2.Operate(ioctx, oid, rados.OperationNoFlag)); err2 != nil {
			return header{}, err2
		}
		h, derr := snapContext(sc2)
		if derr != nil {
			return header{}, derr
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
	h.features = binary.LittleEndian.Uint64(b)
	if b, err = po.Bytes(); err != nil {
		return h, err
	}
	// std::optional<uint64_t>: a bool, then the value when set.
	if len(b) < 1 {
		return h, fmt.Errorf("parent_overlap_get: %d bytes", len(b))
	}
	if b[0] == 0 {
		return h, nil
	}
	if b, err = pg.Bytes(); err != nil {
		return h, err
	}
	if h.parent, err = decodeParentSpec(b); err != nil {
		return h, err
	}
	h.hasParent = h.parent.poolID >= 0
	return h, nil
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
func snapContext(step *rados.ReadOpExecStep) (header, error) {
	b, err := step.Bytes()
	if err != nil {
		return header{}, err
	}
	d := decoder{b: b}
	d.u64() // snap_seq
	n := d.u32()
	h := header{read: true, snaps: map[uint64]bool{}}
	for i := uint32(0); i < n && d.err == nil; i++ {
		h.snaps[d.u64()] = true
	}
	if d.err != nil {
		return header{}, fmt.Errorf("get_snapcontext: %w", d.err)
	}
	return h, nil
}

// decodeParentSpec decodes cls::rbd::ParentImageSpec: a versioned struct
// (u8 version, u8 compat, u32 length) of pool ID (i64), pool namespace,
// image ID (strings: u32 length and bytes) and snapshot ID (u64).
func decodeParentSpec(b []byte) (parentSpec, error) {
	d := decoder{b: b}
	d.u8()
	d.u8()
	n := d.u32()
	if d.err == nil && int(n) > len(d.b) {
		d.err = fmt.Errorf("struct of %d bytes in %d", n, len(d.b))
	}
	p := parentSpec{poolID: int64(d.u64()), namespace: d.str(), imageID: d.str(), snapID: d.u64()}
	if d.err != nil {
		return parentSpec{}, fmt.Errorf("parent_get: %w", d.err)
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
