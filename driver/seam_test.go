package driver_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver/drivertest"
)

// seamRecorder counts resumes and seam mismatches.
type seamRecorder struct {
	resumeRecorder
	mu         sync.Mutex
	mismatches int
}

func (r *seamRecorder) SeamMismatch(string) { r.mu.Lock(); r.mismatches++; r.mu.Unlock() }

func (r *seamRecorder) mismatched() int { r.mu.Lock(); defer r.mu.Unlock(); return r.mismatches }

// TestSeamCheckHonest: with the seam check on (a SeamChecker Diff), an
// honest Source that fails at every extent, once and several times, in
// every mode, still gives the pages of an uninterrupted stream, and no
// mismatch.
func TestSeamCheckHonest(t *testing.T) {
	n := len(seamExtents)
	var faultSets [][]int
	for i := 1; i <= n; i++ {
		faultSets = append(faultSets, []int{i})
	}
	faultSets = append(faultSets, []int{1, 2, 3}, []int{2, 4, 6, 8, 10, 12}, []int{n, n + 1}, []int{3, 5, 7, 9, 11, 13, 15})
	for _, typ := range []struct {
		typ   csi.BlockMetadataType
		block int64
	}{{csi.BlockMetadataType_VARIABLE_LENGTH, 0}, {csi.BlockMetadataType_FIXED_LENGTH, 1024}, {csi.BlockMetadataType_FIXED_LENGTH, 3000}} {
		for _, check := range []int64{1, 3} {
			for _, start := range []int64{0, 160, 4200, 13000} {
				for _, max := range []int32{0, 1, 3} {
					src := drivertest.NewSource()
					src.Add(&drivertest.Volume{Capacity: 64 * 1024, ObjectSize: 4096, CheckObjects: check,
						Allocated: map[string][]driver.Extent{"a": nil, "b": seamExtents}, Delta: map[string][]driver.Extent{"a>b": seamExtents}})
					f := &faults{}
					src.BeforeExtent = f.before
					rec := &seamRecorder{}
					conn := serve(t, resumeDriver(t, src, typ.typ, typ.block, time.Minute, rec))
					req := &csi.GetMetadataDeltaRequest{BaseSnapshotId: "a", TargetSnapshotId: "b", StartingOffset: start, MaxResults: max}
					want, err := delta(t, conn, req)
					if err != nil {
						t.Fatal(err)
					}
					for _, fs := range faultSets {
						f.reset(fs)
						got, err := delta(t, conn, req)
						if err != nil {
							t.Fatalf("%v check %d start %d max %d, faults %v: %v", typ.typ, check, start, max, fs, err)
						}
						if d := cmp.Diff(pagesOf(want), pagesOf(got)); d != "" {
							t.Fatalf("%v check %d start %d max %d, faults %v: pages differ, -want +got:\n%s", typ.typ, check, start, max, fs, d)
						}
						waitClosed(t, src)
					}
					if m := rec.mismatched(); m != 0 {
						t.Fatalf("%v check %d start %d max %d: %d mismatches from an honest source", typ.typ, check, start, max, m)
					}
				}
			}
		}
	}
}

// holeVolume has one extent in each of 16 objects of 4096 bytes.
func holeVolume(check int64) (*drivertest.Source, []driver.Extent) {
	var ext []driver.Extent
	for o := int64(0); o < 16; o++ {
		ext = append(ext, driver.Extent{Offset: o*4096 + 100, Length: 200})
	}
	src := drivertest.NewSource()
	src.Add(&drivertest.Volume{Capacity: 16 * 4096, ObjectSize: 4096, CheckObjects: check,
		Allocated: map[string][]driver.Extent{"a": nil, "b": ext}, Delta: map[string][]driver.Extent{"a>b": ext}})
	return src, ext
}

// librbdHole makes the first diff of src behave as librbd's did in issue
// 27: the extents of objects 5 to 9 are left out (their requests timed
// out), object 10's is delivered, then the diff fails with a timeout.
// Later diffs are whole.
func librbdHole(src *drivertest.Source) {
	var mu sync.Mutex
	first := true
	src.BeforeExtent = func(_ context.Context, i int) error {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !first:
			return nil
		case 5 <= i && i < 10:
			return drivertest.ErrSkip
		case i == 11:
			first = false
			return drivertest.TemporaryError{Why: "timeout"}
		}
		return nil
	}
}

// TestSeamCheckCatchesHole: a Source whose failed diff left out extents
// before the last it delivered (as librbd does) makes the resumed stream
// end ABORTED, counted, with no diff left open, whether the check reaches
// back past the hole or only into it; never OK with a hole.
func TestSeamCheckCatchesHole(t *testing.T) {
	for _, check := range []int64{2, 8} {
		for _, typ := range []csi.BlockMetadataType{csi.BlockMetadataType_VARIABLE_LENGTH, csi.BlockMetadataType_FIXED_LENGTH} {
			src, _ := holeVolume(check)
			librbdHole(src)
			rec := &seamRecorder{}
			conn := serve(t, resumeDriver(t, src, typ, 1024, time.Minute, rec))
			got, err := delta(t, conn, &csi.GetMetadataDeltaRequest{BaseSnapshotId: "a", TargetSnapshotId: "b", MaxResults: 1})
			if status.Code(err) != codes.Aborted {
				t.Fatalf("check %d, %v: %d tuples, %v; want ABORTED", check, typ, len(got.tuples), err)
			}
			if rec.count() != 1 || rec.mismatched() != 1 {
				t.Fatalf("check %d, %v: %d resumes, %d mismatches; want 1 and 1", check, typ, rec.count(), rec.mismatched())
			}
			waitClosed(t, src)
		}
	}
}

// TestSeamHoleUnchecked shows what the check is for: without it, the same
// Source's hole reaches the client in a stream that ends OK.
func TestSeamHoleUnchecked(t *testing.T) {
	src, ext := holeVolume(0)
	librbdHole(src)
	conn := serve(t, resumeDriver(t, src, csi.BlockMetadataType_VARIABLE_LENGTH, 0, time.Minute, &resumeRecorder{}))
	got, err := delta(t, conn, &csi.GetMetadataDeltaRequest{BaseSnapshotId: "a", TargetSnapshotId: "b", MaxResults: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.tuples) != len(ext)-5 {
		t.Fatalf("%d tuples; the unchecked hole should leave %d", len(got.tuples), len(ext)-5)
	}
}
