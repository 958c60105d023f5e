package precise

import (
	"fmt"
	"slices"
	"testing"
)

// modelObject is one RADOS object of an image without a parent, byte by
// byte, with the snap set RADOS keeps for it (PrimaryLogPG's
// make_writeable): the reference that FuzzDeltaSpans holds the rules to.
type modelObject struct {
	exists  bool
	content []byte // the head's bytes; 0 is a zero
	alloc   []bool // the head's allocated bytes (what mapext reports)
	seq     uint64 // the newest snapshot the object has seen
	clones  []cloneInfo
	// at holds the object as each snapshot saw it.
	at map[uint64]modelState
}

type modelState struct {
	exists  bool
	content []byte
	alloc   []bool
}

const modelSize = 48 // bytes per object in the model

// modify prepares a change of the head at snapshot sequence snap, as RADOS
// does before a write: the first change after a snapshot clones the head
// (when it exists) for the snapshots it saw since; then the change's range
// [lo, hi) leaves the newest clone's overlap.
func (m *modelObject) modify(snap uint64, snaps []uint64, lo, hi int64) {
	if snap > m.seq {
		if m.exists {
			var held []uint64
			for _, s := range snaps {
				if s > m.seq {
					held = append(held, s)
				}
			}
			m.clones = append(m.clones, cloneInfo{id: snap, snaps: held, size: int64(len(m.content)), overlap: []span{{0, int64(len(m.content))}}})
		}
		m.seq = snap
	}
	if n := len(m.clones); n > 0 && lo < hi {
		m.clones[n-1].overlap = subtract(m.clones[n-1].overlap, []span{{lo, hi - lo}})
	}
}

// snapSet is what list_snaps answers: the clones, then the head if it
// exists.
func (m *modelObject) snapSet() snapSet {
	ss := snapSet{clones: slices.Clone(m.clones), seq: m.seq}
	if m.exists {
		ss.clones = append(ss.clones, cloneInfo{id: snapHead, size: int64(len(m.content))})
	}
	return ss
}

// extents returns the allocated ranges of st.
func (st modelState) extents() []span {
	var out []span
	for i, a := range st.alloc {
		if a {
			out = append(out, span{int64(i), 1})
		}
	}
	return normalize(out)
}

// FuzzDeltaSpans runs random writes, zeroings, truncations, removals and
// snapshots on one object, then holds diffSnapSet and deltaSpans, fed
// what list_snaps and mapext would answer, to the bytes themselves: every
// byte that differs between the two snapshots is reported, and nothing is
// reported that no operation between them touched; taking out the holes
// at both snapshots (withoutHoles) misses nothing either.
func FuzzDeltaSpans(f *testing.F) {
	// ops are (kind, a, b, value): write a+b+1, zero a+b+1, truncate to
	// a, snapshot, remove (kind%6 of 0 or 1, 2, 3, 4, 5).
	const snap, remove = 4, 5
	for _, seed := range []struct {
		ops          []byte
		pick1, pick2 uint8
	}{
		{[]byte{0, 0, 39, 1, snap, 0, 0, 0, 0, 30, 4, 3, snap, 0, 0, 0}, 0, 1},                                         // a write inside
		{[]byte{0, 0, 39, 1, snap, 0, 0, 0, 2, 10, 9, 0, snap, 0, 0, 0}, 0, 1},                                         // a discard inside
		{[]byte{0, 0, 19, 1, snap, 0, 0, 0, remove, 0, 0, 0, snap, 0, 0, 0, 0, 5, 9, 7, snap, 0, 0, 0}, 0, 2},          // removed, then written again
		{[]byte{0, 0, 39, 1, snap, 0, 0, 0, 3, 12, 0, 0, snap, 0, 0, 0, 0, 30, 3, 5, snap, 0, 0, 0}, 0, 2},             // shrunk, then grown
		{[]byte{snap, 0, 0, 0, 0, 0, 7, 1, snap, 0, 0, 0}, 0, 1},                                                       // new
		{[]byte{0, 0, 7, 1, snap, 0, 0, 0, remove, 0, 0, 0, snap, 0, 0, 0}, 0, 1},                                      // gone
		{[]byte{0, 0, 7, 1, snap, 0, 0, 0, snap, 0, 0, 0, 0, 4, 9, 3, snap, 0, 0, 0, 0, 0, 1, 5, snap, 0, 0, 0}, 1, 3}, // a clone for two snapshots
	} {
		f.Add(seed.ops, seed.pick1, seed.pick2)
	}
	f.Fuzz(func(t *testing.T, ops []byte, pick1, pick2 uint8) {
		m := &modelObject{at: map[uint64]modelState{}}
		var (
			snaps   []uint64
			touched [][]span // per snapshot taken: what ops touched since the one before
			since   []span
			log     []string
		)
		for i := 0; i+3 < len(ops) && len(snaps) < 8; i += 4 {
			kind, a, b, v := ops[i]%6, int64(ops[i+1])%modelSize, int64(ops[i+2])%modelSize, ops[i+3]|1
			seq := uint64(len(snaps))
			size := int64(len(m.content))
			switch kind {
			case 0, 1: // write [a, a+b+1)
				lo, hi := a, min(a+b+1, modelSize)
				log = append(log, fmt.Sprintf("write %d+%d", lo, hi-lo))
				m.modify(seq, snaps, lo, hi)
				if !m.exists {
					m.exists, m.content, m.alloc = true, nil, nil
				}
				for int64(len(m.content)) < hi {
					m.content, m.alloc = append(m.content, 0), append(m.alloc, false)
				}
				for j := lo; j < hi; j++ {
					m.content[j], m.alloc[j] = v, true
				}
				since = append(since, span{lo, hi - lo})
			case 2: // zero [a, a+b+1) within the object
				if !m.exists {
					continue
				}
				lo, hi := min(a, size), min(a+b+1, size)
				log = append(log, fmt.Sprintf("zero %d+%d", lo, hi-lo))
				m.modify(seq, snaps, lo, hi)
				for j := lo; j < hi; j++ {
					m.content[j], m.alloc[j] = 0, false
				}
				since = append(since, span{lo, hi - lo})
			case 3: // truncate to a
				if !m.exists || a >= size {
					continue
				}
				log = append(log, fmt.Sprintf("truncate %d", a))
				m.modify(seq, snaps, a, size)
				m.content, m.alloc = m.content[:a], m.alloc[:a]
				since = append(since, span{a, size - a})
			case 4: // snapshot
				s := seq + 1
				log = append(log, fmt.Sprintf("snap %d", s))
				snaps = append(snaps, s)
				m.at[s] = modelState{m.exists, slices.Clone(m.content), slices.Clone(m.alloc)}
				touched, since = append(touched, normalize(since)), nil
			case 5: // remove
				if !m.exists {
					continue
				}
				log = append(log, "remove")
				m.modify(seq, snaps, 0, size)
				m.exists, m.content, m.alloc = false, nil, nil
				since = append(since, span{0, modelSize})
			}
		}
		if len(snaps) < 2 {
			return
		}
		i1, i2 := int(pick1)%len(snaps), int(pick2)%len(snaps)
		if i1 == i2 {
			return
		}
		i1, i2 = min(i1, i2), max(i1, i2)
		s1, s2 := snaps[i1], snaps[i2]
		st1, st2 := m.at[s1], m.at[s2]
		var mayChange []span // what the operations between s1 and s2 touched
		for _, t := range touched[i1+1 : i2+1] {
			mayChange = append(mayChange, t...)
		}
		mayChange = normalize(mayChange)

		ss := m.snapSet()
		od, err := diffSnapSet(ss, s1, s2)
		if err != nil {
			t.Fatalf("%v; snap set %+v: %v", log, ss, err)
		}
		if od.exists1 != st1.exists || od.exists2 != st2.exists ||
			(st1.exists && od.size1 != int64(len(st1.content))) || (st2.exists && od.size2 != int64(len(st2.content))) {
			t.Fatalf("%v; snap set %+v, %d..%d: %+v, want exists %v %v, sizes %d %d", log, ss, s1, s2, od, st1.exists, st2.exists, len(st1.content), len(st2.content))
		}
		var own1, own2 []span
		if st1.exists {
			own1 = st1.extents()
		}
		if st2.exists {
			own2 = st2.extents()
		}
		got := deltaSpans(od, own1, own2, nil, nil)

		var changed []span
		for b := 0; b < modelSize; b++ {
			var c1, c2 byte
			if b < len(st1.content) {
				c1 = st1.content[b]
			}
			if b < len(st2.content) {
				c2 = st2.content[b]
			}
			if c1 != c2 {
				changed = append(changed, span{int64(b), 1})
			}
		}
		changed = normalize(changed)
		if missed := subtract(changed, got); len(missed) > 0 {
			t.Fatalf("%v; %d..%d: reported %v, missed %v of the changed %v", log, s1, s2, got, missed, changed)
		}
		if extra := subtract(got, mayChange); len(extra) > 0 {
			t.Fatalf("%v; %d..%d: reported %v, of which %v no operation touched (touched %v)", log, s1, s2, got, extra, mayChange)
		}
		if od.exists1 && od.exists2 {
			// What delta.go does after a large change: holes at both
			// snapshots read as zeros at both, so they did not change.
			holed := withoutHoles(got, own1, own2, min(od.size1, od.size2))
			if missed := subtract(changed, holed); len(missed) > 0 {
				t.Fatalf("%v; %d..%d: without holes reported %v, missed %v of the changed %v", log, s1, s2, holed, missed, changed)
			}
		}
	})
}
