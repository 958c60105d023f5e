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
)

// relConfig writes a copy of the cluster's csi-config.json with more
// cluster IDs (id → monitors) and returns its path.
func relConfig(t testing.TB, extra map[string][]string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(clusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
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
	conn := connectAdmin(t)
	v, img := createVolume(t, conn, "", "rel-secrets", 16*mib, imageFeatures)
	for i := uint64(0); i < 8; i++ {
		fillAt(t, img, i*mib, 4*kib)
	}
	snapshot(t, img, "s1")
	fillAt(t, img, 9*mib, 4*kib)
	snapshot(t, img, "s2")

	addr := freeTCPAddr(t)
	config := relConfig(t, map[string][]string{"rsm-rel-down": {freeTCPAddr(t)}})
	srv := startServer(t, "-v=10", "--metrics-address="+addr, "--ceph-connect-timeout=3s", "--clusterconfig", config)
	user, key := clusterEnv(t, "CEPH_CSI_USER"), clusterEnv(t, "CEPH_CSI_KEY")
	admin := clusterEnv(t, "CEPH_KEY")
	bad := wrongKey(t, key)
	srv.hide = append(srv.hide, bad)
	keys := []string{key, bad, admin}

	good := map[string]string{"userID": user, "userKey": key}
	cases := []struct {
		name string
		req  metaReq
		want codes.Code
	}{
		{"allocated, one tuple a page", metaReq{target: v.id("s2"), max: 1, secrets: good}, codes.OK},
		{"delta", metaReq{base: v.id("s1"), target: v.id("s2"), secrets: good}, codes.OK},
		{"admin's key", metaReq{target: v.id("s2"), secrets: map[string]string{"userID": "admin", "userKey": admin}}, codes.OK},
		{"wrong key", metaReq{target: v.id("s2"), secrets: map[string]string{"userID": user, "userKey": bad}}, codes.Unauthenticated},
		{"wrong key, delta", metaReq{base: v.id("s1"), target: v.id("s2"), secrets: map[string]string{"userID": user, "userKey": bad}}, codes.Unauthenticated},
		{"unknown user", metaReq{target: v.id("s2"), secrets: map[string]string{"userID": "nobody-" + user, "userKey": key}}, codes.Unauthenticated},
		{"key without user", metaReq{target: v.id("s2"), secrets: map[string]string{"userKey": key}}, codes.InvalidArgument},
		{"key under another name", metaReq{target: v.id("s2"), secrets: map[string]string{"userID": user, "key": key}}, codes.InvalidArgument},
		{"unknown snapshot", metaReq{target: v.id("nope"), secrets: good}, codes.NotFound},
		{"unknown pool", metaReq{target: clusterID + "/nopool/" + v.name + "@s1", secrets: good}, codes.NotFound},
		{"malformed ID", metaReq{target: "x@y", secrets: good}, codes.InvalidArgument},
		{"base newer than target", metaReq{base: v.id("s2"), target: v.id("s1"), secrets: good}, codes.InvalidArgument},
		{"offset beyond the end", metaReq{target: v.id("s2"), start: 1 << 40, secrets: good}, codes.OutOfRange},
		{"unreachable monitors", metaReq{target: "rsm-rel-down/rbd/" + v.name + "@s2", secrets: good}, codes.Unavailable},
	}
	var wg sync.WaitGroup
	results := make([]metaStream, len(cases))
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			results[i] = srv.call(ctx, c.req)
		}()
	}
	wg.Wait()
	for i, c := range cases {
		m := results[i]
		if c.want == codes.OK && m.err != nil || c.want != codes.OK && status.Code(m.err) == codes.OK {
			t.Errorf("%s: %v, want %v", c.name, m.err, c.want)
		} else if status.Code(m.err) != c.want {
			// The code is not what this test is about; TestErrors is.
			t.Logf("%s: %v (expected %v)", c.name, status.Code(m.err), c.want)
		}
		msg := status.Convert(m.err).Message()
		for _, k := range keys {
			if strings.Contains(msg, k) || (len(k) > 20 && strings.Contains(msg, k[:20])) {
				t.Errorf("%s: the status message carries a key: %q", c.name, msg)
			}
		}
	}
	// A stream cancelled by the client.
	ctx, cancel := context.WithCancel(context.Background())
	recv, err := srv.open(ctx, metaReq{target: v.id("s2"), max: 1, secrets: good})
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
	for strings.Count(srv.log(), `"Stream finished"`) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	log := srv.log()
	if n := strings.Count(log, `"Request"`); n < len(cases)+1 {
		t.Errorf("the -v=10 log has %d requests, want %d", n, len(cases)+1)
	}
	for _, want := range []string{`"Sending page"`, `"Stream finished"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the -v=10 log lacks %s; the test proves nothing", want)
		}
	}
	body := scrape(t, addr)
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
