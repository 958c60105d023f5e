//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/oracle"
)

// TestPreciseListing: precise mode's walk by listing (rsm.WalkList) relies
// on RADOS' object listing returning every object that has a version at a
// snapshot, those whose head was removed while snapshot clones remain
// ("whiteouts") included. This checks that property on the real cluster,
// for an object discarded whole after a snapshot and objects cut off by a
// shrink after a snapshot (plain, namespaced, and a clone that copied up),
// then checks every Allocated and Delta of the history in every mode
// against the byte oracle: the listing walk must miss nothing.
//
//	e2e/with-cluster.sh go test -tags pacific,e2e -exec "$PWD/e2e/exec.sh" ./e2e/ -run TestPreciseListing -v
func TestPreciseListing(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	srcs := oracle.Sources(t)
	history := func(w *oracle.Workload, p *oracle.Image, clone bool) {
		t := w.T
		for o := uint64(1); o < 8; o++ {
			w.Write(p, o*harness.ObjSize+o*64*oracle.KiB, 256*oracle.KiB)
		}
		w.Write(p, 2*harness.ObjSize, harness.ObjSize)
		w.Snap(p) // s1
		w.Logf("discard object 2 whole; shrink to 5.25 objects")
		harness.Discard(t, p.Img, 2*harness.ObjSize, harness.ObjSize)
		harness.ResizeImage(t, p.Img, 5*harness.ObjSize+harness.ObjSize/4)
		p.Size = 5*harness.ObjSize + harness.ObjSize/4
		w.Snap(p) // s2
		harness.ResizeImage(t, p.Img, 8*harness.ObjSize)
		p.Size = 8 * harness.ObjSize
		w.Write(p, 6*harness.ObjSize+4096, 4096)
		w.Snap(p) // s3
		// Object 7 (cut off by the shrink) has no head now, only its
		// clone at s1; nor has object 2 (discarded whole after s1),
		// unless the image is a clone, where librbd keeps the object, empty,
		// to hide the parent's data.
		st, err := p.Img.Stat()
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		if err := w.IOCtx.ListObjects(func(oid string) { listed[oid] = true }); err != nil {
			t.Fatal(err)
		}
		whiteouts := []uint64{2, 7}
		if clone {
			whiteouts = whiteouts[1:]
		}
		for _, o := range whiteouts {
			name := fmt.Sprintf("%s.%016x", st.Block_name_prefix, o)
			if _, err := w.IOCtx.Stat(name); !errors.Is(err, rados.ErrNotFound) {
				t.Errorf("stat %s at the head: %v, want ENOENT (a whiteout)", name, err)
			}
			if !listed[name] {
				t.Errorf("%s (no head, a clone at s1) is not listed: listing cannot find the objects of a delta", name)
			}
		}
	}
	for _, c := range []struct {
		name, ns string
		clone    bool
	}{{"plain", "", false}, {"namespace", "ns1", false}, {"clone", "", true}} {
		t.Run(c.name, func(t *testing.T) {
			w := oracle.NewWorkload(t, harness.OpenIOContext(t, conn, harness.Pool, c.ns), 41)
			w.Features = rbd.FeatureLayering
			w.NS = c.ns
			w.Walks = true
			var parent *oracle.Image
			if c.clone {
				parent = w.HazardImage(nil, 8*harness.ObjSize, 22)
				for o := uint64(0); o < 8; o += 2 {
					w.Write(parent, o*harness.ObjSize+harness.MiB, harness.MiB)
				}
				w.Snap(parent)
			}
			p := w.HazardImage(parent, 8*harness.ObjSize, 22)
			if err := p.Img.UpdateFeatures(rbd.FeatureFastDiff|rbd.FeatureObjectMap|rbd.FeatureExclusiveLock, false); err != nil {
				t.Fatalf("disable the object map of %s: %v", p.Name, err)
			}
			history(w, p, c.clone)
			w.CheckAll(srcs)
		})
	}
}
