package precise

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestChunkRange: the whole chunks hashed never run past the object's end
// (the OSD answers EINVAL there), and with the short last chunk they
// cover [off, off+length) within the object.
func TestChunkRange(t *testing.T) {
	for _, c := range []struct {
		off, length, size int64
		lo, hi, end       int64
	}{
		{0, 4 << 20, 4 << 20, 0, 4 << 20, 4 << 20},
		{0, 4 << 20, 5100, 0, 4096, 5100},
		{5000, 100, 5100, 4096, 4096, 5100},
		{4096, 4096, 5100, 4096, 4096, 5100},
		{100, 50, 4096, 0, 0, 150},
		{100, 5000, 4096, 0, 4096, 4096},
		{8192, 4096, 5100, 8192, 8192, 5100},
		{0, 4 << 20, 0, 0, 0, 0},
	} {
		lo, hi, end := chunkRange(c.off, c.length, c.size)
		if lo != c.lo || hi != c.hi || end != c.end {
			t.Errorf("chunkRange(%d, %d, %d) = %d, %d, %d; want %d, %d, %d", c.off, c.length, c.size, lo, hi, end, c.lo, c.hi, c.end)
		}
		if lo < hi && (hi > c.size || (hi-lo)%dataChunk != 0) {
			t.Errorf("chunkRange(%d, %d, %d): hashes [%d, %d), past the end or not whole chunks", c.off, c.length, c.size, lo, hi)
		}
	}
}

// TestNonZeroSpans: chunks that hash as zeros are dropped, others and the
// short last chunk kept, all clipped to the range asked.
func TestNonZeroSpans(t *testing.T) {
	const data = 1 // any hash but zeroSum
	for _, c := range []struct {
		name             string
		off, lo, hi, end int64
		sums             []uint64
		want             []span
	}{
		{"zeros", 0, 0, 12288, 12288, []uint64{zeroSum, zeroSum, zeroSum}, nil},
		{"middle chunk", 0, 0, 12288, 12288, []uint64{zeroSum, data, zeroSum}, []span{{4096, 4096}}},
		{"adjacent merge", 0, 0, 12288, 12288, []uint64{data, data, zeroSum}, []span{{0, 8192}}},
		{"short tail kept", 0, 0, 4096, 5100, []uint64{zeroSum}, []span{{4096, 1004}}},
		{"clipped to off", 5000, 4096, 8192, 8192, []uint64{data}, []span{{5000, 3192}}},
		{"only a tail", 5000, 4096, 4096, 5100, nil, []span{{5000, 100}}},
		{"nothing left", 8192, 8192, 8192, 5100, nil, nil},
	} {
		if diff := cmp.Diff(c.want, nonZeroSpans(c.off, c.lo, c.hi, c.end, c.sums), cmp.AllowUnexported(span{})); diff != "" {
			t.Errorf("%s: -want +got:\n%s", c.name, diff)
		}
	}
}
