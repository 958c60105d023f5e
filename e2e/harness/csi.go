//go:build e2e

package harness

// Fixtures that lay out volumes and snapshots exactly as Ceph-CSI's RBD
// controller does (internal/rbd, internal/journal; observed facts in
// /work/shared/ceph-csi-layout.md):
//
//   - a volume is an image csi-vol-<uuid> with Ceph-CSI's usual features,
//     recorded in the journal objects csi.volumes.default and
//     csi.volume.<uuid>;
//   - a snapshot is a temporary snapshot csi-snap-<uuid> on the volume,
//     cloned (format 2, layering and deep-flatten only) into the image
//     csi-snap-<uuid>, which gets its own snapshot csi-snap-<uuid>; the
//     temporary snapshot is then removed, so it lives on in the volume's
//     trash snapshot namespace; recorded in csi.snaps.default and
//     csi.snap.<uuid>;
//   - a volume restored from a snapshot is a format 2 clone of
//     csi-snap-<uuid>@csi-snap-<uuid>;
//   - an encrypted volume (encrypted=true, encryptionType=block) carries the
//     image metadata rbd.csi.ceph.com/encrypted and /dek, the journal keys
//     csi.volume.encryptKMS and csi.volume.encryptionType, and a LUKS2
//     header made by cryptsetup with Ceph-CSI's options at offset 0.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

const (
	// CSISnapFeatures are the features of a snapshot's clone image.
	CSISnapFeatures = rbd.FeatureLayering | rbd.FeatureDeepFlatten
	// CSILuksHeader is Ceph-CSI's LUKS2 header: 2 × 4 MiB metadata plus
	// 8 MiB of keyslots (internal/util/cryptsetup).
	CSILuksHeader = 16 * MiB
	CSIBlock      = 4096 // the oracle's block size
)

// CSICluster is one cluster ID of csi-config.json: the pool and the RADOS
// namespace its volumes live in, seen through an admin connection.
type CSICluster struct {
	ID     string
	ns     string
	PoolID int64
	conn   *rados.Conn
	IOCtx  *rados.IOContext
}

// NewCSICluster lays out volumes and snapshots for Ceph-CSI's cluster ID
// id (a key of csi-config.json: ClusterID or ClusterIDNS), in the test
// pool and the RADOS namespace ns.
func NewCSICluster(t *testing.T, conn *rados.Conn, id, ns string) *CSICluster {
	t.Helper()
	poolID, err := conn.GetPoolByName(Pool)
	if err != nil {
		t.Fatalf("pool ID of %s: %v", Pool, err)
	}
	return &CSICluster{ID: id, ns: ns, PoolID: poolID, conn: conn, IOCtx: OpenIOContext(t, conn, Pool, ns)}
}

// Handle composes a Ceph-CSI handle as internal/util/volid.go does.
func (c *CSICluster) Handle(uuid string) string {
	return fmt.Sprintf("0001-%04x-%s-%016x-%s", len(c.ID), c.ID, c.PoolID, uuid)
}

// nativeID names a user snapshot of an image natively.
func (c *CSICluster) nativeID(image, snap string) string {
	return c.ID + "/" + Pool + "/" + image + "@" + snap
}

// CSIUUID returns a random version 4 UUID, as Ceph-CSI names volumes and
// snapshots.
func CSIUUID(t testing.TB) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// setOmap writes journal keys, and removes the object when the test ends
// (the directory objects only lose their key).
func (c *CSICluster) setOmap(t *testing.T, oid string, kv map[string]string, removeObject bool) {
	t.Helper()
	pairs := make(map[string][]byte, len(kv))
	keys := make([]string, 0, len(kv))
	for k, v := range kv {
		pairs[k] = []byte(v)
		keys = append(keys, k)
	}
	if err := c.IOCtx.SetOmap(oid, pairs); err != nil {
		t.Fatalf("set omap of %s: %v", oid, err)
	}
	t.Cleanup(func() {
		var err error
		if removeObject {
			err = c.IOCtx.Delete(oid)
		} else {
			err = c.IOCtx.RmOmapKeys(oid, keys)
		}
		if err != nil && !errors.Is(err, rados.ErrNotFound) {
			t.Errorf("cleanup: journal object %s: %v", oid, err)
		}
	})
}

// OpenImage opens the image name of the cluster's pool and namespace
// until the test ends.
func (c *CSICluster) OpenImage(t *testing.T, name string) *rbd.Image {
	t.Helper()
	img, err := rbd.OpenImage(c.IOCtx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return img
}

// CSIImageID returns img's image ID.
func CSIImageID(t *testing.T, img *rbd.Image) string {
	t.Helper()
	id, err := img.GetId()
	if err != nil {
		t.Fatalf("ID of %s: %v", img.GetName(), err)
	}
	return id
}

// CSIVolume is a Ceph-CSI volume. Header is the LUKS header size of an
// encrypted volume (0 otherwise): user offset x is image offset Header+x.
// Writes logs every write and discard, in image offsets, so that tests can
// bound which objects a delta may report.
type CSIVolume struct {
	C      *CSICluster
	uuid   string
	Name   string
	Img    *rbd.Image
	Header uint64
	Writes [][2]uint64
}

// Handle is the volume's Ceph-CSI handle (its VolumeHandle).
func (v *CSIVolume) Handle() string { return v.C.Handle(v.uuid) }

// journalVolume records a volume as Ceph-CSI's CreateVolume does.
func (c *CSICluster) journalVolume(t *testing.T, v *CSIVolume, encrypted bool) {
	t.Helper()
	req := "pvc-" + CSIUUID(t)
	c.setOmap(t, "csi.volumes.default", map[string]string{"csi.volume." + req: v.uuid}, false)
	kv := map[string]string{"csi.imagename": v.Name, "csi.volname": req, "csi.imageid": CSIImageID(t, v.Img)}
	if encrypted {
		kv["csi.volume.encryptKMS"] = "default"
		kv["csi.volume.encryptionType"] = "block"
	}
	c.setOmap(t, "csi.volume."+v.uuid, kv, true)
}

// CSILuks describes the LUKS2 header of an encrypted volume.
type CSILuks struct {
	Header uint64 // its data offset: CSILuksHeader, or else made with --offset
	// Meta records the header size in the image metadata, as Ceph-CSI 3.15+
	// does (rbd.csi.ceph.com/luks2HeaderSize).
	Meta bool
}

// CreateVolume makes an empty volume of size user bytes. An encrypted one
// (luks not nil) gets a LUKS2 header made by cryptsetup with Ceph-CSI's
// options, and its image is bigger by the header.
func (c *CSICluster) CreateVolume(t *testing.T, size uint64, luks *CSILuks) *CSIVolume {
	t.Helper()
	uuid := CSIUUID(t)
	v := &CSIVolume{C: c, uuid: uuid, Name: "csi-vol-" + uuid}
	encrypted := luks != nil
	if encrypted {
		v.Header = luks.Header
	}
	if err := rbd.CreateImage(c.IOCtx, v.Name, size+v.Header, ImageOptions(t, false)); err != nil {
		t.Fatalf("create %s: %v", v.Name, err)
	}
	RemoveImageOnCleanup(t, c.IOCtx, v.Name)
	v.Img = c.OpenImage(t, v.Name)
	c.journalVolume(t, v, encrypted)
	if encrypted {
		meta := map[string]string{"rbd.csi.ceph.com/encrypted": "encrypted", "rbd.csi.ceph.com/dek": CSIDEK(t)}
		if luks.Meta {
			meta["rbd.csi.ceph.com/luks2HeaderSize"] = fmt.Sprint(v.Header)
		}
		CSISetMetadata(t, v.Img, meta)
		hdr := CSILuksFormat(t, v.Header)
		if n, err := v.Img.WriteAt(hdr, 0); err != nil || n != len(hdr) {
			t.Fatalf("write LUKS header to %s: %d, %v", v.Name, n, err)
		}
		v.Writes = append(v.Writes, [2]uint64{0, uint64(len(hdr))})
	}
	return v
}

// CSIDEK returns a random data encryption key, base64 as Ceph-CSI keeps it
// in the image metadata rbd.csi.ceph.com/dek.
func CSIDEK(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// CSISetMetadata sets the image metadata kv on img.
func CSISetMetadata(t *testing.T, img *rbd.Image, kv map[string]string) {
	t.Helper()
	for k, val := range kv {
		if err := img.SetMetadata(k, val); err != nil {
			t.Fatalf("set metadata %s of %s: %v", k, img.GetName(), err)
		}
	}
}

// CSILuksFormat formats a scratch file as Ceph-CSI's node plugin formats a
// volume (cryptsetup luksFormat --type luks2 --hash sha256
// --luks2-metadata-size 4096k --luks2-keyslots-size 8192k, plus a cheap
// PBKDF) and returns its header: the first 16 MiB. Another header size
// is made with --offset and smaller keyslots.
func CSILuksFormat(t *testing.T, header uint64) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), "luks")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f, int64(header+4*MiB)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := []string{"-q", "luksFormat", "--type", "luks2", "--hash", "sha256"}
	if header == CSILuksHeader {
		args = append(args, "--luks2-metadata-size", "4096k", "--luks2-keyslots-size", "8192k")
	} else { // 2 × 16 KiB of metadata, keyslots up to the offset
		args = append(args, "--luks2-metadata-size", "16k", "--luks2-keyslots-size", fmt.Sprintf("%dk", (header-32<<10)>>10),
			"--offset", fmt.Sprint(header/512))
	}
	args = append(args, "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", f, "-d", "-")
	cmd := exec.CommandContext(ctx, "cryptsetup", args...)
	cmd.Stdin = bytes.NewReader([]byte("not-a-secret-passphrase"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cryptsetup luksFormat: %v\n%s", err, out)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b[:header]
}

// Write puts a pattern at user offset off (after the header), unique per
// call, so that overwrites change the data.
func (v *CSIVolume) Write(t *testing.T, off, length uint64) {
	t.Helper()
	v.WriteRaw(t, v.Header+off, length)
}

var csiPattern byte

// WriteRaw writes length bytes at the image offset off (LUKS header
// included), a pattern that differs at every call, and logs it in Writes.
func (v *CSIVolume) WriteRaw(t *testing.T, off, length uint64) {
	t.Helper()
	csiPattern++
	data := bytes.Repeat([]byte{csiPattern | 1, byte(off >> 12), byte(off >> 20), 0x5a}, int(length+3)/4)[:length]
	if n, err := v.Img.WriteAt(data, int64(off)); err != nil || n != len(data) {
		t.Fatalf("write %d+%d to %s: %d, %v", off, length, v.Name, n, err)
	}
	v.Writes = append(v.Writes, [2]uint64{off, length})
}

// Discard discards length bytes at the user offset off, and logs it in
// Writes.
func (v *CSIVolume) Discard(t *testing.T, off, length uint64) {
	t.Helper()
	Discard(t, v.Img, v.Header+off, length)
	v.Writes = append(v.Writes, [2]uint64{v.Header + off, length})
}

// NativeSnap takes a user snapshot, for native IDs.
func (v *CSIVolume) NativeSnap(t *testing.T, name string) string {
	t.Helper()
	Snapshot(t, v.Img, name)
	return v.C.nativeID(v.Name, name)
}

// CSISnap is a Ceph-CSI snapshot of vol. TrashID is its temporary snapshot
// on vol, now in the trash; Mark is len(Vol.Writes) when it was taken.
type CSISnap struct {
	Vol     *CSIVolume
	UUID    string
	Clone   string
	TrashID uint64
	Mark    int
	// CloneImg is the clone, open until the test ends (or the snapshot
	// is deleted).
	CloneImg *rbd.Image
}

// Handle is the snapshot's Ceph-CSI handle (its SnapshotHandle).
func (s *CSISnap) Handle() string { return s.Vol.C.Handle(s.UUID) }

// Snapshot takes a snapshot as Ceph-CSI's CreateSnapshot does.
func (v *CSIVolume) Snapshot(t *testing.T) *CSISnap {
	t.Helper()
	c := v.C
	uuid := CSIUUID(t)
	s := &CSISnap{Vol: v, UUID: uuid, Clone: "csi-snap-" + uuid, Mark: len(v.Writes)}
	req := "snapshot-" + CSIUUID(t)

	// 1. The temporary snapshot on the volume.
	if _, err := v.Img.CreateSnapshot(s.Clone); err != nil {
		t.Fatalf("snapshot %s@%s: %v", v.Name, s.Clone, err)
	}
	// 2. A format 2 clone with layering and deep-flatten only.
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := opts.SetUint64(rbd.ImageOptionFeatures, CSISnapFeatures); err != nil {
		t.Fatal(err)
	}
	if err := opts.SetUint64(rbd.ImageOptionCloneFormat, 2); err != nil {
		t.Fatal(err)
	}
	if err := rbd.CloneImage(c.IOCtx, v.Name, s.Clone, c.IOCtx, s.Clone, opts); err != nil {
		t.Fatalf("clone %s@%s: %v", v.Name, s.Clone, err)
	}
	RemoveImageOnCleanup(t, c.IOCtx, s.Clone)
	clone := c.OpenImage(t, s.Clone)
	s.CloneImg = clone
	// Ceph-CSI copies an encrypted volume's encryption config to the clone.
	if v.Header != 0 {
		CSISetMetadata(t, clone, map[string]string{"rbd.csi.ceph.com/encrypted": "encrypted", "rbd.csi.ceph.com/dek": CSIDEK(t)})
	}
	// 3. The temporary snapshot goes; the clone keeps it, in the trash.
	if err := v.Img.GetSnapshot(s.Clone).Remove(); err != nil {
		t.Fatalf("remove %s@%s: %v", v.Name, s.Clone, err)
	}
	// 4. The clone's own snapshot.
	if _, err := clone.CreateSnapshot(s.Clone); err != nil {
		t.Fatalf("snapshot %s@%s: %v", s.Clone, s.Clone, err)
	}
	parent, err := clone.GetParent()
	if err != nil {
		t.Fatalf("parent of %s: %v", s.Clone, err)
	}
	ns, err := v.Img.GetSnapNamespaceType(parent.Snap.ID)
	if err != nil || ns != rbd.SnapNamespaceTypeTrash || parent.Image.ImageName != v.Name {
		t.Fatalf("parent of %s: %+v (namespace %v, %v); want a trash snapshot of %s", s.Clone, parent, ns, err, v.Name)
	}
	s.TrashID = parent.Snap.ID

	c.setOmap(t, "csi.snaps.default", map[string]string{"csi.snap." + req: uuid}, false)
	kv := map[string]string{"csi.imagename": s.Clone, "csi.snapname": req, "csi.source": v.Name, "csi.imageid": CSIImageID(t, clone)}
	if v.Header != 0 {
		kv["csi.volume.encryptKMS"] = "default"
		kv["csi.volume.encryptionType"] = "block"
	}
	c.setOmap(t, "csi.snap."+uuid, kv, true)
	return s
}

// Flatten flattens the snapshot's clone, as Ceph-CSI does when clone chains
// grow too deep or a volume has too many snapshots.
func (s *CSISnap) Flatten(t *testing.T) {
	t.Helper()
	img := s.Vol.C.OpenImage(t, s.Clone)
	if err := img.Flatten(); err != nil {
		t.Fatalf("flatten %s: %v", s.Clone, err)
	}
	if _, err := img.GetParent(); !errors.Is(err, rbd.ErrNotFound) {
		t.Fatalf("%s still has a parent after flatten: %v", s.Clone, err)
	}
}

// Restore makes a volume from a snapshot, as Ceph-CSI's CreateVolume with a
// snapshot source does: a format 2 clone of csi-snap-<uuid>@csi-snap-<uuid>.
func (s *CSISnap) Restore(t *testing.T) *CSIVolume {
	t.Helper()
	c := s.Vol.C
	uuid := CSIUUID(t)
	v := &CSIVolume{C: c, uuid: uuid, Name: "csi-vol-" + uuid, Header: s.Vol.Header}
	if err := rbd.CloneImage(c.IOCtx, s.Clone, s.Clone, c.IOCtx, v.Name, ImageOptions(t, true)); err != nil {
		t.Fatalf("clone %s@%s to %s: %v", s.Clone, s.Clone, v.Name, err)
	}
	RemoveImageOnCleanup(t, c.IOCtx, v.Name)
	v.Img = c.OpenImage(t, v.Name)
	c.journalVolume(t, v, v.Header != 0)
	return v
}

// CSIReadSnap reads an image at a snapshot ID (a trash snapshot too).
func CSIReadSnap(t *testing.T, ioctx *rados.IOContext, name string, snapID uint64) []byte {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer img.Close()
	if err := img.SetSnapByID(snapID); err != nil {
		t.Fatalf("set %s to snapshot %d: %v", name, snapID, err)
	}
	size, err := img.GetSize()
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, size)
	for off := uint64(0); off < size; off += ObjSize {
		end := min(off+ObjSize, size)
		if n, err := img.ReadAt(data[off:end], int64(off)); err != nil || n != int(end-off) {
			t.Fatalf("read %s@%d at %d: %d, %v", name, snapID, off, n, err)
		}
	}
	return data
}

// CSISnapID returns the ID of img's snapshot name.
func CSISnapID(t *testing.T, img *rbd.Image, name string) uint64 {
	t.Helper()
	id, err := img.GetSnapID(name)
	if err != nil {
		t.Fatalf("ID of %s@%s: %v", img.GetName(), name, err)
	}
	return id
}

// Data reads what the snapshot captured: the volume at the trash snapshot.
func (s *CSISnap) Data(t *testing.T) []byte {
	return CSIReadSnap(t, s.Vol.C.IOCtx, s.Vol.Name, s.TrashID)
}

// User returns a volume's data as its user sees it.
func (v *CSIVolume) User(data []byte) []byte { return data[v.Header:] }
