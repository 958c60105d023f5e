package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// ev is one line of go test -json in package p.
func ev(action, test, output string, elapsed float64) string {
	b, err := json.Marshal(event{Action: action, Package: "p", Test: test, Output: output, Elapsed: elapsed})
	if err != nil {
		panic(err)
	}
	return string(b) + "\n"
}

// run feeds lines to a report and returns what it printed, the slowest n
// last.
func run(verbose bool, n int, lines ...string) string {
	var out strings.Builder
	r := newReport(&out, verbose)
	for _, l := range lines {
		r.line(l)
	}
	r.slowest(n)
	return out.String()
}

// A failed test's run, as go test -json writes it: TestA passes, TestB
// fails in its subtest bad, after its subtest ok passed.
var failedRun = []string{
	"cluster: started\n", // with-cluster.sh's own line
	ev("start", "", "", 0),
	ev("run", "TestA", "", 0),
	ev("output", "TestA", "=== RUN   TestA\n", 0),
	ev("output", "TestA", "    a_test.go:3: log of A\n", 0),
	ev("output", "TestA", "--- PASS: TestA (3.00s)\n", 0),
	ev("pass", "TestA", "", 3),
	ev("output", "TestB", "=== RUN   TestB\n", 0),
	ev("output", "TestB/ok", "=== RUN   TestB/ok\n", 0),
	ev("output", "TestB/ok", "    b_test.go:4: log of ok\n", 0),
	ev("output", "TestB/ok", "--- PASS: TestB/ok (5.00s)\n", 0),
	ev("pass", "TestB/ok", "", 5),
	ev("output", "TestB/bad", "=== RUN   TestB/bad\n", 0),
	ev("output", "TestB/bad", "    b_test.go:5: boom\n", 0),
	ev("output", "TestB/bad", "--- FAIL: TestB/bad (1.00s)\n", 0),
	ev("fail", "TestB/bad", "", 1),
	ev("output", "TestB", "--- FAIL: TestB (6.00s)\n", 0),
	ev("fail", "TestB", "", 6),
	ev("output", "TestC", "--- SKIP: TestC (0.00s)\n", 0),
	ev("skip", "TestC", "", 0),
	ev("output", "", "FAIL\n", 0),
	ev("output", "", "FAIL\tp\t9.000s\n", 0),
	ev("fail", "", "", 9),
}

func TestFailedRun(t *testing.T) {
	got := run(false, 2, failedRun...)
	want := "cluster: started\n" +
		"=== RUN   TestB\n=== RUN   TestB/ok\n    b_test.go:4: log of ok\n--- PASS: TestB/ok (5.00s)\n" +
		"=== RUN   TestB/bad\n    b_test.go:5: boom\n--- FAIL: TestB/bad (1.00s)\n--- FAIL: TestB (6.00s)\n" +
		"FAIL\nFAIL\tp\t9.000s\n" +
		"testreport: the 2 slowest of 4 tests and subtests (seconds):\n" +
		"     6.00  TestB  FAILED\n" +
		"     5.00  TestB/ok\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestVerbosePrintsAll(t *testing.T) {
	got := run(true, 0, failedRun...)
	for _, want := range []string{"log of A", "--- PASS: TestA", "log of ok", "boom", "--- SKIP: TestC", "FAIL\tp"} {
		if !strings.Contains(got, want) {
			t.Errorf("-v output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "slowest") {
		t.Errorf("-n 0 printed the slowest:\n%s", got)
	}
}

func TestPassedRun(t *testing.T) {
	got := run(false, 10,
		ev("output", "TestA", "=== RUN   TestA\n", 0),
		ev("output", "TestA", "    a_test.go:3: log of A\n", 0),
		ev("pass", "TestA", "", 2.5),
		ev("output", "", "PASS\n", 0),
		ev("output", "", "ok  \tp\t2.600s\n", 0),
		ev("pass", "", "", 2.6),
	)
	want := "ok  \tp\t2.600s\n" +
		"testreport: the 1 slowest of 1 tests and subtests (seconds):\n" +
		"     2.50  TestA\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// A test that go test's -timeout ends has no fail event of its own: its
// output, which holds the panic, comes before the package's FAIL line.
func TestUnfinishedTest(t *testing.T) {
	got := run(false, 0,
		ev("output", "TestH", "=== RUN   TestH\n", 0),
		ev("output", "TestH", "panic: test timed out after 3s\n", 0),
		ev("output", "", "FAIL\tp\t3.000s\n", 0),
		ev("fail", "", "", 3),
	)
	want := "testreport: TestH did not end; its output:\n=== RUN   TestH\npanic: test timed out after 3s\n" +
		"FAIL\tp\t3.000s\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestBuildFailure(t *testing.T) {
	got := run(false, 10,
		`{"ImportPath":"p [p.test]","Action":"build-output","Output":"# p\n"}`+"\n",
		`{"ImportPath":"p [p.test]","Action":"build-output","Output":"x_test.go:2:9: expected ')'\n"}`+"\n",
		`{"ImportPath":"p [p.test]","Action":"build-fail"}`+"\n",
		ev("output", "", "FAIL\tp [setup failed]\n", 0),
		ev("fail", "", "", 0),
	)
	want := "# p\nx_test.go:2:9: expected ')'\nFAIL\tp [setup failed]\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// A test whose subtests run in parallel: go test's elapsed time of the
// parent leaves them out, its start and end do not.
func TestParallelSubtests(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 20, 0, 0, 0, time.UTC)
	at := func(line string, d time.Duration) string {
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		e.Time = t0.Add(d)
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return string(b) + "\n"
	}
	got := run(false, 10,
		at(ev("run", "TestP", "", 0), 0),
		at(ev("run", "TestP/a", "", 0), 0),
		at(ev("pass", "TestP/a", "", 40), 50*time.Second),
		at(ev("pass", "TestP", "", 0.1), 60*time.Second),
	)
	want := "testreport: the 2 slowest of 2 tests and subtests (seconds):\n" +
		"    60.00  TestP\n" +
		"    40.00  TestP/a\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}
