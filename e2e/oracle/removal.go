//go:build e2e

package oracle

// The "concurrent removal" scenario: a snapshot removed, and purged by
// the OSDs, while Deltas to or from it run in every mode.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// RemoveDuring is the "concurrent removal" kind of TestPreciseOracle's
// histories (issue 20): once the queries are checked, a Delta between two
// random snapshots of the last image runs in every mode at once, each
// stopped at its first extent; then the base or the target (at random) is
// removed and the OSDs purge it, and the Deltas go on. Each must fail with
// fs.ErrNotExist (NOT_FOUND) or give every changed byte.
func (w *Workload) RemoveDuring(srcs map[string]*rsm.Source, tot *Totals) {
	t := w.T
	if !w.removing {
		return
	}
	p := w.Images[len(w.Images)-1]
	i := w.Rng.IntN(len(p.Snaps) - 1)
	base, target := p.Snaps[i], p.Snaps[i+1+w.Rng.IntN(len(p.Snaps)-1-i)]
	gone := []string{base, target}[w.Rng.IntN(2)]
	w.Logf("concurrent removal of %s under Delta %s..%s", gone, base, target)

	type run struct {
		mode string
		got  []Extent
		err  error
	}
	var (
		runs    []*run
		wg      sync.WaitGroup
		stalled sync.WaitGroup
		release = make(chan struct{})
	)
	for _, m := range Modes {
		d, err := srcs[m.Name].Open(context.Background(), w.request(p, base, target))
		if err != nil {
			t.Fatalf("%s: open %s..%s: %v", m.Name, base, target, err)
		}
		r := &run{mode: m.Name}
		runs = append(runs, r)
		wg.Add(1)
		stalled.Add(1)
		go func() {
			defer wg.Done()
			defer d.Close()
			first := true
			r.err = d.Iterate(context.Background(), 0, func(off, length int64) error {
				if first {
					first = false
					stalled.Done()
					<-release
				}
				r.got = append(r.got, Extent{off, length})
				return nil
			})
			if first {
				stalled.Done() // no extent at all
			}
		}()
	}
	stalled.Wait()
	id, err := p.Img.GetSnapID(gone)
	if err != nil {
		t.Fatalf("ID of %s@%s: %v", p.Name, gone, err)
	}
	st, err := p.Img.Stat()
	if err != nil {
		t.Fatal(err)
	}
	// The objects read last: those the trim must reach before they are.
	objs := imageObjects(t, w.NS, st.Block_name_prefix, 4)
	if err := p.Img.GetSnapshot(gone).Remove(); err != nil {
		t.Fatalf("remove %s@%s: %v", p.Name, gone, err)
	}
	p.Snaps = slices.DeleteFunc(p.Snaps, func(s string) bool { return s == gone })
	w.Logf("snapshot %d trimmed in %v", id, harness.WaitTrimmed(t, w.NS, id, objs...))
	close(release)
	wg.Wait()

	tot.removals++
	before, after := w.data[base], w.data[target]
	for _, r := range runs {
		what := fmt.Sprintf("%s %s..%s of %s, %s removed meanwhile", r.mode, base, target, p.Name, gone)
		switch {
		case errors.Is(r.err, fs.ErrNotExist):
			tot.remRefused++
			if !strings.Contains(r.err.Error(), "removed while") {
				t.Errorf("%s: %v: the error does not say the snapshot went while the diff ran", what, r.err)
			}
		case r.err != nil:
			t.Errorf("%s: %v, want fs.ErrNotExist (NOT_FOUND) or every changed byte", what, r.err)
		default:
			tot.remAnswered++
			missed, first := Missed(before, after, r.got, 0)
			tot.remMissed += missed
			if missed != 0 {
				t.Errorf("%s: succeeded but missed %d bytes (first at %d); reported %v", what, missed, first, r.got)
			}
		}
	}
}

// imageObjects returns the names of the last n objects (by name, which
// orders them by object number) of the image whose block name prefix is
// prefix, in namespace ns of the test pool.
func imageObjects(t *testing.T, ns, prefix string, n int) []string {
	t.Helper()
	args := []string{"-p", harness.Pool}
	if ns != "" {
		args = append(args, "-N", ns)
	}
	out, err := exec.Command("rados", append(args, "ls")...).CombinedOutput()
	if err != nil {
		t.Fatalf("rados ls: %v\n%s", err, out)
	}
	var objs []string
	for _, o := range strings.Fields(string(out)) {
		if strings.HasPrefix(o, prefix+".") {
			objs = append(objs, o)
		}
	}
	slices.Sort(objs)
	return objs[max(0, len(objs)-n):]
}
