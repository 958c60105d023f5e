package driver

import (
	"fmt"
)

// The seam check: a resumed stream re-reads some of what it already has,
// and compares.
//
// A stream resumed after a failed diff goes on from the end of the
// extents that diff delivered, and relies on the Source for them being a
// complete prefix of the answer (rbd holds librbd's extents back until
// they are: librbd's own are not, see issue 27). The check does not rely
// on it. When the Diff is a SeamChecker, the driver keeps the extents it
// received from the last units before the end of what it received, and
// the re-opened diff starts that many units earlier (CheckFrom): what it
// delivers there must be covered by what was received (or, with a
// Resumer, fall in a unit of which something was received). A Source that lost
// extents before a failure then has them in the re-read, and the stream
// ends ABORTED (ask again) instead of OK with a hole; the mismatch is
// logged and counted (SeamObserver). The snapshots are immutable, so an
// honest Source never fails the check.

// SeamChecker is implemented by a Diff that says where a resumed stream
// re-reads from to check its seam: CheckFrom(offset) is the start of a
// unit at or below Resumer's ResumeFrom(offset), some units before it.
// An Iterate from there reports each unit exactly as an uninterrupted
// Iterate did. Without SeamChecker, there is no check.
type SeamChecker interface {
	CheckFrom(offset int64) int64
}

// SeamObserver is an Observer that also counts the streams that ended
// ABORTED because a resumed diff disagreed with what they had received.
type SeamObserver interface {
	SeamMismatch(method string)
}

// maxSeamExtents bounds the extents a stream keeps for its seam check
// (16 bytes each, so 1 MiB; trimEvery more between trims): a check range
// with more extents than that is not checked.
const maxSeamExtents = 1 << 16

// seam is one stream's check.
type seam struct {
	// recent are the last extents received, at most maxSeamExtents, in
	// order: those that end after the check range of the end of what
	// was received.
	recent []Extent
	// dropped is the end of the last extent dropped for the bound: no
	// check starts below it.
	dropped   int64
	sinceTrim int // extents recorded since the last trim

	checking bool
	until    int64    // the resume point: the bytes below it are checked
	want     []Extent // what was received in [from, until)
	n        int      // want[:n] end before what is checked next
	upTo     int64    // checked and covered up to here
	// units are the starts of the units (Resumer) of want, ascending;
	// unitOf names them, nil when the Diff is no Resumer.
	units  []int64
	u      int // units[:u] lie before what is checked next
	unitOf func(int64) int64
}

// record keeps e, which the stream received. Every trimEvery extents,
// and at the bound, it drops what lies before the check range of the end
// of e: asking the Diff costs more than keeping a few more extents.
func (s *seam) record(diff Diff, e Extent) {
	c, ok := diff.(SeamChecker)
	if !ok {
		return
	}
	s.recent = append(s.recent, e)
	if s.sinceTrim++; s.sinceTrim < trimEvery && len(s.recent) <= maxSeamExtents {
		return
	}
	s.sinceTrim = 0
	from := c.CheckFrom(e.Offset + e.Length)
	i := 0
	for i < len(s.recent) && s.recent[i].Offset+s.recent[i].Length <= from {
		i++
	}
	if over := len(s.recent) - i - maxSeamExtents; over > 0 {
		i += over
		s.dropped = s.recent[i-1].Offset + s.recent[i-1].Length
	}
	if i > 0 {
		s.recent = append(s.recent[:0], s.recent[i:]...)
	}
}

// trimEvery is how many extents record takes between two trims.
const trimEvery = 1024

// begin starts the check of a stream resumed at until, whose diff would
// go on from from: it returns where the diff goes on from instead, start
// at the lowest.
func (s *seam) begin(diff Diff, start, until, from int64) int64 {
	c, ok := diff.(SeamChecker)
	if !ok {
		return from
	}
	cf := max(start, c.CheckFrom(until))
	if cf >= from || cf < s.dropped {
		return from
	}
	s.want, s.units, s.unitOf = s.want[:0], s.units[:0], nil
	if rs, ok := diff.(Resumer); ok {
		s.unitOf = rs.ResumeFrom
	}
	for _, e := range s.recent {
		if e.Offset+e.Length <= cf || e.Offset >= until {
			continue
		}
		if e.Offset < cf {
			e.Length -= cf - e.Offset
			e.Offset = cf
		}
		s.want = append(s.want, e)
		if s.unitOf != nil {
			for _, u := range [2]int64{s.unitOf(e.Offset), s.unitOf(e.Offset + e.Length - 1)} {
				if n := len(s.units); n == 0 || s.units[n-1] < u {
					s.units = append(s.units, u)
				}
			}
		}
	}
	s.checking, s.until, s.n, s.upTo, s.u = true, until, 0, cf, 0
	return cf
}

// check takes an extent of the resumed diff while the check runs: its
// bytes before the resume point must be covered by what the stream
// received (a resumed diff that ends before the resume point with less
// than was received has no hole). It reports whether the check is over, so that e goes on to
// the pager (which drops what lies before the resume point); an extent
// that ends at or below the resume point goes no further (the stream has
// it).
func (s *seam) check(e Extent) (over bool, err error) {
	if !s.covered(e.Offset, min(e.Offset+e.Length, s.until)) {
		s.checking = false
		return false, errSeamMismatch{until: s.until, got: e}
	}
	if e.Offset+e.Length <= s.until {
		return false, nil
	}
	s.checking = false
	return true, nil
}

// covered reports whether the extents received cover [off, end). Calls
// come in ascending order of off, as a diff's extents do. A stream that
// received more (precise mode's fallback before the failure, refined
// after it) reported more than changed, which is allowed. A byte that the
// resumed diff has and the stream lacks is a hole, unless the Diff is a
// Resumer and the stream received something of that byte's unit: every
// hole known is whole units (a librbd request that failed, a precise job
// that did not run), and a unit received in part differs only in
// precision (a fallback in the re-read where the first read refined).
func (s *seam) covered(off, end int64) bool {
	pos := max(off, s.upTo)
	for pos < end {
		for s.n < len(s.want) && s.want[s.n].Offset+s.want[s.n].Length <= pos {
			s.n++
		}
		if s.n < len(s.want) && s.want[s.n].Offset <= pos {
			pos = s.want[s.n].Offset + s.want[s.n].Length
		} else if s.receivedUnit(pos) {
			next := end
			if s.n < len(s.want) {
				next = min(end, s.want[s.n].Offset)
			}
			pos = s.unitEnd(pos, next)
		} else {
			return false
		}
		s.upTo = pos
	}
	return true
}

// unitEnd returns where the unit of pos ends, or limit if that is
// sooner: the least x in (pos, limit] of another unit (units ascend with
// offsets), found by bisection.
func (s *seam) unitEnd(pos, limit int64) int64 {
	u := s.unitOf(pos)
	if s.unitOf(limit-1) == u {
		return limit
	}
	lo, hi := pos, limit-1 // unitOf(lo) == u, unitOf(hi) != u
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if s.unitOf(mid) == u {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// receivedUnit reports whether the stream received an extent of the unit
// of pos, when the Diff names units. Calls come in ascending order of pos.
func (s *seam) receivedUnit(pos int64) bool {
	if s.unitOf == nil {
		return false
	}
	u := s.unitOf(pos)
	for s.u < len(s.units) && s.units[s.u] < u {
		s.u++
	}
	return s.u < len(s.units) && s.units[s.u] == u
}

// errSeamMismatch ends a stream whose resumed diff has bytes before the
// resume point that the stream did not receive: ABORTED, since asking
// again gives a right answer.
type errSeamMismatch struct {
	until int64
	got   Extent // the resumed diff's extent that the stream lacks, in part
}

func (e errSeamMismatch) Error() string {
	return fmt.Sprintf(msgSeamMismatch, e.until, e.got.Offset, e.got.Length)
}

func (errSeamMismatch) Aborted() bool { return true }
