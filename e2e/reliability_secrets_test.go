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
	r := startSecrets(t)
	cases := r.cases()
	results := r.callAll(cases)
	r.checkAnswers(t, cases, results)
	r.cancelledStream(t)
	log := r.fullLog(t, len(cases)+1)
	r.noKeys(t, log, len(cases)+1)
}

// secretsCase is a request of TestReliabilitySecrets and the code it
// should get.
type secretsCase struct {
	name string
	req  harness.MetaReq
	want codes.Code
}

// secretsRun is what TestReliabilitySecrets' steps share: the volume, the
// server and its metrics address, the CSI user's secrets and the keys to
// look for (the right one, a wrong one, the admin's).
type secretsRun struct {
	v         harness.RbdVolume
	srv       *harness.Server
	addr      string
	user, key string
	admin     string
	bad       string
	keys      []string
	good      map[string]string
}

// startSecrets: a volume with two snapshots, and a server at -v=10 with
// metrics and a cluster ID whose monitors are unreachable; a wrong key
// that looks like the right one, hidden in the server's output.
func startSecrets(t *testing.T) *secretsRun {
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
	return &secretsRun{v: v, srv: srv, addr: addr, user: user, key: key, admin: admin, bad: bad, keys: keys, good: good}
}

// cases are the good and bad requests, each with the code it should get.
func (r *secretsRun) cases() []secretsCase {
	v, user, key, admin, bad, good := r.v, r.user, r.key, r.admin, r.bad, r.good
	return []secretsCase{
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
}

// callAll makes every case's request at once and returns their answers,
// once all have ended.
func (r *secretsRun) callAll(cases []secretsCase) []harness.MetaStream {
	var wg sync.WaitGroup
	results := make([]harness.MetaStream, len(cases))
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			results[i] = r.srv.Call(ctx, c.req)
		}()
	}
	wg.Wait()
	return results
}

// checkAnswers checks that each case got OK or not as it should (logging
// another code than expected), and that no status message carries a key.
func (r *secretsRun) checkAnswers(t *testing.T, cases []secretsCase, results []harness.MetaStream) {
	for i, c := range cases {
		m := results[i]
		if c.want == codes.OK && m.Err != nil || c.want != codes.OK && status.Code(m.Err) == codes.OK {
			t.Errorf("%s: %v, want %v", c.name, m.Err, c.want)
		} else if status.Code(m.Err) != c.want {
			// The code is not what this test is about; TestErrors is.
			t.Logf("%s: %v (expected %v)", c.name, status.Code(m.Err), c.want)
		}
		msg := status.Convert(m.Err).Message()
		for _, k := range r.keys {
			if strings.Contains(msg, k) || (len(k) > 20 && strings.Contains(msg, k[:20])) {
				t.Errorf("%s: the status message carries a key: %q", c.name, msg)
			}
		}
	}
}

// cancelledStream: a stream cancelled by the client after its first page
// ends CANCELLED (or OK, had it all arrived).
func (r *secretsRun) cancelledStream(t *testing.T) {
	// A stream cancelled by the client.
	ctx, cancel := context.WithCancel(context.Background())
	recv, err := r.srv.Open(ctx, harness.MetaReq{Target: r.v.ID("s2"), Max: 1, Secrets: r.good})
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
}

// fullLog waits (up to 10 s) for the finished streams' lines and returns
// the server's log, checking that it has every one of the requests and
// the -v=10 lines.
func (r *secretsRun) fullLog(t *testing.T, requests int) string {
	// The three OK streams and the cancelled one reach the log with a
	// "Stream finished" line. (Streams that fail before their diff starts
	// are logged only with their request: see the report.)
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(r.srv.Log(), `"Stream finished"`) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	log := r.srv.Log()
	if n := strings.Count(log, `"Request"`); n < requests {
		t.Errorf("the -v=10 log has %d requests, want %d", n, requests)
	}
	for _, want := range []string{`"Sending page"`, `"Stream finished"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the -v=10 log lacks %s; the test proves nothing", want)
		}
	}
	return log
}

// noKeys checks that /metrics has the RPC counts and that neither it nor
// the log carries a key, or its first 20 characters.
func (r *secretsRun) noKeys(t *testing.T, log string, requests int) {
	body := harness.Scrape(t, r.addr)
	if !strings.Contains(body, "rbd_snapshot_metadata_rpcs_total") {
		t.Errorf("/metrics lacks the RPC counts")
	}
	for _, k := range r.keys {
		for what, text := range map[string]string{"the server log": log, "/metrics": body} {
			if strings.Contains(text, k) || strings.Contains(text, k[:20]) {
				t.Errorf("%s carries a key (or its first 20 characters)", what)
			}
		}
	}
	t.Logf("%d requests at -v=10: %d log lines, %d bytes of /metrics, no key", requests, strings.Count(log, "\n"), len(body))
}
