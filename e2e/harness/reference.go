//go:build e2e

package harness

// The references the server's answers are judged against: `rbd diff`
// (librbd's own diff, through the command line) and the bytes of the
// snapshots themselves (the byte oracle).

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ceph/go-ceph/rbd"
)

// ------------------------------------------------------------ rbd diff --

// RbdDiffOf returns `rbd diff [--from-snap from] SPEC@to --format json
// [--whole-object]`: with from empty, every extent of the snapshot (a
// clone's parent data included).
func RbdDiffOf(t testing.TB, v RbdVolume, from, to string, wholeObject bool) []Extent {
	t.Helper()
	args := []string{"diff", v.Spec() + "@" + to, "--format", "json"}
	if from != "" {
		args = append(args, "--from-snap", from)
	}
	if wholeObject {
		args = append(args, "--whole-object")
	}
	var raw []struct {
		Offset uint64 `json:"offset"`
		Length uint64 `json:"length"`
		Exists string `json:"exists"`
	}
	out := RbdCLI(t, args...)
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("rbd %s: bad JSON %q: %v", strings.Join(args, " "), out, err)
	}
	got := make([]Extent, 0, len(raw))
	for _, e := range raw {
		got = append(got, Extent{e.Offset, e.Length, e.Exists == "true"})
	}
	return got
}

// WantFromRbdDiff is what the server must stream, given `rbd diff`'s
// extents: all of them for a delta (a discarded object, exists=false, is a
// change), only those with data for allocated; merged, as VARIABLE_LENGTH
// merges adjacent extents.
func WantFromRbdDiff(ext []Extent, delta bool) []Span {
	var s []Span
	for _, e := range ext {
		if delta || e.Exists {
			s = append(s, Span{Offset: int64(e.Offset), Length: int64(e.Length)})
		}
	}
	return MergeSpans(s)
}

// ------------------------------------------------------ the byte oracle --

// OracleBlock is the granularity at which the oracle reads and reports.
const OracleBlock = 4096

// SnapReader reads one snapshot of a volume through librbd.
type SnapReader struct {
	Img  *rbd.Image
	Size int64
}

// OpenSnap opens snapshot snap of v read-only until the test ends, to
// read the bytes the server's answers are judged against.
func OpenSnap(t testing.TB, v RbdVolume, snap string) *SnapReader {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(v.IOCtx, v.Name, snap)
	if err != nil {
		t.Fatalf("open %s@%s: %v", v.Spec(), snap, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	size, err := img.GetSize()
	if err != nil {
		t.Fatalf("size of %s@%s: %v", v.Spec(), snap, err)
	}
	return &SnapReader{Img: img, Size: int64(size)}
}

// ReadAt fills buf from off; bytes past the snapshot's end read as zeros.
func (r *SnapReader) ReadAt(t testing.TB, buf []byte, off int64) {
	t.Helper()
	clear(buf)
	if off >= r.Size {
		return
	}
	n := min(int64(len(buf)), r.Size-off)
	got, err := r.Img.ReadAt(buf[:n], off)
	if err != nil && !(errors.Is(err, io.EOF) && int64(got) == n) {
		t.Fatalf("read %d+%d of %s: n=%d, %v", off, n, r.Img.GetName(), got, err)
	}
	if int64(got) != n {
		t.Fatalf("read %d+%d of %s: short read of %d bytes", off, n, r.Img.GetName(), got)
	}
}

// ChangedBytes is the byte-level truth: the ranges of [0, size of to) whose
// bytes differ between snapshots from and to of v, read through librbd (a
// snapshot ends in zeros past its size), or, with from empty, the ranges of
// to that are not zero. Each range is exact to the byte.
func ChangedBytes(t testing.TB, v RbdVolume, from, to string) []Span {
	t.Helper()
	target := OpenSnap(t, v, to)
	var base *SnapReader
	if from != "" {
		base = OpenSnap(t, v, from)
	}
	const chunk = 4 << 20
	a, b := make([]byte, chunk), make([]byte, chunk)
	var out []Span
	add := func(off, n int64) {
		if k := len(out); k > 0 && SpanEnd(out[k-1]) == off {
			out[k-1].Length += n
			return
		}
		out = append(out, Span{Offset: off, Length: n})
	}
	for off := int64(0); off < target.Size; off += chunk {
		n := min(int64(chunk), target.Size-off)
		target.ReadAt(t, b[:n], off)
		if base != nil {
			base.ReadAt(t, a[:n], off)
		} else {
			clear(a[:n])
		}
		for blk := int64(0); blk < n; blk += OracleBlock {
			e := min(blk+OracleBlock, n)
			if bytes.Equal(a[blk:e], b[blk:e]) {
				continue
			}
			EachRun(a[blk:e], b[blk:e], off+blk, add)
		}
	}
	return out
}

// EachRun calls fn for each run of bytes where x and y (of one length)
// differ, at off plus the run's index: the byte oracle's one comparison.
func EachRun(x, y []byte, off int64, fn func(off, n int64)) {
	for i := 0; i < len(x); {
		if x[i] == y[i] {
			i++
			continue
		}
		j := i + 1
		for j < len(x) && x[j] != y[j] {
			j++
		}
		fn(off+int64(i), int64(j-i))
		i = j
	}
}

// OracleMisses returns the changed bytes (ChangedBytes) that tuples do not
// cover, rounded out to whole oracle blocks for the message.
func OracleMisses(changed, tuples []Span) []Span {
	return RoundOut(Uncovered(changed, MergeSpans(tuples)), OracleBlock)
}
