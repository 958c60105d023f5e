// Package report declares what precise mode did, in one type that precise
// mode fills (rbd/precise), the driver reports (its log line and
// observers) and metrics counts: a leaf that each of them may import, so
// that the server, which imports metrics, depends on no driver, and
// metrics and the driver on no Ceph.
package report

// Refinement is what precise mode did in one Diff or, added up, in one
// stream. Its fields keep their names from precise mode to the log line
// (docs/metrics.md names the log keys).
type Refinement struct {
	// On is set when the Diff was asked to refine; the rest is zero
	// otherwise.
	On bool
	// Candidates says where a delta's candidate objects came from
	// ("existence" or "object map"); without a usable object map
	// (Allocated too) "listing" (the objects RADOS lists) or "walk" (every
	// object number); otherwise empty.
	Candidates string
	// Objects counts the objects refined.
	Objects int64
	// Checksummed counts the object queries answered from per-4 KiB
	// checksums, which make the OSDs read the data, because the pool
	// refused mapext (an erasure-coded data pool).
	Checksummed int64
	// ImageFallback is the short reason why the whole image got librbd's
	// exact answer instead (for example "striping"), ImageFallbackDetail
	// the long one; both empty when it was refined.
	ImageFallback, ImageFallbackDetail string
	// ObjectFallbacks counts, by short reason, the objects reported whole
	// because refining them failed; LastObjectFallback is the error of the
	// last of these.
	ObjectFallbacks    map[string]int64
	LastObjectFallback string
}

// ObjectFallbackCount is how many objects were reported whole: the sum of
// ObjectFallbacks.
func (r Refinement) ObjectFallbackCount() int64 {
	var n int64
	for _, c := range r.ObjectFallbacks {
		n += c
	}
	return n
}
