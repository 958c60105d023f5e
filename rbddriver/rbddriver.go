// Package rbddriver serves rbd's snapshots through the driver: it adapts
// rbd.Source to driver.Source. The two packages share no types, so that rbd
// needs neither gRPC nor the driver, and the driver no cgo; the adapter
// stands one floor above both (cmd/ and the e2e tests import it), so that
// neither imports the other.
package rbddriver

import (
	"context"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// New returns src as a driver.Source.
func New(src *rbd.Source) driver.Source { return source{src} }

type source struct{ src *rbd.Source }

func (s source) Open(ctx context.Context, req driver.OpenRequest) (driver.Diff, error) {
	d, err := s.src.Open(ctx, rbd.Request{Base: req.Base, Target: req.Target, Secrets: req.Secrets})
	if err != nil {
		return nil, err
	}
	return diff{d}, nil
}

type diff struct{ *rbd.Diff }

func (d diff) Iterate(ctx context.Context, offset int64, emit func(driver.Extent) error) error {
	return d.Diff.Iterate(ctx, offset, func(off, length int64) error {
		return emit(driver.Extent{Offset: off, Length: length})
	})
}

// The driver finds these by type assertion on the Diff that Open returns:
// Lineage, ResumeFrom, CheckFrom and Refinement come from the embedded
// *rbd.Diff (Refinement's type is the driver's, internal/report's). Losing
// one would not fail to compile anywhere else.
var (
	_ driver.Diff               = diff{}
	_ driver.RefinementReporter = diff{}
	_ driver.Lineager           = diff{}
	_ driver.SeamChecker        = diff{}
	_ driver.Resumer            = diff{}
)
