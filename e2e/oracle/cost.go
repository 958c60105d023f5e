//go:build e2e

package oracle

// The cost table (TestPreciseCost): what each mode reports and how long it
// takes on images made for it.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// Cost is TestPreciseCost on w's cluster, with w's data pool.
func Cost(t *testing.T, w *Workload, srcs map[string]*rsm.Source) {
	ioctx := w.IOCtx
	var b strings.Builder
	fmt.Fprintf(&b, "| image | query | truly changed | mode | reported | ratio | time |\n|---|---|---|---|---|---|---|\n")
	measure := func(label string, p *Image, base string, truth int64) {
		for _, m := range Modes {
			var durs []time.Duration
			var reported int64
			for i := 0; i < 5; i++ {
				got, dur, _ := w.Query(srcs[m.Name], p, base, "s2", m.Name)
				reported = preciseSum(got[0], 0)
				durs = append(durs, dur)
			}
			slices.Sort(durs)
			best := durs[len(durs)/2] // the median
			q := "Allocated(s2)"
			if base != "" {
				q = "Delta(s1, s2)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f× | %v |\n", label, q, MiB(truth), m.Name,
				MiB(reported), float64(reported)/float64(truth), best.Round(10*time.Microsecond))
		}
	}
	write := func(p *Image, off, length uint64) {
		data := make([]byte, length)
		for i := range data {
			data[i] = byte(w.Rng.UintN(255) + 1)
		}
		if _, err := p.Img.WriteAt(data, int64(off)); err != nil {
			t.Fatal(err)
		}
	}

	// 4 GiB, 1024 objects: 4 KiB in 64 objects, then in 64 others.
	p := NewCostImage(t, ioctx, "precise-cost", 4096*harness.MiB, w.DataPool)
	for i := uint64(0); i < 128; i++ {
		if i == 64 {
			w.Snap(p)
		}
		write(p, (i*8+3)*p.ObjSize+w.Rng.Uint64N(1023)*4096, 4096)
	}
	w.Snap(p)
	measure("4 GiB, 128 objects changed", p, "", 128*4096)
	measure("4 GiB, 128 objects changed", p, "s1", 64*4096)

	// 256 MiB written in full, then 4 KiB in each of its 64 objects.
	p = NewCostImage(t, ioctx, "precise-dense", 256*harness.MiB, w.DataPool)
	for off := uint64(0); off < p.Size; off += p.ObjSize {
		write(p, off, p.ObjSize)
	}
	w.Snap(p)
	for off := uint64(0); off < p.Size; off += p.ObjSize {
		write(p, off+w.Rng.Uint64N(1023)*4096, 4096)
	}
	w.Snap(p)
	measure("256 MiB dense", p, "", int64(p.Size))
	measure("256 MiB dense", p, "s1", 64*4096)

	// The worst case for candidates by existence: everything allocated,
	// one object changed.
	p = NewCostImage(t, ioctx, "precise-dense-one", 512*harness.MiB, w.DataPool)
	for off := uint64(0); off < p.Size; off += p.ObjSize {
		write(p, off, p.ObjSize)
	}
	w.Snap(p)
	write(p, 77*p.ObjSize+w.Rng.Uint64N(1023)*4096, 4096)
	w.Snap(p)
	measure("512 MiB dense, 1 object changed", p, "s1", 4096)
	t.Log("\n" + b.String())
}

// NewCostImage creates an open image of 4 MiB objects for TestPreciseCost,
// with its data in dataPool when set, closed and removed when the test
// ends.
func NewCostImage(t *testing.T, ioctx *rados.IOContext, prefix string, size uint64, dataPool string) *Image {
	t.Helper()
	p := &Image{Name: harness.UniqueName(t, prefix), ObjSize: 4 * harness.MiB, Size: size}
	opts := harness.ImageOptions(t, false)
	if dataPool != "" {
		if err := opts.SetString(rbd.ImageOptionDataPool, dataPool); err != nil {
			t.Fatal(err)
		}
	}
	if err := rbd.CreateImage(ioctx, p.Name, p.Size, opts); err != nil {
		t.Fatal(err)
	}
	harness.RemoveImageOnCleanup(t, ioctx, p.Name)
	img, err := rbd.OpenImage(ioctx, p.Name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { img.Close() })
	p.Img = img
	return p
}
