package driver

import (
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
)

// reference computes, the slow and obvious way, what a stream from start
// over a volume of capacity limit must hold for the given extents: the
// merged runs of their union within [start, limit) for VARIABLE_LENGTH, or
// every grid block that the union touches for FIXED_LENGTH.
func reference(fixed bool, block, start, limit int64, extents []Extent) []Extent {
	var runs []Extent
	for _, e := range extents {
		off, end := max(e.Offset, start), min(e.Offset+e.Length, limit)
		if end <= off {
			continue
		}
		if n := len(runs); n > 0 && off <= runs[n-1].Offset+runs[n-1].Length {
			runs[n-1].Length = max(runs[n-1].Length, end-runs[n-1].Offset)
			continue
		}
		runs = append(runs, Extent{off, end - off})
	}
	if !fixed {
		return runs
	}
	var blocks []Extent
	for _, r := range runs {
		for b := r.Offset - r.Offset%block; b < r.Offset+r.Length; b += block {
			if n := len(blocks); n > 0 && blocks[n-1].Offset >= b {
				continue
			}
			blocks = append(blocks, Extent{b, block})
		}
	}
	return blocks
}

// checkPages checks the page invariants of the spec and of the pager, and
// returns the tuples.
func checkPages(t testing.TB, pages [][]*csi.BlockMetadata, pageSize int, fixed bool, block, start, limit int64) []Extent {
	t.Helper()
	var out []Extent
	for i, page := range pages {
		if len(page) == 0 || len(page) > pageSize {
			t.Fatalf("page %d has %d tuples, max %d", i, len(page), pageSize)
		}
		if i < len(pages)-1 && len(page) != pageSize {
			t.Fatalf("page %d of %d is short: %d tuples", i, len(pages), len(page))
		}
		for _, b := range page {
			e := Extent{b.ByteOffset, b.SizeBytes}
			if e.Length <= 0 {
				t.Fatalf("empty tuple %+v", e)
			}
			if fixed && (e.Length != block || e.Offset%block != 0) {
				t.Fatalf("tuple %+v is not a block of %d", e, block)
			}
			if n := len(out); n > 0 && e.Offset < out[n-1].Offset+out[n-1].Length {
				t.Fatalf("tuple %+v overlaps or precedes %+v", e, out[n-1])
			}
			if e.Offset >= limit {
				t.Fatalf("tuple %+v starts at or beyond capacity %d", e, limit)
			}
			out = append(out, e)
		}
	}
	if len(out) > 0 && out[0].Offset+out[0].Length <= start {
		t.Fatalf("first tuple %+v ends before starting offset %d", out[0], start)
	}
	return out
}

// FuzzPager feeds random ascending extents to the pager and compares what
// it sends with the reference.
func FuzzPager(f *testing.F) {
	f.Add(false, uint8(3), uint16(0), uint16(100), []byte{0, 5, 5, 5, 1, 3, 0, 10})
	f.Add(true, uint8(1), uint16(7), uint16(64), []byte{2, 3, 0, 1, 9, 9})
	f.Add(true, uint8(0), uint16(0), uint16(1), []byte{0, 1})
	f.Fuzz(func(t *testing.T, fixed bool, pageSize uint8, start, limit uint16, steps []byte) {
		size := int(pageSize%7) + 1
		block := int64(pageSize%5) + 1
		lim := int64(limit)
		st := int64(start) % (lim + 1)
		// steps are pairs of (gap, length): ascending, possibly adjacent
		// or overlapping (a negative gap), as a broken-up diff may be.
		var extents []Extent
		var pos int64
		for i := 0; i+1 < len(steps); i += 2 {
			off := pos + int64(int8(steps[i]))%4
			if len(extents) > 0 {
				off = max(off, extents[len(extents)-1].Offset)
			}
			off = max(off, 0)
			l := int64(steps[i+1]) % 17
			extents = append(extents, Extent{off, l})
			pos = off + l
		}
		var pages [][]*csi.BlockMetadata
		p := newPager(typeOf(fixed), block, st, lim, size, func(page []*csi.BlockMetadata) error {
			pages = append(pages, page)
			return nil
		})
		for _, e := range extents {
			if err := p.add(e); err != nil {
				t.Fatalf("add(%+v): %v", e, err)
			}
		}
		if err := p.finish(); err != nil {
			t.Fatal(err)
		}
		got := checkPages(t, pages, size, fixed, block, st, lim)
		want := reference(fixed, block, st, lim, extents)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("extents %v from %d to %d: -want +got:\n%s", extents, st, lim, diff)
		}
		var bytes int64
		for _, e := range got {
			bytes += e.Length
		}
		if p.tuples != len(got) || p.bytes != bytes || p.pages != len(pages) {
			t.Fatalf("counters %d/%d/%d, want %d/%d/%d", p.tuples, p.bytes, p.pages, len(got), bytes, len(pages))
		}
	})
}

func typeOf(fixed bool) csi.BlockMetadataType {
	if fixed {
		return csi.BlockMetadataType_FIXED_LENGTH
	}
	return csi.BlockMetadataType_VARIABLE_LENGTH
}

func TestPagerRefusesBrokenSources(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		p := newPager(typeOf(fixed), 4, 0, 100, 10, func([]*csi.BlockMetadata) error { return nil })
		if err := p.add(Extent{40, 4}); err != nil {
			t.Fatal(err)
		}
		if err := p.add(Extent{10, 4}); !errors.Is(err, errExtentOrder) {
			t.Errorf("fixed=%v: out of order extent: %v, want errExtentOrder", fixed, err)
		}
		if err := p.add(Extent{50, -1}); !errors.Is(err, errBadExtent) {
			t.Errorf("fixed=%v: negative length: %v, want errBadExtent", fixed, err)
		}
	}
}

// TestPagerSendError checks that a failed send stops the stream: the
// error reaches the diff, which must then stop.
func TestPagerSendError(t *testing.T) {
	errSend := errors.New("client gone")
	p := newPager(csi.BlockMetadataType_FIXED_LENGTH, 1, 0, 1000, 2, func([]*csi.BlockMetadata) error { return errSend })
	if err := p.add(Extent{0, 10}); !errors.Is(err, errSend) {
		t.Fatalf("add: %v, want the send error", err)
	}
}

func BenchmarkPagerVariable(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		p := newPager(csi.BlockMetadataType_VARIABLE_LENGTH, 0, 0, 1<<40, defaultPage, func([]*csi.BlockMetadata) error { return nil })
		for i := range int64(100000) {
			_ = p.add(Extent{i * 8192, 4096})
		}
		_ = p.finish()
	}
}

func BenchmarkPagerFixed(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		p := newPager(csi.BlockMetadataType_FIXED_LENGTH, 4096, 0, 1<<40, defaultPage, func([]*csi.BlockMetadata) error { return nil })
		for i := range int64(100000) {
			_ = p.add(Extent{i * 8192, 4096})
		}
		_ = p.finish()
	}
}

// BenchmarkEncode marshals full pages as gRPC does when a page is sent.
func BenchmarkEncode(b *testing.B) {
	b.ReportAllocs()
	page := newPage(defaultPage)[:defaultPage]
	for i, t := range page {
		t.ByteOffset, t.SizeBytes = int64(i)*1<<20, 65536
	}
	msg := &csi.GetMetadataDeltaResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: 1 << 40, BlockMetadata: page}
	var n int
	for b.Loop() {
		buf, err := proto.Marshal(msg)
		if err != nil {
			b.Fatal(err)
		}
		n = len(buf)
	}
	b.ReportMetric(float64(n)/defaultPage, "bytes/tuple")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/defaultPage, "ns/tuple")
}
