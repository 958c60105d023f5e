//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client/conformance"
)

// TestConformance points the conformance checker, which knows nothing of
// Ceph, at our server on Ceph-CSI snapshots of the real cluster, in both
// block types, for Allocated and Delta, as `snapmeta check` would.
func TestConformance(t *testing.T) {
	conn := connectAdmin(t)
	c := newCSICluster(t, conn, clusterID, "")
	vol := c.createVolume(t, 64*mib, nil)
	for _, w := range [][2]uint64{{0, 4 * kib}, {5 * mib, 64 * kib}, {9*mib + 100, 3000}, {40 * mib, 2 * mib}} {
		vol.write(t, w[0], w[1])
	}
	s1 := vol.snapshot(t)
	for _, w := range [][2]uint64{{4 * kib, 4 * kib}, {5*mib + 32*kib, 64 * kib}, {63 * mib, mib}} {
		vol.write(t, w[0], w[1])
	}
	vol.discard(t, 40*mib, 4*mib)
	s2 := vol.snapshot(t)
	missing := c.handle(csiUUID(t)) // well formed, in no journal

	for _, flags := range [][]string{
		{"--block-metadata-type=VARIABLE_LENGTH"},
		{"--block-metadata-type=FIXED_LENGTH", "--fixed-block-size=65536"},
	} {
		srv := startServer(t, flags...)
		for _, target := range []conformance.Target{
			{Snapshot: s2.handle(), Missing: missing},
			{Base: s1.handle(), Snapshot: s2.handle(), Missing: missing},
		} {
			target.Secrets = csiSecrets(t)
			t.Run(fmt.Sprintf("%s/base=%v", flags[0], target.Base != ""), func(t *testing.T) {
				rep, err := conformance.Run(context.Background(), srv.conn, target)
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
