//go:build e2e

package e2e

// Memory under the manifests' limit: the server given the container's
// limit as the manifests give it (MEMORY_LIMIT_BYTES from the downward
// API) sets Go's memory limit from it; --max-streams stalled readers at
// max_results 0 plus a precise stream must stay under that limit, with the
// server answering.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// manifestMemoryLimit is the server container's limit in
// deploy/components/containers (deploy_test checks the env that carries it).
const manifestMemoryLimit = 512 << 20

func TestReliabilityMemory(t *testing.T) {
	const streams = 32 // --max-streams' default
	conn := harness.ConnectAdmin(t)
	// 64 MiB written in full: 65536 FIXED_LENGTH 1 KiB tuples, 4 pages at
	// max_results 0: a stream that is not read holds three of them.
	v, img := harness.CreateVolume(t, conn, "", "memory", 64*harness.MiB, harness.ImageFeatures)
	for off := uint64(0); off < 64*harness.MiB; off += 4 * harness.MiB {
		harness.FillAt(t, img, off, 4*harness.MiB)
	}
	harness.Snapshot(t, img, "s1")
	t.Setenv("MEMORY_LIMIT_BYTES", fmt.Sprint(manifestMemoryLimit))
	addr := harness.FreeTCPAddr(t)
	// One more than the stalled streams, for the precise stream.
	srv := harness.StartServer(t, "--metrics-address="+addr, fmt.Sprintf("--max-streams=%d", streams+1),
		"--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "1024")
	if want := fmt.Sprintf("goMemoryLimit=%d", manifestMemoryLimit/4*3); !strings.Contains(srv.Log(), want) {
		t.Errorf("the server did not log %s", want)
	}
	req := harness.MetaReq{Target: v.ID("s1"), Secrets: harness.CSISecrets(t)}
	want := srv.Get(t, req).Tuples()
	if len(want) != 65536 {
		t.Fatalf("%d tuples, want 65536", len(want))
	}
	mem := harness.SampleMemory(t, srv.PID())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled, err := grpc.NewClient("unix://"+srv.Sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	sm := csi.NewSnapshotMetadataClient(stalled)
	t0 := time.Now()
	for range streams {
		if _, err := sm.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: req.Target, Secrets: req.Secrets}); err != nil {
			t.Fatal(err)
		}
	}
	for inFlight(t, addr) < streams {
		if time.Since(t0) > time.Minute {
			t.Fatalf("only %.0f of %d streams in flight after %v", inFlight(t, addr), streams, time.Since(t0))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // every stalled diff fills its pages
	held := harness.ProcStatus(t, srv.PID())["VmRSS"]
	// The precise stream, read in full while the others are held.
	t1 := time.Now()
	qctx, qcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	m := srv.Call(qctx, req)
	qcancel()
	if m.Err != nil || harness.DiffSpans(want, m.Tuples()) != "" {
		t.Errorf("the precise stream beside %d stalled ones: %d tuples, %v", streams, len(m.Tuples()), m.Err)
	}
	took := time.Since(t1)
	cancel()
	peak, hwm := mem.Finish(t)
	t.Logf("%d stalled streams at max_results 0: RSS %s while held; a precise stream beside them answered in %v; peak RSS %s (VmHWM %s); limit %s, Go's %s",
		streams, harness.FmtKiB(held), took.Round(time.Millisecond), harness.FmtKiB(peak), harness.FmtKiB(hwm), harness.FmtKiB(manifestMemoryLimit>>10), harness.FmtKiB(manifestMemoryLimit/4*3>>10))
	if hwm<<10 >= manifestMemoryLimit {
		t.Errorf("peak RSS %s reached the manifests' limit of %s", harness.FmtKiB(hwm), harness.FmtKiB(manifestMemoryLimit>>10))
	}
}
