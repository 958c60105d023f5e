//go:build e2e

package e2e

// The consumer's view of a resumed stream: the real sidecar and its lister
// read a Delta while the OSD is stopped for longer than the op timeout.

import (
	"strings"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

// TestK8sSidecarResume stops the OSD for relOutage while the sidecar's
// lister reads a 16k-tuple Delta in pages of one tuple: the lister must
// get exactly the answer of an uninterrupted call, with no error.
func TestK8sSidecarResume(t *testing.T) {
	v, _ := harness.SharedManyWrites(t, 16384)
	k := kube.Start(t)
	addr := harness.FreeTCPAddr(t)
	// -v=5: a line per page sent, which says the stream is under way.
	srv := harness.StartServer(t, "--drivername", kube.Driver, "--ceph-op-timeout="+relOpTimeout.String(), "--metrics-address="+addr, "-v=5")
	sidecar := k.StartSidecar(t, "csi-snapshot-metadata", srv.Sock, k.Ports.GRPC, k.Ports.Health)
	harness.WaitFor(t, "sidecar /health", time.Minute, func() bool { return kube.Healthy(k.Ports.Health) || !sidecar.Running() })
	if !sidecar.Running() {
		t.Fatalf("the sidecar exited: %v\n%s", sidecar.Err, harness.Tail(k.Log("csi-snapshot-metadata"), 30))
	}
	q := harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Max: 1}
	direct := srv.Get(t, q)
	size := direct.Capacity()
	k.VolumeSnapshot(t, "big-s1", v.ID("s1"), size)
	k.VolumeSnapshot(t, "big-s2", v.ID("s2"), size)

	type listed struct {
		out string
		err error
	}
	sent := strings.Count(srv.Log(), `"Sending page"`) // the direct call's
	done := make(chan listed, 1)
	go func() {
		out, err := k.Lister(t, kube.BackupSA, "-s", "big-s2", "-p", "big-s1", "-max-results", "1")
		done <- listed{out, err}
	}()
	// Stop the OSD as soon as our server sends the stream's pages: this
	// test is about a stream resumed in the middle (a request whose first
	// open fails is retried too: TestReliabilityResume).
	harness.WaitFor(t, "the lister's stream at our server", time.Minute, func() bool {
		return strings.Count(srv.Log(), `"Sending page"`) > sent
	})
	harness.PauseOSD(t).Outage(relOutage)
	back := time.Now()
	var l listed
	select {
	case l = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the lister did not end within 3 minutes after the OSD came back")
	}
	t.Logf("the lister ended %v after the OSD came back", time.Since(back).Round(time.Millisecond))
	if l.err != nil {
		t.Fatalf("lister: %v\n%s", l.err, harness.Tail(l.out, 10))
	}
	var got []harness.Span
	for _, p := range kube.ParseLister(t, l.out) {
		got = append(got, p.Tuples...)
	}
	if d := harness.DiffSpans(direct.Tuples(), got); d != "" {
		t.Errorf("the lister's answer differs from an uninterrupted call's: %s", d)
	}
	resumed := strings.Count(srv.Log(), `"Resumed stream"`)
	t.Logf("%d tuples through the sidecar, identical to a direct call; %d resumes", len(got), resumed)
	if resumed == 0 {
		t.Errorf("no resume logged: the stream ended before the fault, and the test proves nothing")
	}
	harness.WaitClusterIO(t)
}
