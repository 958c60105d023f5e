//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// relConfig writes a copy of the cluster's csi-config.json with more
// cluster IDs (id → monitors) and returns its path.
func relConfig(t testing.TB, extra map[string][]string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var clusters []map[string]any
	if err := json.Unmarshal(raw, &clusters); err != nil {
		t.Fatal(err)
	}
	for id, mons := range extra {
		clusters = append(clusters, map[string]any{"clusterID": id, "monitors": mons})
	}
	raw, _ = json.Marshal(clusters)
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReliabilitySecrets runs good and bad requests through the server
// binary at the highest verbosity (-v=10: requests, pages, everything)
// and looks for the keys in the log, in every status message and in
// /metrics: the right key, and wrong keys that look like keys.
func TestReliabilitySecrets(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	v, img := harness.CreateVolume(t, conn, "", "rel-secrets", 16*harness.MiB, harness.ImageFeatures)
	for i := uint64(0); i < 8; i++ {
		harness.FillAt(t, img, i*harness.MiB, 4*harness.KiB)
	}
	harness.Snapshot(t, img, "s1")
	harness.FillAt(t, img, 9*harness.MiB, 4*harness.KiB)
	harness.Snapshot(t, img, "s2")

	addr := harness.FreeTCPAddr(t)
	config := relConfig(t, map[string][]string{"rsm-rel-down": {harness.FreeTCPAddr(t)}})
	srv := harness.StartServer(t, "-v=10", "--metrics-address="+addr, "--ceph-connect-timeout=3s", "--clusterconfig", config)
	user, key := harness.ClusterEnv(t, "CEPH_CSI_USER"), harness.ClusterEnv(t, "CEPH_CSI_KEY")
	admin := harness.ClusterEnv(t, "CEPH_KEY")
	bad := harness.WrongKey(t, key)
	srv.Hide = append(srv.Hide, bad)
	keys := []string{key, bad, admin}

	good := map[string]string{"userID": user, "userKey": key}
	cases := []struct {
		name string
		req  harness.MetaReq
		want codes.Code
	}{
		{"allocated, one tuple a page", harness.MetaReq{Target: v.ID("s2"), Max: 1, Secrets: good}, codes.OK},
		{"delta", harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Secrets: good}, codes.OK},
		{"admin's key", harness.MetaReq{Target: v.ID("s2"), Secrets: map[string]string{"userID": "admin", "userKey": admin}}, codes.OK},
		{"wrong key", harness.MetaReq{Target: v.ID("s2"), Secrets: map[string]string{"userID": user, "userKey": bad}}, codes.Unauthenticated},
		{"wrong key, delta", harness.MetaReq{Base: v.ID("s1"), Target: v.ID("s2"), Secrets: map[string]string{"userID": user, "userKey": bad}}, codes.Unauthenticated},
		{"unknown user", harness.MetaReq{Target: v.ID("s2"), Secrets: map[string]string{"userID": "nobody-" + user, "userKey": key}}, codes.Unauthenticated},
		{"key without user", harness.MetaReq{Target: v.ID("s2"), Secrets: map[string]string{"userKey": key}}, codes.InvalidArgument},
		{"key under another name", harness.MetaReq{Target: v.ID("s2"), Secrets: map[string]string{"userID": user, "key": key}}, codes.InvalidArgument},
		{"unknown snapshot", harness.MetaReq{Target: v.ID("nope"), Secrets: good}, codes.NotFound},
		{"unknown pool", harness.MetaReq{Target: harness.ClusterID + "/nopool/" + v.Name + "@s1", Secrets: good}, codes.NotFound},
		{"malformed ID", harness.MetaReq{Target: "x@y", Secrets: good}, codes.InvalidArgument},
		{"base newer than target", harness.MetaReq{Base: v.ID("s2"), Target: v.ID("s1"), Secrets: good}, codes.InvalidArgument},
		{"offset beyond the end", harness.MetaReq{Target: v.ID("s2"), Start: 1 << 40, Secrets: good}, codes.OutOfRange},
		{"unreachable monitors", harness.MetaReq{Target: "rsm-rel-down/rbd/" + v.Name + "@s2", Secrets: good}, codes.Unavailable},
	}
	var wg sync.WaitGroup
	results := make([]harness.MetaStream, len(cases))
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			results[i] = srv.Call(ctx, c.req)
		}()
	}
	wg.Wait()
	for i, c := range cases {
		m := results[i]
		if c.want == codes.OK && m.Err != nil || c.want != codes.OK && status.Code(m.Err) == codes.OK {
			t.Errorf("%s: %v, want %v", c.name, m.Err, c.want)
		} else if status.Code(m.Err) != c.want {
			// The code is not what this test is about; TestErrors is.
			t.Logf("%s: %v (expected %v)", c.name, status.Code(m.Err), c.want)
		}
		msg := status.Convert(m.Err).Message()
		for _, k := range keys {
			if strings.Contains(msg, k) || (len(k) > 20 && strings.Contains(msg, k[:20])) {
				t.Errorf("%s: the status message carries a key: %q", c.name, msg)
			}
		}
	}
	// A stream cancelled by the client.
	ctx, cancel := context.WithCancel(context.Background())
	recv, err := srv.Open(ctx, harness.MetaReq{Target: v.ID("s2"), Max: 1, Secrets: good})
	if err == nil {
		_, err = recv()
		cancel()
		for err == nil {
			_, err = recv()
		}
	}
	cancel()
	if !errors.Is(err, io.EOF) && status.Code(err) != codes.Canceled {
		t.Errorf("cancelled stream: %v, want CANCELLED (or its end, had it all arrived)", err)
	}

	// The three OK streams and the cancelled one reach the log with a
	// "Stream finished" line. (Streams that fail before their diff starts
	// are logged only with their request: see the report.)
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(srv.Log(), `"Stream finished"`) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	log := srv.Log()
	if n := strings.Count(log, `"Request"`); n < len(cases)+1 {
		t.Errorf("the -v=10 log has %d requests, want %d", n, len(cases)+1)
	}
	for _, want := range []string{`"Sending page"`, `"Stream finished"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the -v=10 log lacks %s; the test proves nothing", want)
		}
	}
	body := harness.Scrape(t, addr)
	if !strings.Contains(body, "rbd_snapshot_metadata_rpcs_total") {
		t.Errorf("/metrics lacks the RPC counts")
	}
	for _, k := range keys {
		for what, text := range map[string]string{"the server log": log, "/metrics": body} {
			if strings.Contains(text, k) || strings.Contains(text, k[:20]) {
				t.Errorf("%s carries a key (or its first 20 characters)", what)
			}
		}
	}
	t.Logf("%d requests at -v=10: %d log lines, %d bytes of /metrics, no key", len(cases)+1, strings.Count(log, "\n"), len(body))
}
