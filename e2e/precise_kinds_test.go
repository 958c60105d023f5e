//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
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
// README's table of volume kinds.
//
// A restored volume and a PVC clone are clones of clones: each first
// write to an object copies the parent's data up, and through two levels
// reef writes that copy densely, zeros included, so that object extents
// alone report whole objects (120× the data before precise mode compared
// chunk hashes; see rbd/precise_copyup.go).
func TestPreciseVolumeKinds(t *testing.T) {
	testPreciseVolumeKinds(t, harness.ConnectAdmin(t), preciseSources(t), preciseKinds, func(*preciseWorkload) {})
}

// testPreciseVolumeKinds runs TestPreciseVolumeKinds's history on each of
// kinds over conn, queried through srcs; setup adjusts each workload.
func testPreciseVolumeKinds(t *testing.T, conn *rados.Conn, srcs map[string]*rsm.Source, kinds []preciseKind, setup func(*preciseWorkload)) {
	seed := preciseSeeds(t)[0]
	var rows []string
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			w := newPreciseWorkload(t, harness.OpenIOContext(t, conn, harness.Pool, k.ns), seed)
			// Without an object map precise mode walks the objects.
			w.walks = k.features != 0 && k.features&rbd.FeatureObjectMap == 0
			if k.ns != "" {
				w.clusterID = harness.ClusterIDNS // csi-config.json's ID for namespace ns1
			}
			setup(w)
			tot := testPreciseKind(t, w, k)
			w.check(srcs, tot)
			t.Log("\n" + tot.table())
			p, e := tot.modes["precise"], tot.modes["exact"]
			for kind, what := range []string{"Allocated", "Delta"} {
				// 4 KiB-aligned writes: precise mode reports whole chunks
				// or less, so the truth in 4 KiB blocks is within reach.
				if r := tot.ratio(p[kind], kind); r > 1.1 {
					t.Errorf("precise %s: %.2f× the truly changed bytes, want at most 1.1×", what, r)
				}
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %.2f× · %v | **%.2f×** · %v | %s | %.2f× · %v | **%.2f×** · %v |", k.name,
				preciseMiB(tot.truth[0]), tot.ratio(e[0], 0), tot.per(e[0], 0), tot.ratio(p[0], 0), tot.per(p[0], 0),
				preciseMiB(tot.truth[1]), tot.ratio(e[1], 1), tot.per(e[1], 1), tot.ratio(p[1], 1), tot.per(p[1], 1)))
			if t.Failed() {
				t.Logf("history:\n%s", strings.Join(w.log, "\n"))
			}
		})
	}
	t.Logf("volume kinds (seed %d; reported ÷ truly changed in 4 KiB blocks · mean time per query):\n"+
		"| volume | Allocated: truly changed | exact | precise | Delta: truly changed | exact | precise |\n"+
		"| --- | --- | --- | --- | --- | --- | --- |\n%s", seed, strings.Join(rows, "\n"))
}

// ratio is tally's reported bytes over the truth of query kind (0:
// Allocated, 1: Delta); per, its mean time per query.
func (tot *preciseTotals) ratio(x preciseTally, kind int) float64 {
	return float64(x.reported) / float64(max(tot.truth[kind], 1))
}

func (tot *preciseTotals) per(x preciseTally, kind int) time.Duration {
	return (x.dur / time.Duration(max(tot.queries[kind], 1))).Round(time.Millisecond)
}

// testPreciseKind builds the history of TestPreciseVolumeKinds on a volume
// of kind k, the workload's last image, and returns empty totals.
func testPreciseKind(t *testing.T, w *preciseWorkload, k preciseKind) *preciseTotals {
	r := w.rng
	const size = 256 * harness.MiB
	var header uint64
	if k.luks {
		header = harness.CSILuksHeader
	}
	scattered := func(p *preciseImage, n int) {
		for j := 0; j < n; j++ {
			w.write(p, header+r.Uint64N(size/preciseBlock)*preciseBlock, preciseBlock)
		}
	}
	var vol *preciseImage
	if k.chain {
		src := w.hazardImage(nil, size, 22)
		scattered(src, 24)
		w.write(src, 100*harness.MiB, 2*harness.MiB)
		w.snap(src)
		mid := &preciseImage{name: harness.UniqueName(t, "csi-mid"), objSize: src.objSize, size: size}
		opts := harness.ImageOptions(t, true)
		w.setDataPool(opts)
		if k.mid != 0 {
			if err := opts.SetUint64(rbd.ImageOptionFeatures, k.mid); err != nil {
				t.Fatal(err)
			}
		}
		if err := rbd.CloneImage(w.ioctx, src.name, src.snaps[0], w.ioctx, mid.name, opts); err != nil {
			t.Fatalf("clone %s@%s: %v", src.name, src.snaps[0], err)
		}
		harness.RemoveImageOnCleanup(t, w.ioctx, mid.name)
		w.logf("clone %s@%s to %s (features %#x)", src.name, src.snaps[0], mid.name, k.mid)
		w.open(mid)
		w.images = append(w.images, mid)
		w.snap(mid)
		vol = w.hazardImage(mid, size, 22)
	} else {
		vol = w.hazardImageWith(size+header, 22, k.features)
		if k.luks {
			w.header = header
			harness.CSISetMetadata(t, vol.img, map[string]string{"rbd.csi.ceph.com/encrypted": "encrypted", "rbd.csi.ceph.com/dek": harness.CSIDEK(t)})
			hdr := harness.CSILuksFormat(t, header)
			if n, err := vol.img.WriteAt(hdr, 0); err != nil || n != len(hdr) {
				t.Fatalf("write LUKS header: %d, %v", n, err)
			}
		}
		scattered(vol, 24)
		w.write(vol, header+100*harness.MiB, 2*harness.MiB)
		w.snap(vol)
	}
	for i, n := range []int{256, 64, 64} {
		scattered(vol, n)
		if i == 1 {
			off := header + r.Uint64N(size/(64<<10))*(64<<10)
			w.logf("discard %d+%d", off, 256<<10)
			if _, err := vol.img.Discard(off, 256<<10); err != nil {
				t.Fatalf("discard: %v", err)
			}
			off = header + 100*harness.MiB + r.Uint64N(2*harness.MiB/preciseBlock)*preciseBlock // inside the 2 MiB run
			w.logf("write zeros %d+%d", off, preciseBlock)
			if _, err := vol.img.WriteAt(make([]byte, preciseBlock), int64(off)); err != nil {
				t.Fatalf("write zeros: %v", err)
			}
		}
		w.snap(vol)
	}
	return newPreciseTotals()
}

// hazardImageWith is hazardImage(nil, size, order) with the given features
// (0: Ceph-CSI's usual ones).
func (w *preciseWorkload) hazardImageWith(size, order, features uint64) *preciseImage {
	t := w.t
	t.Helper()
	if features == 0 {
		return w.hazardImage(nil, size, order)
	}
	p := &preciseImage{name: harness.UniqueName(t, "kind"), objSize: 1 << order, size: size}
	opts := harness.ImageOptions(t, false)
	if err := opts.SetUint64(rbd.ImageOptionOrder, order); err != nil {
		t.Fatal(err)
	}
	w.setDataPool(opts)
	if err := opts.SetUint64(rbd.ImageOptionFeatures, features); err != nil {
		t.Fatal(err)
	}
	if err := rbd.CreateImage(w.ioctx, p.name, size, opts); err != nil {
		t.Fatalf("create %s: %v", p.name, err)
	}
	harness.RemoveImageOnCleanup(t, w.ioctx, p.name)
	w.logf("create %s size %d order %d features %#x", p.name, size, order, features)
	w.open(p)
	w.images = append(w.images, p)
	return p
}
