package rbd

import (
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/report"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/precise"
)

// How precise mode finds the candidates of an image without a usable
// object map (Options.Walk); see package precise.
const (
	WalkAuto   = precise.WalkAuto
	WalkList   = precise.WalkList
	WalkProbe  = precise.WalkProbe
	WalkLibrbd = precise.WalkLibrbd
)

// openPrecise prepares precise mode (package precise) after open: the image as
// plain values, from which precise mode opens handles of its own. When it
// cannot refine, the Diff runs librbd's exact diff and Refinement says
// why. Only failing to read what a shrink cut off is an error.
func (d *Diff) openPrecise() error {
	t := d.target
	// The image's ID as the lineage read it (the target's first link): a
	// snapshot named by the native form carries none, and only a format 1
	// image has none.
	img := precise.Image{Conn: d.cc.Rados(), Pool: t.pool, Namespace: t.namespace, ID: d.lineages[0][0].imageID, Name: t.image, Spec: t.imageSpec(),
		Target: t.snapID, Size: d.capacity + d.header, Header: d.header}
	if d.header == 0 {
		img.LibrbdEncrypted = librbdEncrypted(d.image)
	}
	if d.base != nil {
		img.Base = d.base.snapID
		lo, hi, err := d.cutOff()
		if err != nil {
			return err
		}
		img.Shrunk = [2]int64{lo, hi}
	}
	d.refine = precise.Open(img, precise.Options{TrustObjectMap: d.trustObjectMap, Walk: d.walk})
	if !d.refine.Refines() {
		d.whole = false // librbd's exact diff
	}
	return nil
}

// Refinement describes precise mode's work on this Diff so far
// (driver.RefinementReporter): On is false when precise mode is off.
func (d *Diff) Refinement() report.Refinement {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refine.Refinement()
}
