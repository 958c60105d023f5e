//go:build e2e

package harness

// Snapshot trimming: the OSDs trim removed snapshots at once, and the
// tests wait until a snapshot is gone from the objects' snap sets.

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FastSnapTrim lets the OSDs trim removed snapshots at once, as on SSDs
// (osd_snap_trim_sleep_ssd is 0): the test cluster's OSD runs on a file,
// which Ceph takes for a disk with seconds between trims. Undone when the
// test ends.
func FastSnapTrim(t *testing.T) {
	t.Helper()
	keys := []string{"osd_snap_trim_sleep", "osd_snap_trim_sleep_hdd", "osd_snap_trim_sleep_ssd", "osd_snap_trim_sleep_hybrid"}
	for _, k := range keys {
		CephAuth(t, "config", "set", "osd", k, "0")
	}
	t.Cleanup(func() {
		for _, k := range keys {
			CephAuth(t, "config", "rm", "osd", k)
		}
	})
}

// WaitTrimmed waits until snapshot snap is gone from the snap sets of the
// given objects (rados listsnaps), or the objects are gone, and fails the
// test after a minute.
func WaitTrimmed(t *testing.T, ns string, snap uint64, objects ...string) time.Duration {
	t.Helper()
	t0 := time.Now()
	id := strconv.FormatUint(snap, 10)
	for _, o := range objects {
		for {
			args := []string{"-p", Pool}
			if ns != "" {
				args = append(args, "-N", ns)
			}
			out, err := exec.Command("rados", append(args, "listsnaps", o)...).CombinedOutput()
			if err != nil && !strings.Contains(string(out), "No such file or directory") {
				t.Fatalf("rados listsnaps %s: %v\n%s", o, err, out)
			}
			// ENOENT: the object had no head, only the clone that held the
			// snapshot (`rados ls` lists such an object), and the trim took
			// the clone and with it the object.
			if err != nil || !snapListed(string(out), id) {
				break
			}
			if time.Since(t0) > time.Minute {
				t.Fatalf("snapshot %s still in the snap set of %s a minute after its removal:\n%s", id, o, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return time.Since(t0)
}

// snapListed reports whether a clone in `rados listsnaps` output holds
// snapshot id ("cloneid snaps size overlap" lines; snaps is a comma list).
func snapListed(out, id string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] == "cloneid" || f[0] == "head" {
			continue
		}
		for _, s := range strings.Split(f[1], ",") {
			if s == id {
				return true
			}
		}
	}
	return false
}
