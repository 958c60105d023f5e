package conn

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: janitors, connect
// attempts and monitor dials all end with their Cache or their probe.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
