//go:build e2e

package harness

// What tests share for the whole test binary: made by the first test that
// asks, undone when the suite ends (EndSuite, from the e2e package's
// TestMain), so that tests that only read a fixture do not each make
// their own.

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
)

// suite holds the shared values and the cleanups of what made them.
var suite struct {
	sync.Mutex
	made     map[string]any
	tb       *suiteTB
	cleanups []func()
}

// suiteTB is the testing.TB a shared value is made with: the asking
// test's for everything but Cleanup, whose functions EndSuite runs. Once
// the suite ends, what those functions report goes to EndSuite's writer
// instead (endTB), since the test that made the value has ended.
type suiteTB struct {
	testing.TB
}

func (s *suiteTB) Cleanup(f func()) { suite.cleanups = append(suite.cleanups, f) }

// shared returns the value mk made for key, making it on the first call
// with a testing.TB whose cleanups run when the suite ends. An mk that
// fails fails t, and the next caller makes it again.
func shared[V any](t testing.TB, key string, mk func(testing.TB) V) V {
	t.Helper()
	suite.Lock()
	defer suite.Unlock()
	if v, ok := suite.made[key]; ok {
		t.Logf("shared with earlier tests: %s", key)
		return v.(V)
	}
	if suite.tb == nil {
		suite.tb = &suiteTB{}
	}
	suite.tb.TB = t
	v := mk(suite.tb)
	if suite.made == nil {
		suite.made = map[string]any{}
	}
	suite.made[key] = v
	return v
}

// EndSuite runs the cleanups of the shared values, last made first, as
// t.Cleanup would, writing what they report to w, and reports whether
// they all succeeded. TestMain calls it after the tests.
func EndSuite(w io.Writer) bool {
	suite.Lock()
	defer suite.Unlock()
	end := &endTB{w: w}
	if suite.tb != nil {
		suite.tb.TB = end
	}
	for n := len(suite.cleanups); n > 0; n = len(suite.cleanups) {
		f := suite.cleanups[n-1]
		suite.cleanups = suite.cleanups[:n-1]
		func() {
			defer func() {
				if r := recover(); r != nil && !errors.Is(asError(r), errEndFatal) {
					end.Errorf("a shared fixture's cleanup panicked: %v", r)
				}
			}()
			f()
		}()
	}
	suite.made = nil
	return !end.failed
}

var errEndFatal = errors.New("fatal in a shared fixture's cleanup")

func asError(r any) error {
	if err, ok := r.(error); ok {
		return err
	}
	return nil
}

// endTB reports to w what the cleanups run by EndSuite report; a Fatal
// ends that cleanup (EndSuite recovers) and the others still run. The
// harness's cleanups use no other method of testing.TB: one would panic
// on the nil TB, which EndSuite reports too.
type endTB struct {
	testing.TB
	w      io.Writer
	failed bool
}

func (e *endTB) Name() string { return "EndSuite" }
func (e *endTB) Helper()      {}
func (e *endTB) Failed() bool { return e.failed }
func (e *endTB) Log(args ...any) {
	fmt.Fprintln(e.w, append([]any{"harness: end of suite:"}, args...)...)
}
func (e *endTB) Logf(format string, args ...any)   { e.Log(fmt.Sprintf(format, args...)) }
func (e *endTB) Error(args ...any)                 { e.failed = true; e.Log(args...) }
func (e *endTB) Errorf(format string, args ...any) { e.Error(fmt.Sprintf(format, args...)) }
func (e *endTB) Fatal(args ...any)                 { e.Error(args...); panic(errEndFatal) }
func (e *endTB) Fatalf(format string, args ...any) { e.Fatal(fmt.Sprintf(format, args...)) }
func (e *endTB) Cleanup(f func())                  { suite.cleanups = append(suite.cleanups, f) }
