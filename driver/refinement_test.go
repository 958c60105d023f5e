package driver_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
)

// refiningSource wraps a Source so that its Diffs report a refinement.
type refiningSource struct {
	driver.Source
	ref driver.Refinement
}

type refiningDiff struct {
	driver.Diff
	ref driver.Refinement
}

func (d refiningDiff) Refinement() driver.Refinement { return d.ref }

func (s refiningSource) Open(ctx context.Context, req driver.OpenRequest) (driver.Diff, error) {
	d, err := s.Source.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	return refiningDiff{d, s.ref}, nil
}

type refinedRecorder struct {
	recorder
	mu      sync.Mutex
	refined map[string]driver.Refinement
}

func (r *refinedRecorder) Refined(method string, ref driver.Refinement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refined[method] = ref
}

// TestObserverGetsRefinement: a Diff's refinement, fallbacks included,
// reaches an Observer that records refinements, under the RPC's name.
func TestObserverGetsRefinement(t *testing.T) {
	ref := driver.Refinement{On: true, Candidates: "existence", Objects: 7, Checksummed: 3, ObjectFallbacks: map[string]int64{"checksum": 2}, LastObjectFallback: "boom"}
	rec := &refinedRecorder{refined: map[string]driver.Refinement{}}
	d, err := driver.New(refiningSource{fixture(), ref}, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	conn := serve(t, d)
	if _, err := delta(t, conn, &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]driver.Refinement{driver.MethodDelta: ref}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		rec.mu.Lock()
		got := map[string]driver.Refinement{}
		for k, v := range rec.refined {
			got[k] = v
		}
		rec.mu.Unlock()
		if len(got) == 1 || time.Now().After(deadline) {
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("-want +got:\n%s", diff)
			}
			return
		}
	}
}
