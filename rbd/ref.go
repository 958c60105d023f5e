package rbd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ceph/go-ceph/rados"
)

// reference is a snapshot ID decoded as far as possible without talking to
// the cluster: it names its cluster ID, and once connected it resolves to a
// snapRef. Native IDs (ID) resolve without any I/O. Ceph-CSI snapshot
// handles (0001-LLLL-<clusterID>-<poolID>-<uuid>) will resolve through the
// omap journal of their pool, and may name the image by ID and the
// snapshot by ID (a trash snapshot has no usable name).
type reference interface {
	clusterID() string
	// resolve locates the snapshot; conn returns the cluster connection,
	// connecting on first use, for references that need to read the pool.
	resolve(cl Cluster, conn func() (*rados.Conn, error)) (snapRef, error)
}

// parseReference decodes a snapshot ID of any supported form: a native ID
// always contains '/' and '@', a Ceph-CSI handle never does. A malformed ID
// is an fs.ErrInvalid error.
func parseReference(s string) (reference, error) {
	if strings.ContainsAny(s, "/@") {
		id, err := ParseID(s)
		if err != nil {
			return nil, err
		}
		return id, nil
	}
	h, err := ParseHandle(s)
	if err != nil {
		return nil, fmt.Errorf("not a native ID <clusterID>/<pool>[/<namespace>]/<image>@<snapshot> (no '/' or '@'), nor a Ceph-CSI handle: %w", err)
	}
	return h, nil
}

// snapRef locates one snapshot in a cluster. Open works only with snapRefs,
// whatever the form of the caller's ID.
type snapRef struct {
	pool      string // pool name
	namespace string // RADOS namespace, "" for the default one
	image     string // image name, for messages; empty when only imageID is known
	imageID   string // image ID; when set, the image is opened by ID
	snapName  string // empty when only snapID is known
	snapID    uint64 // 0 until looked up by snapName

	// flattened marks a Ceph-CSI snapshot whose clone image was flattened:
	// the ref names the clone's own snapshot, which shares no history with
	// the source volume's snapshots.
	flattened bool
}

// sameImage reports whether two snapshots belong to the same image: by ID
// when both IDs are known (a handle's source image may have been renamed
// or moved to the trash since), else by name.
func (r snapRef) sameImage(o snapRef) bool {
	if r.pool != o.pool || r.namespace != o.namespace {
		return false
	}
	if r.imageID != "" && o.imageID != "" {
		return r.imageID == o.imageID
	}
	return r.image != "" && r.image == o.image
}

// imageSpec names the image for messages: pool[/namespace]/image, or
// pool[/namespace]/id:ID when the name is unknown and only the image's ID
// is known.
func (r snapRef) imageSpec() string {
	s := r.pool + "/"
	if r.namespace != "" {
		s += r.namespace + "/"
	}
	if r.image != "" {
		return s + r.image
	}
	return s + "id:" + r.imageID
}

// String names the snapshot for messages: pool[/namespace]/image@snap.
func (r snapRef) String() string {
	if r.snapName != "" {
		return r.imageSpec() + "@" + r.snapName
	}
	return r.imageSpec() + "@id:" + strconv.FormatUint(r.snapID, 10)
}

func (id ID) clusterID() string { return id.Cluster }

// resolve applies the cluster's RADOS namespace unless the ID names one.
func (id ID) resolve(cl Cluster, _ func() (*rados.Conn, error)) (snapRef, error) {
	ns := id.Namespace
	if ns == "" {
		ns = cl.RadosNamespace
	}
	return snapRef{pool: id.Pool, namespace: ns, image: id.Image, snapName: id.Snapshot}, nil
}
