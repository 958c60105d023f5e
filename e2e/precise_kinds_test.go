//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/oracle"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// preciseKind is a kind of volume as Ceph-CSI makes it.
type preciseKind struct {
	name string
	ns   string // RADOS namespace (Ceph-CSI's radosNamespace)
	luks bool   // encrypted: Ceph-CSI's LUKS2 header and metadata
	// features of the volume; 0: Ceph-CSI's usual ones (harness.ImageFeatures
	// layering,exclusive-lock,object-map,fast-diff,deep-flatten).
	features uint64
	// chain: the volume is a clone of an intermediate image (with mid's
	// features, 0: the usual ones) cloned from the source's snapshot: a
	// restored volume (mid: csi-snap-<uuid>) or a PVC clone (mid:
	// csi-vol-<uuid>-temp).
	chain bool
	mid   uint64
}

var preciseKinds = []preciseKind{
	{name: "plain"},
	{name: "namespaced", ns: harness.Namespace},
	{name: "encrypted (LUKS2)", luks: true},
	{name: "without fast-diff (imageFeatures: layering)", features: rbd.FeatureLayering},
	{name: "restored from a snapshot", chain: true, mid: harness.CSISnapFeatures},
	{name: "PVC clone", chain: true},
}

// TestPreciseVolumeKinds runs one history on each kind of volume users
// get from Ceph-CSI: 24 scattered 4 KiB blocks and a 2 MiB run (in the
// source volume, for a restored volume or a clone), a snapshot, then 256
// random 4 KiB writes, a snapshot, 64 more with a discard and zeros, a
// snapshot, 64 more, a snapshot. Every mode must miss nothing, and precise
// mode must stay near the truly changed bytes. The last log line is the
// table of docs/precision.md, "Volume kinds".
//
// A restored volume and a PVC clone are clones of clones: each first
// write to an object copies the parent's data up, and through two levels
// reef writes that copy densely, zeros included, so that object extents
// alone report whole objects (120× the data before precise mode compared
// chunk hashes; see rbd/precise_copyup.go).
func TestPreciseVolumeKinds(t *testing.T) {
	testPreciseVolumeKinds(t, harness.ConnectAdmin(t), oracle.Sources(t), preciseKinds, func(*oracle.Workload) {})
}

// testPreciseVolumeKinds runs TestPreciseVolumeKinds's history on each of
// kinds over conn, queried through srcs; setup adjusts each workload.
func testPreciseVolumeKinds(t *testing.T, conn *rados.Conn, srcs map[string]*rsm.Source, kinds []preciseKind, setup func(*oracle.Workload)) {
	seed := oracle.Seeds(t)[0]
	rows := make([]string, len(kinds))
	// After the kinds, which run two at a time (oracle.Parallel).
	t.Cleanup(func() {
		t.Logf("volume kinds (seed %d; reported ÷ truly changed in 4 KiB blocks · mean time per query):\n"+
			"| volume | Allocated: truly changed | exact | precise | Delta: truly changed | exact | precise |\n"+
			"| --- | --- | --- | --- | --- | --- | --- |\n%s", seed, strings.Join(slices.DeleteFunc(rows, func(r string) bool { return r == "" }), "\n"))
	})
	for i, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			oracle.Parallel(t)
			w := oracle.NewWorkload(t, harness.OpenIOContext(t, conn, harness.Pool, k.ns), seed)
			// Without an object map precise mode walks the objects.
			w.Walks = k.features != 0 && k.features&rbd.FeatureObjectMap == 0
			if k.ns != "" {
				w.ClusterID = harness.ClusterIDNS // csi-config.json's ID for namespace ns1
			}
			setup(w)
			tot := testPreciseKind(t, w, k)
			w.Check(srcs, tot)
			t.Log("\n" + tot.Table())
			p, e := tot.Modes["precise"], tot.Modes["exact"]
			for kind, what := range []string{"Allocated", "Delta"} {
				// 4 KiB-aligned writes: precise mode reports whole chunks
				// or less, so the truth in 4 KiB blocks is within reach.
				if r := p[kind].Ratio(); r > 1.1 {
					t.Errorf("precise %s: %.2f× the truly changed bytes, want at most 1.1×", what, r)
				}
			}
			rows[i] = fmt.Sprintf("| %s | %s | %.2f× · %v | **%.2f×** · %v | %s | %.2f× · %v | **%.2f×** · %v |", k.name,
				oracle.MiB(tot.Truth[0]), e[0].Ratio(), e[0].Per(), p[0].Ratio(), p[0].Per(),
				oracle.MiB(tot.Truth[1]), e[1].Ratio(), e[1].Per(), p[1].Ratio(), p[1].Per())
			if t.Failed() {
				t.Logf("history:\n%s", strings.Join(w.Log, "\n"))
			}
		})
	}
}

// testPreciseKind builds the history of TestPreciseVolumeKinds on a volume
// of kind k, the workload's last image, and returns empty totals.
func testPreciseKind(t *testing.T, w *oracle.Workload, k preciseKind) *oracle.Totals {
	r := w.Rng
	const size = 256 * harness.MiB
	var header uint64
	if k.luks {
		header = harness.CSILuksHeader
	}
	scattered := func(p *oracle.Image, n int) {
		for j := 0; j < n; j++ {
			w.Write(p, header+r.Uint64N(size/oracle.Block)*oracle.Block, oracle.Block)
		}
	}
	var vol *oracle.Image
	if k.chain {
		src := w.HazardImage(nil, size, 22)
		scattered(src, 24)
		w.Write(src, 100*harness.MiB, 2*harness.MiB)
		w.Snap(src)
		mid := &oracle.Image{Name: harness.UniqueName(t, "csi-mid"), ObjSize: src.ObjSize, Size: size}
		opts := harness.ImageOptions(t, true)
		w.SetDataPool(opts)
		if k.mid != 0 {
			if err := opts.SetUint64(rbd.ImageOptionFeatures, k.mid); err != nil {
				t.Fatal(err)
			}
		}
		if err := rbd.CloneImage(w.IOCtx, src.Name, src.Snaps[0], w.IOCtx, mid.Name, opts); err != nil {
			t.Fatalf("clone %s@%s: %v", src.Name, src.Snaps[0], err)
		}
		harness.RemoveImageOnCleanup(t, w.IOCtx, mid.Name)
		w.Logf("clone %s@%s to %s (features %#x)", src.Name, src.Snaps[0], mid.Name, k.mid)
		w.Open(mid)
		w.Images = append(w.Images, mid)
		w.Snap(mid)
		vol = w.HazardImage(mid, size, 22)
	} else {
		vol = w.HazardImageWith(size+header, 22, k.features)
		if k.luks {
			w.Header = header
			harness.CSISetMetadata(t, vol.Img, map[string]string{"rbd.csi.ceph.com/encrypted": "encrypted", "rbd.csi.ceph.com/dek": harness.CSIDEK(t)})
			hdr := harness.CSILuksFormat(t, header)
			if n, err := vol.Img.WriteAt(hdr, 0); err != nil || n != len(hdr) {
				t.Fatalf("write LUKS header: %d, %v", n, err)
			}
		}
		scattered(vol, 24)
		w.Write(vol, header+100*harness.MiB, 2*harness.MiB)
		w.Snap(vol)
	}
	for i, n := range []int{256, 64, 64} {
		scattered(vol, n)
		if i == 1 {
			off := header + r.Uint64N(size/(64<<10))*(64<<10)
			w.Logf("discard %d+%d", off, 256<<10)
			if _, err := vol.Img.Discard(off, 256<<10); err != nil {
				t.Fatalf("discard: %v", err)
			}
			off = header + 100*harness.MiB + r.Uint64N(2*harness.MiB/oracle.Block)*oracle.Block // inside the 2 MiB run
			w.Logf("write zeros %d+%d", off, oracle.Block)
			if _, err := vol.Img.WriteAt(make([]byte, oracle.Block), int64(off)); err != nil {
				t.Fatalf("write zeros: %v", err)
			}
		}
		w.Snap(vol)
	}
	return oracle.NewTotals()
}
