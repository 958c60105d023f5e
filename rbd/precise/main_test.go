package precise

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: the pipeline
// waits for every refinement it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
