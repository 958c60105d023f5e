// Package rbd reads the changed and allocated extents of Ceph RBD snapshots
// with librbd, for the CSI SnapshotMetadata service.
//
// A Source opens a pair of snapshots (Request) and returns a Diff: the
// target snapshot's allocated extents when there is no base, otherwise the
// extents that changed from the base to the target. rbddriver
// adapts Source and Diff to the driver package's interfaces; this package
// imports neither the driver nor gRPC (layout_test.go checks), and it does
// not log.
//
// # Snapshot IDs
//
// A snapshot ID is either native, <clusterID>/<pool>[/<radosNamespace>]/<image>@<snapshot>
// (see ParseID), or a Ceph-CSI snapshot handle,
// 0001-LLLL-<clusterID>-<poolID>-<uuid> (see ParseHandle), as the sidecar
// sends it. Native IDs always contain '/' and '@', handles never do. The
// cluster ID selects an entry of Ceph-CSI's cluster config file
// (ParseConfig), which gives the monitors and the RADOS namespace. IDs
// decode to a reference, which resolves to a snapRef once the cluster is
// connected; Open works only with snapRefs.
//
// A handle resolves through Ceph-CSI's journal: the omap object
// csi.snap.<uuid> in the pool with that ID, in the cluster's namespace,
// names the snapshot's clone image csi-snap-<uuid>. Ceph-CSI took a
// snapshot of the source volume, cloned it and deleted it, so the clone's
// parent, a snapshot in the source's trash namespace reachable only by ID,
// holds what the snapshot captured: allocated blocks are read there (with
// the source's own parents), and a delta between two handles is a diff by
// snapshot ID on the source image (rbd_diff_iterate3, Ceph reef 18.2+;
// without it, errors.ErrUnsupported). Once Ceph-CSI has flattened the clone
// it has no parent: its allocated blocks are read from the clone's own
// snapshot, and a delta with it is errors.ErrUnsupported (a full backup is
// needed). Handles and native IDs of the same image can be mixed.
//
// # Encrypted volumes
//
// For an image that Ceph-CSI marks block-encrypted (image metadata
// rbd.csi.ceph.com/encrypted), offsets and capacity are the user's: the
// LUKS header (its size read from the LUKS1/LUKS2 header in the snapshot,
// else from rbd.csi.ceph.com/luks2HeaderSize, else Ceph-CSI's 16 MiB) is
// cut off, extents are shifted by it, and changes inside it are not
// reported.
//
// # Connections
//
// Cluster connections are cached per monitor set, cephx user and key (by
// its SHA-256), shared by concurrent Diffs, and shut down after an idle
// time (Options.IdleTimeout) or on Source.Close. None serves a new request
// past Options.MaxConnAge, the bound on how long a revoked key keeps
// working; a Diff that fails with a timeout or another temporary error
// discards its connection, so that the next Open connects anew.
// Credentials come from the request's secrets userID and userKey. librados
// is configured without files: mon_host, key, keyring=/dev/null and
// bounded timeouts (client_mount_timeout, rados_mon_op_timeout,
// rados_osd_op_timeout). internal/conn holds the cache, connect and the
// probing of monitor addresses; its package comment tells the whole story.
//
// # Errors
//
// Every error says what was being done ("open image rbd/vol: no such file
// or directory") and never contains a key. Errors are classified by
// wrapping the standard sentinels (internal/cepherr maps librados' and
// librbd's errnos to them), tested with errors.Is:
//
//	fs.ErrNotExist          cluster ID, pool, namespace, image or snapshot unknown;
//	                        a handle that names a volume or nothing; from
//	                        Iterate, a snapshot removed while it ran
//	Aborted() bool          an error with this method (returning true): a
//	                        parent link of a snapshot changed while Iterate ran
//	fs.ErrInvalid           malformed ID, secrets missing, base not older than
//	                        target, snapshots of different volumes, bad offset
//	fs.ErrPermission        the cephx user lacks caps; a refused login (wrong
//	                        key, unknown user) is also an error whose
//	                        Unauthenticated method returns true
//	errors.ErrUnsupported   librbd cannot do this diff (rbd_diff_iterate3 needed);
//	                        a delta with a flattened Ceph-CSI snapshot; an image
//	                        under live migration, or a clone of one
//	os.ErrDeadlineExceeded  the monitors are unreachable or give no session in
//	                        time (no quorum, hung), or librados timed out
//	cepherr.ErrUnavailable  an OSD could not load an object class (EOPNOTSUPP);
//	                        its Temporary method returns true
//
// The driver gives each class its gRPC code: docs/errors.md has the table.
//
// Errors that go away by themselves (timeouts, connections reset or shut
// down, EAGAIN, EOPNOTSUPP) have a Temporary method that returns true, and
// a Reason for the driver's resume metric. Context errors and the errors
// of Iterate's callback are returned as they are. Anything else is
// unclassified (an internal error), including a missing or broken cluster
// config file.
//
// # Iteration
//
// Diff.Iterate reads the extents from an offset to the end of the
// snapshot. Without precise mode it runs one scan (one librbd
// diff-iterate) per call (a delta by snapshot ID that librbd refuses
// before calling back, for want of rbd_diff_iterate3, runs again by the
// base's name). Precise mode (package precise) asks for scans in whole
// objects through its ObjectScanner interface instead: one, or two for a
// delta by existence (the objects of the base, then of the target);
// without a usable object map (and unless Options.Walk is WalkLibrbd) it
// lists or probes the image's objects through librados and asks for none.
// Every librbd callback goes through Diff.scan (scan.go): librbd calls
// back on the calling thread and blocking there is safe, so the caller's
// emit may apply backpressure; to stop early the callback returns a
// negative errno to librbd and keeps the reason, which Iterate returns in
// preference to librbd's error; callbacks that still arrive are ignored; a
// panic is raised again once librbd returned.
package rbd
