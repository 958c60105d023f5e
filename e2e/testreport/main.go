// Command testreport reads go test -json on stdin and prints what go test
// prints without -json, then the slowest tests, so that an e2e run's log
// says where its time went (issue 28). e2e/run-e2e.sh pipes the suite
// through it.
//
//	go test -json ./e2e/ | testreport [-v] [-n 10]
//
// Without -v it prints the whole output of each failed top-level test (its
// subtests' too, in the order they ran), of each test still running when
// the package ended (a panic, go test's -timeout), the package lines (ok,
// FAIL, a build's errors), and any line that is not a test event as it
// came. With -v it prints every line of output as it comes, as go test -v
// does. Then, in both, the n slowest tests that passed or failed, top-level
// tests and subtests alike, with their seconds: a top-level test's from
// its start to its end, its parallel subtests included (go test's own
// figure leaves them out).
//
// It ignores SIGINT and SIGTERM and reads to the end of its input: the
// command before it in the pipe (with-cluster.sh) still prints while it
// stops its cluster, and must not die of a closed pipe doing so. Its own
// exit code is 0 unless it cannot read its input or write its output;
// run-e2e.sh exits with go test's.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// event is the part of a test2json event (go doc test2json) used here.
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is one finished test's time.
type timing struct {
	pkg     string
	test    string // TestX or TestX/sub
	seconds float64
	failed  bool
}

// report is the state of one run: the output held per running top-level
// test, and the times of the finished tests.
type report struct {
	out     io.Writer
	verbose bool
	held    map[string]*strings.Builder // "pkg\x00TestX": its output and its subtests'
	order   []string                    // keys of held, in the order the tests started
	times   []timing
	pkgs    map[string]bool      // the packages whose tests ended
	started map[string]time.Time // "pkg\x00TestX": its run event's time
}

func newReport(out io.Writer, verbose bool) *report {
	return &report{out: out, verbose: verbose, held: map[string]*strings.Builder{}, pkgs: map[string]bool{}, started: map[string]time.Time{}}
}

// line takes one line of go test -json's output.
func (r *report) line(s string) {
	var e event
	if !strings.HasPrefix(s, "{") || json.Unmarshal([]byte(s), &e) != nil || e.Action == "" {
		fmt.Fprint(r.out, s) // not an event: with-cluster.sh's own lines
		return
	}
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Test == "":
		r.packageEvent(e)
	default:
		r.testEvent(e)
	}
}

// packageEvent prints a package's own lines ("ok", "FAIL", a panic outside
// any test) and, when the package ends failed, the held output of the
// tests that never ended.
func (r *report) packageEvent(e event) {
	switch e.Action {
	case "output":
		if strings.HasPrefix(e.Output, "FAIL") {
			r.unfinished(e.Package) // before the package's FAIL lines
		}
		// go test without -v does not print the binary's PASS line.
		if r.verbose || e.Output != "PASS\n" {
			fmt.Fprint(r.out, e.Output)
		}
	case "fail":
		r.unfinished(e.Package)
	}
}

// unfinished prints, and drops, the held output of the package's tests
// that have not ended: the test that a panic or go test's -timeout ended
// has the panic's output.
func (r *report) unfinished(pkg string) {
	for _, k := range r.order {
		if p, test, _ := strings.Cut(k, "\x00"); p == pkg {
			if b := r.held[k]; b != nil {
				fmt.Fprintf(r.out, "testreport: %s did not end; its output:\n%s", test, b.String())
			}
			delete(r.held, k)
		}
	}
	r.order = slices.DeleteFunc(r.order, func(k string) bool { return r.held[k] == nil })
}

// testEvent holds (or, with -v, prints) a test's output, and records its
// time when it ends: a failed top-level test's held output is printed.
func (r *report) testEvent(e event) {
	top, _, _ := strings.Cut(e.Test, "/")
	key := e.Package + "\x00" + top
	switch e.Action {
	case "run":
		if e.Test == top {
			r.started[key] = e.Time
		}
	case "output":
		if r.verbose {
			fmt.Fprint(r.out, e.Output)
			return
		}
		b := r.held[key]
		if b == nil {
			b = &strings.Builder{}
			r.held[key] = b
			r.order = append(r.order, key)
		}
		b.WriteString(e.Output)
	case "pass", "fail":
		r.pkgs[e.Package] = true
		seconds := e.Elapsed
		if start, ok := r.started[key]; ok && e.Test == top && !start.IsZero() && !e.Time.IsZero() {
			// go test's elapsed time of a test leaves out its parallel
			// subtests, which run after its function returned: the time
			// from its run event to its end counts them.
			seconds = max(seconds, e.Time.Sub(start).Seconds())
		}
		r.times = append(r.times, timing{e.Package, e.Test, seconds, e.Action == "fail"})
		if e.Test == top {
			delete(r.started, key)
		}
		fallthrough
	case "skip":
		if e.Test != top {
			return
		}
		if b := r.held[key]; b != nil && e.Action == "fail" {
			fmt.Fprint(r.out, b.String())
		}
		delete(r.held, key)
	}
}

// slowest prints the n slowest finished tests, slowest first.
func (r *report) slowest(n int) {
	if len(r.times) == 0 || n <= 0 {
		return
	}
	slices.SortStableFunc(r.times, func(a, b timing) int { return cmp.Compare(b.seconds, a.seconds) })
	n = min(n, len(r.times))
	fmt.Fprintf(r.out, "testreport: the %d slowest of %d tests and subtests (seconds):\n", n, len(r.times))
	for _, t := range r.times[:n] {
		mark := ""
		if t.failed {
			mark = "  FAILED"
		}
		name := t.test
		if len(r.pkgs) > 1 {
			name = t.pkg + "." + t.test
		}
		fmt.Fprintf(r.out, "%9.2f  %s%s\n", t.seconds, name, mark)
	}
}

func main() {
	verbose := flag.Bool("v", false, "print every line of output as it comes, as go test -v")
	n := flag.Int("n", 10, "how many of the slowest tests to print")
	flag.Parse()
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	out := bufio.NewWriter(os.Stdout)
	r := newReport(out, *verbose)
	in := bufio.NewReader(os.Stdin)
	for {
		s, err := in.ReadString('\n')
		if s != "" {
			r.line(s)
			// A line at a time: the log shows a test's output when it
			// comes, not when a buffer fills.
			if err := out.Flush(); err != nil {
				fmt.Fprintln(os.Stderr, "testreport:", err)
				os.Exit(1)
			}
		}
		if err == io.EOF {
			break
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(1)
		}
	}
	r.slowest(*n)
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}
