// Package report declares what the driver reports of a stream to its
// observers, where both the driver and the metrics that count it (which
// the server imports) may use it: the server then depends on no driver.
package report

// Refinement is what precise mode did in one stream.
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
