//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestServerIdentity checks the Identity service and gRPC health of the
// server binary: the driver name (default and --drivername), the
// SnapshotMetadata capability, and readiness.
func TestServerIdentity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		flags []string
		name  string
	}{
		{nil, "rbd.csi.ceph.com"},
		{[]string{"--drivername", "example.csi.vendor.io"}, "example.csi.vendor.io"},
	} {
		s := harness.StartServer(t, tc.flags...)
		info, err := s.ID.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		if err != nil {
			t.Fatalf("GetPluginInfo: %v", err)
		}
		if info.GetName() != tc.name || info.GetVendorVersion() == "" {
			t.Errorf("GetPluginInfo with %v: %+v, want name %q and a version", tc.flags, info, tc.name)
		}
		caps, err := s.ID.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
		if err != nil {
			t.Fatalf("GetPluginCapabilities: %v", err)
		}
		found := false
		for _, c := range caps.GetCapabilities() {
			found = found || c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE
		}
		if !found {
			t.Errorf("capabilities %v lack SNAPSHOT_METADATA_SERVICE", caps.GetCapabilities())
		}
		probe, err := s.ID.Probe(ctx, &csi.ProbeRequest{})
		if err != nil || !probe.GetReady().GetValue() {
			t.Errorf("Probe: %v, %v; want ready", probe, err)
		}
		h, err := healthpb.NewHealthClient(s.Conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health: %v, %v; want SERVING", h, err)
		}
	}
}

// TestServerRejectsBadFlags: a misconfigured server exits at once with a
// non-zero status instead of serving.
func TestServerRejectsBadFlags(t *testing.T) {
	bin := harness.ClusterEnv(t, "RSM_SERVER_BIN")
	config := filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json")
	sock := "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--block-metadata-type", "BOGUS"}, 2},
		{[]string{"--block-metadata-type", "UNKNOWN"}, 2},
		{[]string{"--precision", "fuzzy"}, 2},
		{[]string{"--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "0"}, 2},
		{[]string{"--no-such-flag"}, 2},
		{[]string{"--endpoint", "http://127.0.0.1:1"}, 1},
	} {
		args := append([]string{"--endpoint", sock, "--clusterconfig", config}, tc.args...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
			t.Errorf("%v: %v, want exit status %d\n%s", tc.args, err, tc.code, out)
		}
		if len(strings.TrimSpace(string(out))) == 0 {
			t.Errorf("%v: exits without saying why", tc.args)
		}
	}
}
