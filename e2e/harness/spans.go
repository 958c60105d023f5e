//go:build e2e

package harness

// Spans: byte ranges of a volume, the unit the tests compare answers in:
// merged, clipped, rounded out to objects, subtracted and diffed.

import (
	"fmt"
	"slices"
	"sort"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
)

// Span is a byte range [Offset, Offset+Length) of a volume: a tuple of a
// stream, an extent of `rbd diff`, or a range of bytes that differ.
type Span = client.Extent

// SpanEnd is the first byte after s.
func SpanEnd(s Span) int64 { return s.Offset + s.Length }

// --------------------------------------------------------- span algebra --

// merge returns the union of spans as sorted, non-touching spans.
func MergeSpans(in []Span) []Span {
	s := append([]Span(nil), in...)
	sort.Slice(s, func(i, j int) bool { return s[i].Offset < s[j].Offset })
	out := []Span{}
	for _, e := range s {
		if e.Length <= 0 {
			continue
		}
		if n := len(out); n > 0 && e.Offset <= SpanEnd(out[n-1]) {
			out[n-1].Length = max(SpanEnd(out[n-1]), SpanEnd(e)) - out[n-1].Offset
			continue
		}
		out = append(out, e)
	}
	return out
}

// clip returns the parts of spans within [lo, hi).
func ClipSpans(in []Span, lo, hi int64) []Span {
	out := []Span{}
	for _, e := range in {
		o, n := max(e.Offset, lo), min(SpanEnd(e), hi)
		if o < n {
			out = append(out, Span{Offset: o, Length: n - o})
		}
	}
	return out
}

// blocks returns the aligned blocks of the given size that spans touch,
// ascending, each once.
func RoundOut(in []Span, size int64) []Span {
	out := []Span{}
	for _, e := range MergeSpans(in) {
		b := e.Offset - e.Offset%size
		if n := len(out); n > 0 && b < SpanEnd(out[n-1]) {
			b = SpanEnd(out[n-1])
		}
		for ; b < SpanEnd(e); b += size {
			out = append(out, Span{Offset: b, Length: size})
		}
	}
	return out
}

// Uncovered returns the parts of want that no span of have covers; have
// must be sorted and non-overlapping.
func Uncovered(want, have []Span) []Span {
	var out []Span
	for _, w := range MergeSpans(want) {
		off := w.Offset
		i := sort.Search(len(have), func(i int) bool { return SpanEnd(have[i]) > off })
		for ; off < SpanEnd(w) && i < len(have); i++ {
			h := have[i]
			if h.Offset > off {
				out = append(out, Span{Offset: off, Length: min(h.Offset, SpanEnd(w)) - off})
			}
			off = max(off, SpanEnd(h))
		}
		if off < SpanEnd(w) {
			out = append(out, Span{Offset: off, Length: SpanEnd(w) - off})
		}
	}
	return MergeSpans(out)
}

// TotalBytes is the sum of the spans' lengths.
func TotalBytes(in []Span) int64 {
	var n int64
	for _, e := range in {
		n += e.Length
	}
	return n
}

// DiffSpans returns "" when got equals want, else a go-cmp diff (-want
// +got) of a window around the first difference, so that lists of a
// million tuples compare fast and fail readably.
func DiffSpans(want, got []Span) string {
	if slices.Equal(want, got) {
		return ""
	}
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	lo := max(i-3, 0)
	w, g := want[lo:min(len(want), i+20)], got[lo:min(len(got), i+20)]
	return fmt.Sprintf("%d tuples, want %d; first difference at #%d; #%d.. (-want +got):\n%s",
		len(got), len(want), i, lo, cmp.Diff(w, g, cmpopts.EquateEmpty()))
}
