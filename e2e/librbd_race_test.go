//go:build e2e

package e2e

import (
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestLibrbdOpenCloseRace reproduces a crash of librbd itself (reef 18.2.7
// and tentacle 20.2.4, docs/limitations.md), without our server: opening
// a clone makes librbd open its parent at the parent snapshot, and the
// librados thread that completes that open takes the parent's lock again
// (ImageState::complete_action_unlock) after handing the result on. A
// close of the clone in between frees the parent, and the process dies
// (an uncaught std::system_error, or SIGSEGV). Eight goroutines open and
// close Ceph-CSI snapshot clones read-only, as fast as they can; on two
// cores with two busy loops beside, it crashed after 13 s (reef's librbd)
// and 39 s (tentacle's).
//
// It kills the test binary, so it runs only when RSM_LIBRBD_RACE names
// how long to try (a Go duration, e.g. 4m): a reproducer for a fix of
// ours or Ceph's, not a check CI runs.
func TestLibrbdOpenCloseRace(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("RSM_LIBRBD_RACE"))
	if err != nil || d <= 0 {
		t.Skip("set RSM_LIBRBD_RACE=4m to try to crash librbd for that long")
	}
	k := harness.NewCSICluster(t, harness.ConnectAdmin(t), "rsm-e2e", "")
	v := k.CreateVolume(t, 32*harness.MiB, nil)
	v.Write(t, 0, 4096)
	var clones []string
	for range 4 {
		clones = append(clones, v.Snapshot(t).Clone)
	}
	var n atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				img, err := rbd.OpenImageReadOnly(k.IOCtx, clones[(g+i)%len(clones)], rbd.NoSnapshot)
				if err != nil {
					t.Errorf("open: %v", err)
					return
				}
				if err := img.Close(); err != nil {
					t.Errorf("close: %v", err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("librbd survived %d opens and closes of clones in %s", n.Load(), d)
}
