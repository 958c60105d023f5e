//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client/conformance"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestConformance points the conformance checker, which knows nothing of
// Ceph, at our server on Ceph-CSI snapshots of the real cluster, in both
// block types, for Allocated and Delta, as `snapmeta check` would.
func TestConformance(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	c := harness.NewCSICluster(t, conn, harness.ClusterID, "")
	vol := c.CreateVolume(t, 64*harness.MiB, nil)
	for _, w := range [][2]uint64{{0, 4 * harness.KiB}, {5 * harness.MiB, 64 * harness.KiB}, {9*harness.MiB + 100, 3000}, {40 * harness.MiB, 2 * harness.MiB}} {
		vol.Write(t, w[0], w[1])
	}
	s1 := vol.Snapshot(t)
	for _, w := range [][2]uint64{{4 * harness.KiB, 4 * harness.KiB}, {5*harness.MiB + 32*harness.KiB, 64 * harness.KiB}, {63 * harness.MiB, harness.MiB}} {
		vol.Write(t, w[0], w[1])
	}
	vol.Discard(t, 40*harness.MiB, 4*harness.MiB)
	s2 := vol.Snapshot(t)
	missing := c.Handle(harness.CSIUUID(t)) // well formed, in no journal

	for _, flags := range [][]string{
		{"--block-metadata-type=VARIABLE_LENGTH"},
		{"--block-metadata-type=FIXED_LENGTH", "--fixed-block-size=65536"},
	} {
		srv := harness.StartServer(t, flags...)
		for _, target := range []conformance.Target{
			{Snapshot: s2.Handle(), Missing: missing},
			{Base: s1.Handle(), Snapshot: s2.Handle(), Missing: missing},
		} {
			target.Secrets = harness.CSISecrets(t)
			t.Run(fmt.Sprintf("%s/base=%v", flags[0], target.Base != ""), func(t *testing.T) {
				rep, err := conformance.Run(context.Background(), srv.Conn, target)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("\n%s", rep)
				if !rep.OK() {
					t.Error("the server breaks the spec's rules, above")
				}
				if rep.Tuples == 0 {
					t.Error("the reference stream is empty: the check proves little")
				}
			})
		}
	}
}
