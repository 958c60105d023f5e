//go:build e2e

package e2e

import (
	"os"
	"testing"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestMain runs the tests, then removes what they shared
// (harness.SharedManyWrites): a failure to remove it fails the run.
func TestMain(m *testing.M) {
	code := m.Run()
	if !harness.EndSuite(os.Stderr) && code == 0 {
		code = 1
	}
	os.Exit(code)
}
