//go:build e2e

package e2e

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
	// csiSnapFeatures are the features of a snapshot's clone image.
	csiSnapFeatures = rbd.FeatureLayering | rbd.FeatureDeepFlatten
	// csiLuksHeader is Ceph-CSI's LUKS2 header: 2 × 4 MiB metadata plus
	// 8 MiB of keyslots (internal/util/cryptsetup).
	csiLuksHeader = 16 * mib
	csiBlock      = 4096 // the oracle's block size
)

// csiCluster is one cluster ID of csi-config.json: the pool and the RADOS
// namespace its volumes live in, seen through an admin connection.
type csiCluster struct {
	id     string
	ns     string
	poolID int64
	conn   *rados.Conn
	ioctx  *rados.IOContext
}

func newCSICluster(t *testing.T, conn *rados.Conn, id, ns string) *csiCluster {
	t.Helper()
	poolID, err := conn.GetPoolByName(pool)
	if err != nil {
		t.Fatalf("pool ID of %s: %v", pool, err)
	}
	return &csiCluster{id: id, ns: ns, poolID: poolID, conn: conn, ioctx: openIOContext(t, conn, pool, ns)}
}

// handle composes a Ceph-CSI handle as internal/util/volid.go does.
func (c *csiCluster) handle(uuid string) string {
	return fmt.Sprintf("0001-%04x-%s-%016x-%s", len(c.id), c.id, c.poolID, uuid)
}

// nativeID names a user snapshot of an image natively.
func (c *csiCluster) nativeID(image, snap string) string {
	return c.id + "/" + pool + "/" + image + "@" + snap
}

func csiUUID(t testing.TB) string {
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
func (c *csiCluster) setOmap(t *testing.T, oid string, kv map[string]string, removeObject bool) {
	t.Helper()
	pairs := make(map[string][]byte, len(kv))
	keys := make([]string, 0, len(kv))
	for k, v := range kv {
		pairs[k] = []byte(v)
		keys = append(keys, k)
	}
	if err := c.ioctx.SetOmap(oid, pairs); err != nil {
		t.Fatalf("set omap of %s: %v", oid, err)
	}
	t.Cleanup(func() {
		var err error
		if removeObject {
			err = c.ioctx.Delete(oid)
		} else {
			err = c.ioctx.RmOmapKeys(oid, keys)
		}
		if err != nil && !errors.Is(err, rados.ErrNotFound) {
			t.Errorf("cleanup: journal object %s: %v", oid, err)
		}
	})
}

func (c *csiCluster) openImage(t *testing.T, name string) *rbd.Image {
	t.Helper()
	img, err := rbd.OpenImage(c.ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return img
}

func csiImageID(t *testing.T, img *rbd.Image) string {
	t.Helper()
	id, err := img.GetId()
	if err != nil {
		t.Fatalf("ID of %s: %v", img.GetName(), err)
	}
	return id
}

// csiVolume is a Ceph-CSI volume. header is the LUKS header size of an
// encrypted volume (0 otherwise): user offset x is image offset header+x.
// writes logs every write and discard, in image offsets, so that tests can
// bound which objects a delta may report.
type csiVolume struct {
	c      *csiCluster
	uuid   string
	name   string
	img    *rbd.Image
	header uint64
	writes [][2]uint64
}

func (v *csiVolume) handle() string { return v.c.handle(v.uuid) }

// journalVolume records a volume as Ceph-CSI's CreateVolume does.
func (c *csiCluster) journalVolume(t *testing.T, v *csiVolume, encrypted bool) {
	t.Helper()
	req := "pvc-" + csiUUID(t)
	c.setOmap(t, "csi.volumes.default", map[string]string{"csi.volume." + req: v.uuid}, false)
	kv := map[string]string{"csi.imagename": v.name, "csi.volname": req, "csi.imageid": csiImageID(t, v.img)}
	if encrypted {
		kv["csi.volume.encryptKMS"] = "default"
		kv["csi.volume.encryptionType"] = "block"
	}
	c.setOmap(t, "csi.volume."+v.uuid, kv, true)
}

// csiLuks describes the LUKS2 header of an encrypted volume.
type csiLuks struct {
	header uint64 // its data offset: csiLuksHeader, or else made with --offset
	// meta records the header size in the image metadata, as Ceph-CSI 3.15+
	// does (rbd.csi.ceph.com/luks2HeaderSize).
	meta bool
}

// createVolume makes an empty volume of size user bytes. An encrypted one
// (luks not nil) gets a LUKS2 header made by cryptsetup with Ceph-CSI's
// options, and its image is bigger by the header.
func (c *csiCluster) createVolume(t *testing.T, size uint64, luks *csiLuks) *csiVolume {
	t.Helper()
	uuid := csiUUID(t)
	v := &csiVolume{c: c, uuid: uuid, name: "csi-vol-" + uuid}
	encrypted := luks != nil
	if encrypted {
		v.header = luks.header
	}
	if err := rbd.CreateImage(c.ioctx, v.name, size+v.header, imageOptions(t, false)); err != nil {
		t.Fatalf("create %s: %v", v.name, err)
	}
	removeImageOnCleanup(t, c.ioctx, v.name)
	v.img = c.openImage(t, v.name)
	c.journalVolume(t, v, encrypted)
	if encrypted {
		meta := map[string]string{"rbd.csi.ceph.com/encrypted": "encrypted", "rbd.csi.ceph.com/dek": csiDEK(t)}
		if luks.meta {
			meta["rbd.csi.ceph.com/luks2HeaderSize"] = fmt.Sprint(v.header)
		}
		csiSetMetadata(t, v.img, meta)
		hdr := csiLuksFormat(t, v.header)
		if n, err := v.img.WriteAt(hdr, 0); err != nil || n != len(hdr) {
			t.Fatalf("write LUKS header to %s: %d, %v", v.name, n, err)
		}
		v.writes = append(v.writes, [2]uint64{0, uint64(len(hdr))})
	}
	return v
}

func csiDEK(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func csiSetMetadata(t *testing.T, img *rbd.Image, kv map[string]string) {
	t.Helper()
	for k, val := range kv {
		if err := img.SetMetadata(k, val); err != nil {
			t.Fatalf("set metadata %s of %s: %v", k, img.GetName(), err)
		}
	}
}

// csiLuksFormat formats a scratch file as Ceph-CSI's node plugin formats a
// volume (cryptsetup luksFormat --type luks2 --hash sha256
// --luks2-metadata-size 4096k --luks2-keyslots-size 8192k, plus a cheap
// PBKDF) and returns its header: the first 16 MiB. Another header size
// is made with --offset and smaller keyslots.
func csiLuksFormat(t *testing.T, header uint64) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), "luks")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f, int64(header+4*mib)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := []string{"-q", "luksFormat", "--type", "luks2", "--hash", "sha256"}
	if header == csiLuksHeader {
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

// write puts a pattern at user offset off (after the header), unique per
// call, so that overwrites change the data.
func (v *csiVolume) write(t *testing.T, off, length uint64) {
	t.Helper()
	v.writeRaw(t, v.header+off, length)
}

var csiPattern byte

func (v *csiVolume) writeRaw(t *testing.T, off, length uint64) {
	t.Helper()
	csiPattern++
	data := bytes.Repeat([]byte{csiPattern | 1, byte(off >> 12), byte(off >> 20), 0x5a}, int(length+3)/4)[:length]
	if n, err := v.img.WriteAt(data, int64(off)); err != nil || n != len(data) {
		t.Fatalf("write %d+%d to %s: %d, %v", off, length, v.name, n, err)
	}
	v.writes = append(v.writes, [2]uint64{off, length})
}

func (v *csiVolume) discard(t *testing.T, off, length uint64) {
	t.Helper()
	discard(t, v.img, v.header+off, length)
	v.writes = append(v.writes, [2]uint64{v.header + off, length})
}

// nativeSnap takes a user snapshot, for native IDs.
func (v *csiVolume) nativeSnap(t *testing.T, name string) string {
	t.Helper()
	snapshot(t, v.img, name)
	return v.c.nativeID(v.name, name)
}

// csiSnap is a Ceph-CSI snapshot of vol. trashID is its temporary snapshot
// on vol, now in the trash; mark is len(vol.writes) when it was taken.
type csiSnap struct {
	vol     *csiVolume
	uuid    string
	clone   string
	trashID uint64
	mark    int
	// cloneImg is the clone, open until the test ends (or the snapshot
	// is deleted).
	cloneImg *rbd.Image
}

func (s *csiSnap) handle() string { return s.vol.c.handle(s.uuid) }

// snapshot takes a snapshot as Ceph-CSI's CreateSnapshot does.
func (v *csiVolume) snapshot(t *testing.T) *csiSnap {
	t.Helper()
	c := v.c
	uuid := csiUUID(t)
	s := &csiSnap{vol: v, uuid: uuid, clone: "csi-snap-" + uuid, mark: len(v.writes)}
	req := "snapshot-" + csiUUID(t)

	// 1. The temporary snapshot on the volume.
	if _, err := v.img.CreateSnapshot(s.clone); err != nil {
		t.Fatalf("snapshot %s@%s: %v", v.name, s.clone, err)
	}
	// 2. A format 2 clone with layering and deep-flatten only.
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := opts.SetUint64(rbd.ImageOptionFeatures, csiSnapFeatures); err != nil {
		t.Fatal(err)
	}
	if err := opts.SetUint64(rbd.ImageOptionCloneFormat, 2); err != nil {
		t.Fatal(err)
	}
	if err := rbd.CloneImage(c.ioctx, v.name, s.clone, c.ioctx, s.clone, opts); err != nil {
		t.Fatalf("clone %s@%s: %v", v.name, s.clone, err)
	}
	removeImageOnCleanup(t, c.ioctx, s.clone)
	clone := c.openImage(t, s.clone)
	s.cloneImg = clone
	// Ceph-CSI copies an encrypted volume's encryption config to the clone.
	if v.header != 0 {
		csiSetMetadata(t, clone, map[string]string{"rbd.csi.ceph.com/encrypted": "encrypted", "rbd.csi.ceph.com/dek": csiDEK(t)})
	}
	// 3. The temporary snapshot goes; the clone keeps it, in the trash.
	if err := v.img.GetSnapshot(s.clone).Remove(); err != nil {
		t.Fatalf("remove %s@%s: %v", v.name, s.clone, err)
	}
	// 4. The clone's own snapshot.
	if _, err := clone.CreateSnapshot(s.clone); err != nil {
		t.Fatalf("snapshot %s@%s: %v", s.clone, s.clone, err)
	}
	parent, err := clone.GetParent()
	if err != nil {
		t.Fatalf("parent of %s: %v", s.clone, err)
	}
	ns, err := v.img.GetSnapNamespaceType(parent.Snap.ID)
	if err != nil || ns != rbd.SnapNamespaceTypeTrash || parent.Image.ImageName != v.name {
		t.Fatalf("parent of %s: %+v (namespace %v, %v); want a trash snapshot of %s", s.clone, parent, ns, err, v.name)
	}
	s.trashID = parent.Snap.ID

	c.setOmap(t, "csi.snaps.default", map[string]string{"csi.snap." + req: uuid}, false)
	kv := map[string]string{"csi.imagename": s.clone, "csi.snapname": req, "csi.source": v.name, "csi.imageid": csiImageID(t, clone)}
	if v.header != 0 {
		kv["csi.volume.encryptKMS"] = "default"
		kv["csi.volume.encryptionType"] = "block"
	}
	c.setOmap(t, "csi.snap."+uuid, kv, true)
	return s
}

// flatten flattens the snapshot's clone, as Ceph-CSI does when clone chains
// grow too deep or a volume has too many snapshots.
func (s *csiSnap) flatten(t *testing.T) {
	t.Helper()
	img := s.vol.c.openImage(t, s.clone)
	if err := img.Flatten(); err != nil {
		t.Fatalf("flatten %s: %v", s.clone, err)
	}
	if _, err := img.GetParent(); !errors.Is(err, rbd.ErrNotFound) {
		t.Fatalf("%s still has a parent after flatten: %v", s.clone, err)
	}
}

// restore makes a volume from a snapshot, as Ceph-CSI's CreateVolume with a
// snapshot source does: a format 2 clone of csi-snap-<uuid>@csi-snap-<uuid>.
func (s *csiSnap) restore(t *testing.T) *csiVolume {
	t.Helper()
	c := s.vol.c
	uuid := csiUUID(t)
	v := &csiVolume{c: c, uuid: uuid, name: "csi-vol-" + uuid, header: s.vol.header}
	if err := rbd.CloneImage(c.ioctx, s.clone, s.clone, c.ioctx, v.name, imageOptions(t, true)); err != nil {
		t.Fatalf("clone %s@%s to %s: %v", s.clone, s.clone, v.name, err)
	}
	removeImageOnCleanup(t, c.ioctx, v.name)
	v.img = c.openImage(t, v.name)
	c.journalVolume(t, v, v.header != 0)
	return v
}

// csiReadSnap reads an image at a snapshot ID (a trash snapshot too).
func csiReadSnap(t *testing.T, ioctx *rados.IOContext, name string, snapID uint64) []byte {
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
	for off := uint64(0); off < size; off += objSize {
		end := min(off+objSize, size)
		if n, err := img.ReadAt(data[off:end], int64(off)); err != nil || n != int(end-off) {
			t.Fatalf("read %s@%d at %d: %d, %v", name, snapID, off, n, err)
		}
	}
	return data
}

func csiSnapID(t *testing.T, img *rbd.Image, name string) uint64 {
	t.Helper()
	id, err := img.GetSnapID(name)
	if err != nil {
		t.Fatalf("ID of %s@%s: %v", img.GetName(), name, err)
	}
	return id
}

// data reads what the snapshot captured: the volume at the trash snapshot.
func (s *csiSnap) data(t *testing.T) []byte {
	return csiReadSnap(t, s.vol.c.ioctx, s.vol.name, s.trashID)
}
