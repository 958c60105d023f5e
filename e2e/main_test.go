//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// TestMain runs the tests, then removes what they shared
// (harness.SharedManyWrites): a failure to remove it fails the run. The
// tests use librados and librbd themselves (the harness, and the servers
// some run in this process): a crash of theirs shows its stack too.
func TestMain(m *testing.M) {
	if err := rbd.ReportCrashes(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	code := m.Run()
	if !harness.EndSuite(os.Stderr) && code == 0 {
		code = 1
	}
	os.Exit(code)
}
