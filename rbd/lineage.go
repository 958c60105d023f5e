package rbd

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/header"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"
)

// A diff reads snapshots that other clients may remove while it runs: a
// retention job, a user, Ceph-CSI's DeleteSnapshot (which removes the
// csi-snap clone and with it the source's trash snapshot). librbd removes a
// snapshot from the image header first; the OSDs then trim it out of each
// object's snap set, within a fraction of a second on SSDs. Every object
// read after the trim is judged against a snap set that no longer holds the
// snapshot: precise mode takes an object as new since a vanished base (so
// what the base had and the target dropped is lost), librados'
// calc_snap_set_diff loses what lay beyond a shrunk head, and nothing in
// the answer shows it.
//
// So a Diff records, when it opens, the lineage of each of its snapshots:
// the snapshot, then the parent snapshot that the image had at it, and so
// on up the clone chain (a clone's parent data is part of what Allocated
// and a delta's copy-up checks read). Before Iterate reports success it
// reads every lineage again, on fresh image handles (so from the headers
// as they are now, not from what an open image cached): a snapshot that
// is gone means the answer may miss changes (fs.ErrNotExist: NOT_FOUND, as
// for a snapshot that a request names and that does not exist); a parent
// link that changed (the image or a parent flattened, so that the parent's
// snapshot may be trimmed) means it may too, though asking again would
// give a right answer (errConflict: ABORTED). Snapshot IDs are never
// reused and a flatten cannot be undone, so a lineage found unchanged at
// the end held during the whole diff: one check after the last extent is
// enough.

// link is one snapshot of a lineage, named by IDs only: image names change
// (rename, trash), IDs do not.
type link struct {
	pool      string
	namespace string
	imageID   string // "" for a format 1 image (opened by name)
	image     string // name, for messages and format 1 images
	snapID    uint64
}

func (l link) String() string { return fmt.Sprintf("%s@%d", l.imageSpec(), l.snapID) }

// imageSpec names l's image: pool[/namespace]/name, or id:ID when its name
// is not known (a parent found by ID).
func (l link) imageSpec() string {
	s := l.pool + "/"
	if l.namespace != "" {
		s += l.namespace + "/"
	}
	if l.image != "" {
		return s + l.image
	}
	return s + "id:" + l.imageID
}

// lineage is a snapshot followed by its parent snapshots, nearest first.
type lineage []link

func (ln lineage) String() string {
	parts := make([]string, len(ln))
	for i, l := range ln {
		parts[i] = l.String()
	}
	return strings.Join(parts, " <- ")
}

func (ln lineage) equal(o lineage) bool {
	if len(ln) != len(o) {
		return false
	}
	for i := range ln {
		a, b := ln[i], o[i]
		if a.pool != b.pool || a.namespace != b.namespace || a.imageID != b.imageID || a.snapID != b.snapID ||
			(a.imageID == "" && a.image != b.image) {
			return false
		}
	}
	return true
}

// change describes the first link where o differs from ln.
func (ln lineage) change(o lineage) string {
	i := 0
	for i < len(ln) && i < len(o) && ln[i:i+1].equal(o[i:i+1]) {
		i++
	}
	at := func(l lineage) string {
		if i < len(l) {
			return l[i].String()
		}
		return "none"
	}
	return fmt.Sprintf("parent at depth %d was %s, now %s", i, at(ln), at(o))
}

// errConflict classifies a change that another client made to a snapshot's
// lineage while a diff read it: the answer may be wrong, and asking again
// gives a right one. The driver answers ABORTED.
type errConflict struct{ msg string }

func (e errConflict) Error() string { return e.msg }

// Aborted marks the error as a concurrent change (see driver.Source).
func (errConflict) Aborted() bool { return true }

// errVanished is a snapshot of a lineage that no longer exists.
var errVanished = errors.New("snapshot gone")

// readLineage reads the lineage of snapshot first from the cluster, each
// image on a handle of its own. A snapshot or image that does not exist
// any more is errVanished (and fs.ErrNotExist), naming which. A parent
// image that takes part in a live migration fails it with
// errors.ErrUnsupported (see refuseMigrating, which checks the image
// itself). A snapshot's chain holds every parent the head has: the parent
// is set when the image is cloned, before any snapshot, and only a
// flatten removes it, from the head first (or from both, with
// deep-flatten).
//
// Implements (through go-ceph): see parentAt.
func readLineage(conn *rados.Conn, first link) (lineage, error) {
	ln := lineage{first}
	for {
		l := ln[len(ln)-1]
		parent, features, err := parentAt(conn, l)
		if err == nil && len(ln) > 1 && features&librbd.FeatureMigrating != 0 {
			err = errMigrating(l.imageSpec())
		}
		if err != nil || parent == nil {
			return ln, err
		}
		if len(ln) > header.MaxCloneDepth {
			return ln, fmt.Errorf("snapshot %s: a clone chain deeper than %d: %w", first, header.MaxCloneDepth, errors.ErrUnsupported)
		}
		ln = append(ln, *parent)
	}
}

// parentAt checks that l's snapshot exists and returns its parent
// snapshot, nil when it has none, and the features of l's image (0 for
// format 1). A format 2 image's header is read with
// one compound RADOS read of cls_rbd's methods (get_snapcontext: every
// snapshot of the image, any namespace; parent_get and parent_overlap_get:
// the parent at that snapshot), not by opening the image, which for a
// clone opens its whole parent chain too. Format 1 images (no ID) cannot
// be clones: they are opened, to see the snapshot.
//
// Implements (through go-ceph): rados_ioctx_create, rados_read_op_exec
// (cls_rbd get_snapcontext, get_features, parent_get, parent_overlap_get); for format 1
// rbd_open_read_only, rbd_snap_set_by_id.
func parentAt(conn *rados.Conn, l link) (*link, uint64, error) {
	ioctx, err := conn.OpenIOContext(l.pool)
	if err != nil {
		if errors.Is(err, rados.ErrNotFound) {
			return nil, 0, fmt.Errorf("snapshot %s: pool removed: %w", l, errors.Join(errVanished, fs.ErrNotExist))
		}
		return nil, 0, cepherr.Wrap("open pool "+l.pool, err)
	}
	defer ioctx.Destroy()
	ioctx.SetNamespace(l.namespace)
	if l.imageID == "" {
		return nil, 0, format1SnapExists(ioctx, l)
	}
	h, err := header.Read(ioctx, l.imageID, l.snapID)
	switch {
	case errors.Is(err, rados.ErrNotFound) && !h.Read:
		return nil, 0, fmt.Errorf("snapshot %s: image removed: %w", l, errors.Join(errVanished, fs.ErrNotExist))
	case err != nil && !h.Read:
		return nil, 0, cepherr.Wrap("read the header of image "+l.String(), err)
	case !h.Snaps[l.snapID]:
		return nil, 0, fmt.Errorf("snapshot %s: removed: %w", l, errors.Join(errVanished, fs.ErrNotExist))
	case err != nil:
		return nil, 0, cepherr.Wrap("read the parent of snapshot "+l.String(), err)
	case !h.HasParent:
		return nil, h.Features, nil
	}
	pool, err := conn.GetPoolByID(h.Parent.PoolID)
	if err != nil {
		return nil, 0, cepherr.Wrap(fmt.Sprintf("name pool %d of the parent of snapshot %s", h.Parent.PoolID, l), err)
	}
	return &link{pool: pool, namespace: h.Parent.Namespace, imageID: h.Parent.ImageID, snapID: h.Parent.SnapID}, h.Features, nil
}

// format1SnapExists checks that l's snapshot of a format 1 image exists.
func format1SnapExists(ioctx *rados.IOContext, l link) error {
	img, err := librbd.OpenImageReadOnly(ioctx, l.image, librbd.NoSnapshot)
	if errors.Is(err, librbd.ErrNotFound) {
		return fmt.Errorf("snapshot %s: image removed: %w", l, errors.Join(errVanished, fs.ErrNotExist))
	}
	if err != nil {
		return cepherr.Wrap("open image of snapshot "+l.String(), err)
	}
	defer img.Close()
	if err := img.SetSnapByID(l.snapID); errors.Is(err, librbd.ErrNotFound) {
		return fmt.Errorf("snapshot %s: removed: %w", l, errors.Join(errVanished, fs.ErrNotExist))
	} else if err != nil {
		return cepherr.Wrap("set image to snapshot "+l.String(), err)
	}
	return nil
}

// recordLineages reads the lineages of the Diff's snapshots, once they are
// looked up (see confirmLineages).
func (d *Diff) recordLineages() error {
	first := link{image: d.target.image}
	old, err := d.image.IsOldFormat()
	if err != nil {
		return cepherr.Wrap("get format of image "+d.target.imageSpec(), err)
	}
	if !old { // format 1 images have no ID, and are opened by name
		if first.imageID, err = d.image.GetId(); err != nil {
			return cepherr.Wrap("get id of image "+d.target.imageSpec(), err)
		}
	}
	d.lineages = d.lineages[:0]
	for _, r := range d.snaps() {
		first.pool, first.namespace, first.snapID = r.pool, r.namespace, r.snapID
		ln, err := readLineage(d.cc.Rados(), first)
		if err != nil {
			return err
		}
		d.lineages = append(d.lineages, ln)
	}
	return nil
}

// snaps returns the Diff's snapshots: the target, then the base if any.
func (d *Diff) snaps() []*snapRef {
	if d.base == nil {
		return []*snapRef{&d.target}
	}
	return []*snapRef{&d.target, d.base}
}

// confirmLineages checks that the lineages recorded when the Diff opened
// still hold (see the comment above link), so that a diff that ran to its
// end may report success.
func (d *Diff) confirmLineages() error {
	for i, r := range d.snaps() {
		want := d.lineages[i]
		what := "target"
		if r != &d.target {
			what = "base"
		}
		got, err := readLineage(d.cc.Rados(), want[0])
		if errors.Is(err, errVanished) {
			// The snapshot itself went (got ends where the read failed),
			// or one of its parents. The message names the snapshot as
			// the request did.
			if len(got) == 1 {
				return fmt.Errorf("%s snapshot %s was removed while its changes were being listed, so the answer may miss changes (%v): %w",
					what, r, err, fs.ErrNotExist)
			}
			return errConflict{fmt.Sprintf("a parent snapshot of the %s snapshot %s was removed while its changes were being listed, so the answer may miss changes: ask again (%v)",
				what, r, err)}
		}
		if err != nil {
			return fmt.Errorf("check that the %s snapshot %s still exists: %w", what, r, err)
		}
		if !got.equal(want) {
			return errConflict{fmt.Sprintf("the %s snapshot %s changed while its changes were being listed (%s; flattened?), so the answer may miss changes: ask again",
				what, r, want.change(got))}
		}
	}
	return nil
}

// Lineage names the snapshots the Diff reads, and their parent snapshots,
// by ID, as they were when it opened. Two Diffs of the same request read
// the same data if and only if their Lineages are equal: a caller that
// opens the snapshots again (to resume a stream) compares them, since a
// parent that changed in between may have made what was read before
// wrong.
func (d *Diff) Lineage() string {
	parts := make([]string, len(d.lineages))
	for i, ln := range d.lineages {
		parts[i] = ln.String()
	}
	return strings.Join(parts, "; ")
}
