//go:build e2e

package e2e

// The harness's own tests and its shared helpers: the cluster's
// environment, connections, images and snapshots. The package's essay and
// its index of tests are in doc.go.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

const (
	pool      = "rbd"
	namespace = "ns1"
	mib       = uint64(1) << 20
	imageSize = 256 * mib
	objSize   = 4 * mib // librbd's default object size (order 22)

	imageFeatures = rbd.FeatureLayering | rbd.FeatureExclusiveLock |
		rbd.FeatureObjectMap | rbd.FeatureFastDiff | rbd.FeatureDeepFlatten
)

// extent is one changed range, as reported by DiffIterate or `rbd diff`.
type extent struct {
	Offset uint64
	Length uint64
	Exists bool
}

func (e extent) String() string {
	return fmt.Sprintf("[%d+%d exists=%t]", e.Offset, e.Length, e.Exists)
}

// clusterEnv returns the environment variable set by cluster.sh's env file,
// failing the test when it is missing: an e2e run without a cluster is an error.
func clusterEnv(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: start a cluster with e2e/cluster.sh and export its env file, or use e2e/run-e2e.sh", name)
	}
	return v
}

// connect opens a RADOS connection to the test cluster as user with key,
// without a config file.
func connect(t testing.TB, user, key string) *rados.Conn {
	t.Helper()
	return connectTo(t, clusterEnv(t, "CEPH_MON_HOST"), user, key)
}

// connectTo opens a RADOS connection to the monitors of monHost as user
// with key, without a config file, with more librados options.
func connectTo(t testing.TB, monHost, user, key string, more ...[2]string) *rados.Conn {
	t.Helper()
	conn, err := rados.NewConnWithUser(user)
	if err != nil {
		t.Fatalf("rados.NewConnWithUser(%q): %v", user, err)
	}
	for _, o := range append([][2]string{
		{"mon_host", monHost},
		{"key", key},
		{"keyring", "/dev/null"},
		// The defaults (300 s, none) make an unreachable mon hang the test.
		{"client_mount_timeout", "10"},
		{"rados_mon_op_timeout", "30"},
		{"rados_osd_op_timeout", "30"},
	}, more...) {
		if err := conn.SetConfigOption(o[0], o[1]); err != nil {
			t.Fatalf("SetConfigOption(%s): %v", o[0], err)
		}
	}
	if err := conn.Connect(); err != nil {
		t.Fatalf("connecting to %s as client.%s: %v", monHost, user, err)
	}
	t.Cleanup(conn.Shutdown)
	return conn
}

// connectAdmin connects as CEPH_USER (client.admin).
func connectAdmin(t testing.TB) *rados.Conn {
	t.Helper()
	clusterEnv(t, "CEPH_MON_HOST")
	return connect(t, clusterEnv(t, "CEPH_USER"), clusterEnv(t, "CEPH_KEY"))
}

func openIOContext(t testing.TB, conn *rados.Conn, pool, ns string) *rados.IOContext {
	t.Helper()
	ioctx, err := conn.OpenIOContext(pool)
	if err != nil {
		t.Fatalf("OpenIOContext(%q): %v", pool, err)
	}
	ioctx.SetNamespace(ns)
	t.Cleanup(ioctx.Destroy)
	return ioctx
}

// uniqueName returns prefix plus a random suffix, so that runs sharing a
// cluster do not collide.
func uniqueName(t testing.TB, prefix string) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// imageOptions returns the image features Ceph-CSI uses and, for clones,
// clone format 2 (librbd rejects that option when creating an image).
func imageOptions(t testing.TB, clone bool) *rbd.ImageOptions {
	t.Helper()
	opts := rbd.NewRbdImageOptions()
	t.Cleanup(opts.Destroy)
	if err := opts.SetUint64(rbd.ImageOptionFeatures, imageFeatures); err != nil {
		t.Fatal(err)
	}
	// Format 2 clones let their parent snapshot move to the trash.
	if clone {
		if err := opts.SetUint64(rbd.ImageOptionCloneFormat, 2); err != nil {
			t.Fatal(err)
		}
	}
	return opts
}

// removeImageOnCleanup removes the image, and its user snapshots, when the
// test ends. Cleanups run last-in first-out, so clones go before parents.
func removeImageOnCleanup(t testing.TB, ioctx *rados.IOContext, name string) {
	t.Helper()
	t.Cleanup(func() {
		img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
		if errors.Is(err, rbd.ErrNotFound) {
			return
		}
		if err != nil {
			t.Errorf("cleanup: open %s: %v", name, err)
			return
		}
		snaps, err := img.GetSnapshotNames()
		if err != nil {
			t.Errorf("cleanup: list snapshots of %s: %v", name, err)
		}
		for _, s := range snaps {
			if err := img.GetSnapshot(s.Name).Remove(); err != nil {
				t.Errorf("cleanup: remove %s@%s: %v", name, s.Name, err)
			}
		}
		if err := img.Close(); err != nil {
			t.Errorf("cleanup: close %s: %v", name, err)
		}
		if err := rbd.RemoveImage(ioctx, name); err != nil {
			t.Errorf("cleanup: remove %s: %v", name, err)
			for _, args := range [][]string{{"snap", "ls", "--all", pool + "/" + name}, {"trash", "ls", "--all", pool}, {"ls", "-l", pool}} {
				out, _ := rbdTry(t, args...)
				t.Logf("rbd %s:\n%s", strings.Join(args, " "), out)
			}
		}
	})
}

// createImage creates an image with the features Ceph-CSI uses and opens it.
func createImage(t testing.TB, ioctx *rados.IOContext, name string, size uint64) *rbd.Image {
	t.Helper()
	if err := rbd.CreateImage(ioctx, name, size, imageOptions(t, false)); err != nil {
		t.Fatalf("create image %s: %v", name, err)
	}
	removeImageOnCleanup(t, ioctx, name)
	img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open image %s: %v", name, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return img
}

func writeAt(t testing.TB, img *rbd.Image, off, length uint64) {
	t.Helper()
	data := bytes.Repeat([]byte{byte(off>>12) | 1}, int(length))
	if n, err := img.WriteAt(data, int64(off)); err != nil || n != len(data) {
		t.Fatalf("write %d+%d to %s: n=%d, %v", off, length, img.GetName(), n, err)
	}
}

func discard(t testing.TB, img *rbd.Image, off, length uint64) {
	t.Helper()
	if _, err := img.Discard(off, length); err != nil {
		t.Fatalf("discard %d+%d on %s: %v", off, length, img.GetName(), err)
	}
}

func snapshot(t testing.TB, img *rbd.Image, name string) uint64 {
	t.Helper()
	if _, err := img.CreateSnapshot(name); err != nil {
		t.Fatalf("snapshot %s@%s: %v", img.GetName(), name, err)
	}
	id, err := img.GetSnapID(name)
	if err != nil {
		t.Fatalf("snapshot ID of %s@%s: %v", img.GetName(), name, err)
	}
	return id
}

// csiSnapshot snapshots img the way Ceph-CSI does: a temporary snapshot, a
// format 2 clone of it named clone, then removal of the temporary snapshot,
// which moves it to the trash snapshot namespace. It returns the ID of that
// trash snapshot, which only the clone's parent info reveals.
func csiSnapshot(t testing.TB, ioctx *rados.IOContext, img *rbd.Image, clone string) uint64 {
	t.Helper()
	tmp := clone + "-tmp"
	snapshot(t, img, tmp)
	if err := rbd.CloneImage(ioctx, img.GetName(), tmp, ioctx, clone, imageOptions(t, true)); err != nil {
		t.Fatalf("clone %s@%s to %s: %v", img.GetName(), tmp, clone, err)
	}
	removeImageOnCleanup(t, ioctx, clone)
	if err := img.GetSnapshot(tmp).Remove(); err != nil {
		t.Fatalf("remove %s@%s: %v", img.GetName(), tmp, err)
	}

	c, err := rbd.OpenImageReadOnly(ioctx, clone, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s: %v", clone, err)
	}
	defer c.Close()
	parent, err := c.GetParent()
	if err != nil {
		t.Fatalf("parent of %s: %v", clone, err)
	}
	if parent.Image.ImageName != img.GetName() {
		t.Fatalf("parent of %s is %q, want %q", clone, parent.Image.ImageName, img.GetName())
	}
	ns, err := img.GetSnapNamespaceType(parent.Snap.ID)
	if err != nil {
		t.Fatalf("namespace of snapshot %d of %s: %v", parent.Snap.ID, img.GetName(), err)
	}
	if ns != rbd.SnapNamespaceTypeTrash {
		t.Fatalf("snapshot %d of %s is in namespace %d, want the trash (%d)", parent.Snap.ID, img.GetName(), ns, rbd.SnapNamespaceTypeTrash)
	}
	return parent.Snap.ID
}

// diffByID lists the extents that changed between snapshots fromID and toID
// of the image, with librbd's rbd_diff_iterate3.
func diffByID(t testing.TB, ioctx *rados.IOContext, name string, fromID, toID uint64, wholeObject bool) []extent {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer img.Close()
	if err := img.SetSnapByID(toID); err != nil {
		t.Fatalf("set %s to snapshot %d: %v", name, toID, err)
	}
	size, err := img.GetSize()
	if err != nil {
		t.Fatalf("size of %s@%d: %v", name, toID, err)
	}
	got := []extent{}
	cfg := rbd.DiffIterateByIDConfig{
		FromSnapID: fromID,
		Offset:     0,
		Length:     size,
		Callback: func(off, length uint64, exists int, _ interface{}) int {
			got = append(got, extent{off, length, exists != 0})
			return 0
		},
	}
	if wholeObject {
		cfg.WholeObject = rbd.EnableWholeObject
	}
	if err := img.DiffIterateByID(cfg); err != nil {
		if errors.Is(err, rbd.ErrNotImplemented) {
			t.Fatalf("DiffIterateByID: %v: this librbd lacks rbd_diff_iterate3; run the test in the reef rootfs (go test -exec e2e/exec.sh)", err)
		}
		t.Fatalf("DiffIterateByID(%s, %d..%d): %v", name, fromID, toID, err)
	}
	return got
}

// rbdCLI runs the rbd command line tool (inside the rootfs; CEPH_CONF points
// at the cluster's config) and returns its standard output.
func rbdCLI(t testing.TB, args ...string) []byte {
	t.Helper()
	clusterEnv(t, "CEPH_CONF")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rbd", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("rbd %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// rbdDiff returns `rbd diff --from-snap FROM POOL/IMAGE@TO --format json`.
func rbdDiff(t testing.TB, name, from, to string, wholeObject bool) []extent {
	t.Helper()
	return rbdDiffOf(t, rbdVolume{name: name}, from, to, wholeObject)
}

func equalExtents(t testing.TB, what string, got, want []extent) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	for i := 0; i < len(got) || i < len(want); i++ {
		var g, w string
		if i < len(got) {
			g = got[i].String()
		}
		if i < len(want) {
			w = want[i].String()
		}
		if g != w {
			t.Fatalf("%s: %d extents, want %d; first difference at #%d: got %s, want %s", what, len(got), len(want), i, g, w)
		}
	}
}

// covered reports whether [off, off+length) lies within the union of the
// extents that exist (a write across an object boundary comes as two).
func covered(extents []extent, off, length uint64) bool {
	end := off + length
	for progress := true; progress && off < end; {
		progress = false
		for _, e := range extents {
			if e.Exists && e.Offset <= off && off < e.Offset+e.Length {
				off, progress = e.Offset+e.Length, true
			}
		}
	}
	return off >= end
}

// TestHarnessDiffTrashSnapshotsByID proves the harness end to end: go-ceph
// built on the host talks to the reef cluster from the rootfs, and diffing two
// Ceph-CSI style trash snapshots by ID gives exactly what `rbd diff` gives
// for the user snapshots taken at the same points.
func TestHarnessDiffTrashSnapshotsByID(t *testing.T) {
	conn := connectAdmin(t)
	ioctx := openIOContext(t, conn, pool, "")
	name := uniqueName(t, "harness")
	img := createImage(t, ioctx, name, imageSize)

	// Scattered data, then s1 and a CSI snapshot at the same point.
	for _, w := range [][2]uint64{
		{0, 4096}, {5*mib + 12288, 4096}, {33 * mib, 64 * 1024},
		{100 * mib, objSize}, {200*mib + mib, 64 * 1024}, {imageSize - 4096, 4096},
	} {
		writeAt(t, img, w[0], w[1])
	}
	s1 := snapshot(t, img, "s1")
	trash1 := csiSnapshot(t, ioctx, img, name+"-csi1")

	// More writes, including an unaligned one, one across an object
	// boundary and a whole-object discard; then s2 and a CSI snapshot.
	after := [][2]uint64{
		{4096, 8192}, {64*mib + 7, 100}, {150 * mib, 4096}, {128*mib - 2048, 4096},
	}
	for _, w := range after {
		writeAt(t, img, w[0], w[1])
	}
	discard(t, img, 100*mib, objSize)
	s2 := snapshot(t, img, "s2")
	trash2 := csiSnapshot(t, ioctx, img, name+"-csi2")
	writeAt(t, img, 180*mib, 4096) // the head moves on; no diff may see this

	if trash1 == s1 || trash2 == s2 || trash1 >= trash2 {
		t.Fatalf("unexpected snapshot IDs: s1=%d trash1=%d s2=%d trash2=%d", s1, trash1, s2, trash2)
	}
	t.Logf("image %s/%s: s1=%d trash1=%d s2=%d trash2=%d", pool, name, s1, trash1, s2, trash2)

	for _, whole := range []bool{false, true} {
		t.Run(fmt.Sprintf("wholeObject=%t", whole), func(t *testing.T) {
			want := rbdDiff(t, name, "s1", "s2", whole)
			got := diffByID(t, ioctx, name, trash1, trash2, whole)
			equalExtents(t, "DiffIterateByID(trash1, trash2) vs rbd diff s1..s2", got, want)
			equalExtents(t, "DiffIterateByID(s1, s2) vs rbd diff s1..s2", diffByID(t, ioctx, name, s1, s2, whole), want)

			for _, w := range after {
				if !covered(got, w[0], w[1]) {
					t.Errorf("write %d+%d after s1 is not in the diff %v", w[0], w[1], got)
				}
			}
			if covered(got, 180*mib, 4096) {
				t.Errorf("write after s2 at %d shows in the diff %v", 180*mib, got)
			}
			if whole {
				discarded := extent{100 * mib, objSize, false}
				found := false
				for _, e := range got {
					found = found || e == discarded
				}
				if !found {
					t.Errorf("whole-object discard %v is not in the diff %v", discarded, got)
				}
			}
			t.Logf("%d extents", len(got))
		})
	}
}

// TestHarnessCSIUserAndNamespace checks the rest of what cluster.sh promises:
// the Ceph-CSI style user works in RBD namespace ns1, and csi-config.json
// names the cluster's v1 monitor address.
func TestHarnessCSIUserAndNamespace(t *testing.T) {
	clusterEnv(t, "CEPH_MON_HOST")
	conn := connect(t, clusterEnv(t, "CEPH_CSI_USER"), clusterEnv(t, "CEPH_CSI_KEY"))
	ioctx := openIOContext(t, conn, pool, namespace)
	name := uniqueName(t, "harness-ns")
	img := createImage(t, ioctx, name, 64*mib)
	writeAt(t, img, 0, 4096)
	snapshot(t, img, "s1")

	names, err := rbd.GetImageNames(ioctx)
	if err != nil {
		t.Fatalf("list images in %s/%s: %v", pool, namespace, err)
	}
	found := false
	for _, n := range names {
		found = found || n == name
	}
	if !found {
		t.Errorf("image %s not listed in %s/%s: %v", name, pool, namespace, names)
	}

	raw, err := os.ReadFile(clusterEnv(t, "RSM_CLUSTER_DIR") + "/csi-config.json")
	if err != nil {
		t.Fatal(err)
	}
	var clusters []struct {
		ClusterID string   `json:"clusterID"`
		Monitors  []string `json:"monitors"`
		RBD       struct {
			RadosNamespace string `json:"radosNamespace"`
		} `json:"rbd"`
	}
	if err := json.Unmarshal(raw, &clusters); err != nil {
		t.Fatalf("csi-config.json: %v", err)
	}
	mon := clusterEnv(t, "CEPH_MON_V1")
	want := map[string]string{"rsm-e2e": "", "rsm-e2e-ns1": namespace}
	if len(clusters) != len(want) {
		t.Fatalf("csi-config.json has %d clusters, want %d: %s", len(clusters), len(want), raw)
	}
	for _, c := range clusters {
		ns, ok := want[c.ClusterID]
		if !ok || c.RBD.RadosNamespace != ns || !reflect.DeepEqual(c.Monitors, []string{mon}) {
			t.Errorf("csi-config.json: unexpected entry %+v (monitor %s)", c, mon)
		}
	}
}
