package precise

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/report"
)

// TestRefinement: precise mode fills report.Refinement itself, the type
// that the driver logs and metrics counts, with a whole-image fallback's
// reason and detail and each object's fallback by reason.
func TestRefinement(t *testing.T) {
	if got := (*Refiner)(nil).Refinement(); !cmp.Equal(got, report.Refinement{}) {
		t.Errorf("nil Refiner: %+v, want nothing", got)
	}

	// Refused before any handle is opened: no cluster needed.
	r := Open(Image{LibrbdEncrypted: true}, Options{})
	got := r.Refinement()
	if r.Refines() || !got.On || got.ImageFallback != ReasonEncrypted || !strings.Contains(got.ImageFallbackDetail, "encrypted by librbd") {
		t.Errorf("librbd-encrypted image: Refines %v, %+v; want an image fallback for %q", r.Refines(), got, ReasonEncrypted)
	}

	r = &Refiner{}
	r.fellBack(reasoned{ReasonMapext, errors.New("mapext failed")})
	r.fellBack(errors.New("boom"))
	want := report.Refinement{On: true, ObjectFallbacks: map[string]int64{ReasonMapext: 1, ReasonError: 1}, LastObjectFallback: "boom"}
	if diff := cmp.Diff(want, r.Refinement()); diff != "" {
		t.Errorf("object fallbacks -want +got:\n%s", diff)
	}
	if n := r.Refinement().ObjectFallbackCount(); n != 2 {
		t.Errorf("ObjectFallbackCount %d, want 2", n)
	}
}
