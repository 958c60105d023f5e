package rbd

import (
	"fmt"
	"io/fs"
	"strings"
)

// ID is a snapshot named natively:
//
//	<clusterID>/<pool>/<image>@<snapshot>
//	<clusterID>/<pool>/<radosNamespace>/<image>@<snapshot>
//
// The cluster ID selects an entry of Ceph-CSI's cluster config. Without a
// namespace in the ID, the snapshot lives in that entry's radosNamespace; a
// namespace in the ID overrides it (there is no way to name the default
// namespace of a cluster ID whose entry sets one).
type ID struct {
	Cluster   string
	Pool      string
	Namespace string // empty: the cluster config's radosNamespace
	Image     string
	Snapshot  string
}

// ParseID parses a native snapshot ID. Every component must be non-empty and
// free of '/', '@' and NUL (as in the rbd CLI's image specs). A malformed ID
// is an fs.ErrInvalid error quoting the ID.
func ParseID(s string) (ID, error) {
	bad := func(why string) (ID, error) {
		return ID{}, fmt.Errorf("snapshot ID %q: %s, want <clusterID>/<pool>[/<namespace>]/<image>@<snapshot>: %w",
			s, why, fs.ErrInvalid)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return bad("contains a NUL byte")
	}
	path, snap, ok := strings.Cut(s, "@")
	if !ok {
		return bad("no @<snapshot>")
	}
	if strings.ContainsAny(snap, "@/") {
		return bad("snapshot name contains '@' or '/'")
	}
	if snap == "" {
		return bad("empty snapshot name")
	}
	parts := strings.Split(path, "/")
	for _, p := range parts {
		if p == "" {
			return bad("empty component")
		}
	}
	switch len(parts) {
	case 3:
		return ID{Cluster: parts[0], Pool: parts[1], Image: parts[2], Snapshot: snap}, nil
	case 4:
		return ID{Cluster: parts[0], Pool: parts[1], Namespace: parts[2], Image: parts[3], Snapshot: snap}, nil
	}
	return bad(fmt.Sprintf("%d components before '@'", len(parts)))
}

// String returns the ID in the form ParseID reads.
func (id ID) String() string {
	if id.Namespace == "" {
		return id.Cluster + "/" + id.Pool + "/" + id.Image + "@" + id.Snapshot
	}
	return id.Cluster + "/" + id.Pool + "/" + id.Namespace + "/" + id.Image + "@" + id.Snapshot
}
