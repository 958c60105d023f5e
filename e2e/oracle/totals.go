//go:build e2e

package oracle

// The totals of the oracle's queries, per mode and per kind of history,
// and the table TestPreciseOracle prints.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// Tally sums one mode over the queries it ran, which for a walk variant
// of precise mode are those precise mode walked (Workload.Check).
type Tally struct {
	queries          int
	truth            int64 // the truly changed bytes of its queries, in 4 KiB blocks
	reported, missed int64
	dur              time.Duration
	// Reported bytes that did not change: zero on both sides (written
	// zeros, zeroed zeros), or the same data (rewritten unchanged).
	zeros, same int64
}

// Totals sums the queries of many histories: per mode, per kind of history,
// and from offsets inside objects, for the oracle's table.
type Totals struct {
	Truth     [2]int64 // 4 KiB-block changed bytes: allocated, delta
	exact     [2]int64 // byte-exact changed bytes
	Queries   [2]int
	Modes     map[string]*[2]Tally
	histories int // within a kind
	// checksummed counts precise mode's object queries answered by
	// checksums (a pool that refuses mapext: EC).
	Checksummed int64

	kinds   map[string]*Totals // per kind of history
	offsets map[string]*preciseOffsetTally
	// Images prepared for migration, and their queries per mode: refused
	// (FAILED_PRECONDITION) or answered, with the bytes missed.
	migrations, migRefused, migAnswered int
	migMissed                           int64
	// Concurrent removals: Deltas whose base or target went while they
	// ran, per mode, refused (NOT_FOUND) or answered, with the bytes
	// missed.
	removals, remRefused, remAnswered int
	remMissed                         int64

	mu sync.Mutex // Add's, for histories that run in parallel
}

// preciseOffsetTally sums one mode's Iterate calls from an offset inside
// an object.
type preciseOffsetTally struct {
	queries                 int
	truth, reported, missed int64 // after the offset; truth in 4 KiB blocks
	startsBefore, differs   int
}

// NewTotals returns empty totals, with a row for each of Modes.
func NewTotals() *Totals {
	tot := &Totals{Modes: map[string]*[2]Tally{}, offsets: map[string]*preciseOffsetTally{}}
	for _, m := range Modes {
		tot.Modes[m.Name] = &[2]Tally{}
		tot.offsets[m.Name] = &preciseOffsetTally{}
	}
	return tot
}

// Add adds o's figures, every one of them, to tot's: the totals of a
// history that ran in parallel with others (Parallel) into its test's.
// Safe for concurrent use; a field added to Totals is added here too.
func (tot *Totals) Add(o *Totals) {
	tot.mu.Lock()
	defer tot.mu.Unlock()
	tot.add(o)
}

func (tot *Totals) add(o *Totals) {
	for i := range 2 {
		tot.Truth[i] += o.Truth[i]
		tot.exact[i] += o.exact[i]
		tot.Queries[i] += o.Queries[i]
	}
	for name, x := range o.Modes {
		y := tot.Modes[name]
		for i := range x {
			y[i].queries += x[i].queries
			y[i].truth += x[i].truth
			y[i].reported += x[i].reported
			y[i].missed += x[i].missed
			y[i].dur += x[i].dur
			y[i].zeros += x[i].zeros
			y[i].same += x[i].same
		}
	}
	tot.histories += o.histories
	tot.Checksummed += o.Checksummed
	for k, x := range o.kinds {
		tot.kind(k).add(x)
	}
	for name, x := range o.offsets {
		y := tot.offsets[name]
		y.queries += x.queries
		y.truth += x.truth
		y.reported += x.reported
		y.missed += x.missed
		y.startsBefore += x.startsBefore
		y.differs += x.differs
	}
	tot.migrations += o.migrations
	tot.migRefused += o.migRefused
	tot.migAnswered += o.migAnswered
	tot.migMissed += o.migMissed
	tot.removals += o.removals
	tot.remRefused += o.remRefused
	tot.remAnswered += o.remAnswered
	tot.remMissed += o.remMissed
}

// kind returns the totals of one kind of history, made on first use.
func (tot *Totals) kind(k string) *Totals {
	if tot.kinds == nil {
		tot.kinds = map[string]*Totals{}
	}
	if tot.kinds[k] == nil {
		tot.kinds[k] = NewTotals()
	}
	return tot.kinds[k]
}

// Table prints the totals per mode, then per kind of history, then those
// of Iterate from an offset inside an object and of migrating images.
func (tot *Totals) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "precision over %d allocated and %d delta queries (truly changed: %s allocated, %s delta in 4 KiB blocks; %s and %s byte-exact)\n",
		tot.Queries[0], tot.Queries[1], MiB(tot.Truth[0]), MiB(tot.Truth[1]), MiB(tot.exact[0]), MiB(tot.exact[1]))
	if tot.Checksummed > 0 {
		fmt.Fprintf(&b, "precise mode: %d object queries answered by checksums (the pool refuses mapext)\n", tot.Checksummed)
	}
	fmt.Fprintf(&b, "| mode | queries | Allocated reported | ratio | Delta reported | ratio | missed bytes | time | reported unchanged, zeros / data (4 KiB blocks) |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range Modes {
		x := tot.Modes[m.Name]
		fmt.Fprintf(&b, "| %s | %d / %d | %s | %s | %s | %s | %d | %v | %s / %s |\n", m.Name, x[0].queries, x[1].queries,
			MiB(x[0].reported), x[0].ratioText(), MiB(x[1].reported), x[1].ratioText(),
			x[0].missed+x[1].missed, (x[0].dur + x[1].dur).Round(time.Millisecond),
			MiB(x[0].zeros+x[1].zeros), MiB(x[0].same+x[1].same))
	}
	for _, m := range Modes {
		if x := tot.Modes[m.Name]; x[0].queries+x[1].queries < tot.Queries[0]+tot.Queries[1] {
			fmt.Fprintf(&b, "(precise mode's walk variants ran where it walked, no usable object map; elsewhere they take its path)\n")
			break
		}
	}
	if len(tot.kinds) > 0 {
		fmt.Fprintf(&b, "\nper kind of history (a history has several kinds): Allocated / Delta ratio, missed bytes\n| kind | histories | queries | truly changed |")
		for _, m := range Modes {
			fmt.Fprintf(&b, " %s |", m.Name)
		}
		fmt.Fprintf(&b, " precise: unchanged zeros / data |\n|---|---|---|---|%s---|\n", strings.Repeat("---|", len(Modes)))
		for _, k := range slices.Sorted(maps.Keys(tot.kinds)) {
			x := tot.kinds[k]
			fmt.Fprintf(&b, "| %s | %d | %d / %d | %s / %s |", k, x.histories, x.Queries[0], x.Queries[1], MiB(x.Truth[0]), MiB(x.Truth[1]))
			for _, m := range Modes {
				y := x.Modes[m.Name]
				fmt.Fprintf(&b, " %s / %s, %d |", y[0].ratioText(), y[1].ratioText(), y[0].missed+y[1].missed)
			}
			y := x.Modes["precise"]
			fmt.Fprintf(&b, " %s / %s |\n", MiB(y[0].zeros+y[1].zeros), MiB(y[0].same+y[1].same))
		}
	}
	if n := tot.offsets[Modes[0].Name].queries; n > 0 {
		fmt.Fprintf(&b, "\nIterate from a starting_offset inside an object: %d queries per mode (truly changed after the offsets: %s)\n", n, MiB(tot.offsets[Modes[0].Name].truth))
		fmt.Fprintf(&b, "| mode | reported after the offset | ratio | missed bytes | first extent starts before the offset | differs from the offset-0 answer clipped |\n|---|---|---|---|---|---|\n")
		for _, m := range Modes {
			x := tot.offsets[m.Name]
			ratio := "—" // a walk variant that ran no query from an offset
			if x.queries > 0 {
				ratio = fmt.Sprintf("%.2f×", float64(x.reported)/float64(max(x.truth, 1)))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d |\n", m.Name, MiB(x.reported), ratio, x.missed, x.startsBefore, x.differs)
		}
	}
	if tot.migrations > 0 {
		fmt.Fprintf(&b, "\nimages prepared for migration: %d; queries refused with FAILED_PRECONDITION: %d, answered: %d (missed bytes %d)\n",
			tot.migrations, tot.migRefused, tot.migAnswered, tot.migMissed)
	}
	if tot.removals > 0 {
		fmt.Fprintf(&b, "\nsnapshots removed while a Delta of every mode ran: %d; Deltas that failed with NOT_FOUND: %d, answered: %d (missed bytes %d)\n",
			tot.removals, tot.remRefused, tot.remAnswered, tot.remMissed)
	}
	return b.String()
}

// Ratios gives each mode's Allocated and Delta ratios, on one line.
func (tot *Totals) Ratios() string {
	var b []string
	for _, m := range Modes {
		x := tot.Modes[m.Name]
		b = append(b, fmt.Sprintf("%s %s / %s", m.Name, x[0].ratioText(), x[1].ratioText()))
	}
	return strings.Join(b, ", ")
}

// MiB prints n bytes in MiB, two decimals.
func MiB(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/float64(harness.MiB)) }

// Ratio is x's reported bytes over the truly changed bytes (in 4 KiB
// blocks) of the queries it ran.
func (x Tally) Ratio() float64 { return float64(x.reported) / float64(max(x.truth, 1)) }

// ratioText is Ratio for a table: "—" when x ran no query.
func (x Tally) ratioText() string {
	if x.queries == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", x.Ratio())
}

// Per is x's mean time per query it ran.
func (x Tally) Per() time.Duration {
	return (x.dur / time.Duration(max(x.queries, 1))).Round(time.Millisecond)
}
