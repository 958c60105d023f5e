//go:build e2e

package harness

import (
	"testing"
	"time"
)

// WaitFor polls ok every 100 ms until it returns true, for at most d, and
// fails the test if it never does.
func WaitFor(t testing.TB, what string, d time.Duration, ok func() bool) {
	t.Helper()
	t0 := time.Now()
	for !ok() {
		if time.Since(t0) > d {
			t.Fatalf("%s: not ready after %v", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s ready in %.1fs", what, time.Since(t0).Seconds())
}

// Closed reports whether ch is closed (a process's "exited", say), without
// waiting.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
