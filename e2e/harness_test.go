//go:build e2e

package e2e

// The harness's own tests: that the references the other tests trust
// (librbd's diff by snapshot ID, `rbd diff`, Ceph-CSI's layout in a RADOS
// namespace) say what the tests take them to say. The shared helpers are
// in e2e/harness; the package's essay and its index of tests in doc.go.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// csiSnapshot snapshots img the way Ceph-CSI does: a temporary snapshot, a
// format 2 clone of it named clone, then removal of the temporary snapshot,
// which moves it to the trash snapshot namespace. It returns the ID of that
// trash snapshot, which only the clone's parent info reveals.
func csiSnapshot(t testing.TB, ioctx *rados.IOContext, img *rbd.Image, clone string) uint64 {
	t.Helper()
	tmp := clone + "-tmp"
	harness.Snapshot(t, img, tmp)
	if err := rbd.CloneImage(ioctx, img.GetName(), tmp, ioctx, clone, harness.ImageOptions(t, true)); err != nil {
		t.Fatalf("clone %s@%s to %s: %v", img.GetName(), tmp, clone, err)
	}
	harness.RemoveImageOnCleanup(t, ioctx, clone)
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
func diffByID(t testing.TB, ioctx *rados.IOContext, name string, fromID, toID uint64, wholeObject bool) []harness.Extent {
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
	got := []harness.Extent{}
	cfg := rbd.DiffIterateByIDConfig{
		FromSnapID: fromID,
		Offset:     0,
		Length:     size,
		Callback: func(off, length uint64, exists int, _ interface{}) int {
			got = append(got, harness.Extent{Offset: off, Length: length, Exists: exists != 0})
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

// rbdDiff returns `rbd diff --from-snap FROM POOL/IMAGE@TO --format json`.
func rbdDiff(t testing.TB, name, from, to string, wholeObject bool) []harness.Extent {
	t.Helper()
	return harness.RbdDiffOf(t, harness.RbdVolume{Name: name}, from, to, wholeObject)
}

func equalExtents(t testing.TB, what string, got, want []harness.Extent) {
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
func covered(extents []harness.Extent, off, length uint64) bool {
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
	conn := harness.ConnectAdmin(t)
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, "")
	name := harness.UniqueName(t, "harness")
	img := harness.CreateImage(t, ioctx, name, harness.ImageSize)

	// Scattered data, then s1 and a CSI snapshot at the same point.
	for _, w := range [][2]uint64{
		{0, 4096}, {5*harness.MiB + 12288, 4096}, {33 * harness.MiB, 64 * 1024},
		{100 * harness.MiB, harness.ObjSize}, {200*harness.MiB + harness.MiB, 64 * 1024}, {harness.ImageSize - 4096, 4096},
	} {
		harness.WriteAt(t, img, w[0], w[1])
	}
	s1 := harness.Snapshot(t, img, "s1")
	trash1 := csiSnapshot(t, ioctx, img, name+"-csi1")

	// More writes, including an unaligned one, one across an object
	// boundary and a whole-object discard; then s2 and a CSI snapshot.
	after := [][2]uint64{
		{4096, 8192}, {64*harness.MiB + 7, 100}, {150 * harness.MiB, 4096}, {128*harness.MiB - 2048, 4096},
	}
	for _, w := range after {
		harness.WriteAt(t, img, w[0], w[1])
	}
	harness.Discard(t, img, 100*harness.MiB, harness.ObjSize)
	s2 := harness.Snapshot(t, img, "s2")
	trash2 := csiSnapshot(t, ioctx, img, name+"-csi2")
	harness.WriteAt(t, img, 180*harness.MiB, 4096) // the head moves on; no diff may see this

	if trash1 == s1 || trash2 == s2 || trash1 >= trash2 {
		t.Fatalf("unexpected snapshot IDs: s1=%d trash1=%d s2=%d trash2=%d", s1, trash1, s2, trash2)
	}
	t.Logf("image %s/%s: s1=%d trash1=%d s2=%d trash2=%d", harness.Pool, name, s1, trash1, s2, trash2)

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
			if covered(got, 180*harness.MiB, 4096) {
				t.Errorf("write after s2 at %d shows in the diff %v", 180*harness.MiB, got)
			}
			if whole {
				discarded := harness.Extent{Offset: 100 * harness.MiB, Length: harness.ObjSize, Exists: false}
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
	harness.ClusterEnv(t, "CEPH_MON_HOST")
	conn := harness.Connect(t, harness.ClusterEnv(t, "CEPH_CSI_USER"), harness.ClusterEnv(t, "CEPH_CSI_KEY"))
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, harness.Namespace)
	name := harness.UniqueName(t, "harness-ns")
	img := harness.CreateImage(t, ioctx, name, 64*harness.MiB)
	harness.WriteAt(t, img, 0, 4096)
	harness.Snapshot(t, img, "s1")

	names, err := rbd.GetImageNames(ioctx)
	if err != nil {
		t.Fatalf("list images in %s/%s: %v", harness.Pool, harness.Namespace, err)
	}
	found := false
	for _, n := range names {
		found = found || n == name
	}
	if !found {
		t.Errorf("image %s not listed in %s/%s: %v", name, harness.Pool, harness.Namespace, names)
	}

	raw, err := os.ReadFile(harness.ClusterEnv(t, "RSM_CLUSTER_DIR") + "/csi-config.json")
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
	mon := harness.ClusterEnv(t, "CEPH_MON_V1")
	want := map[string]string{"rsm-e2e": "", "rsm-e2e-ns1": harness.Namespace}
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
