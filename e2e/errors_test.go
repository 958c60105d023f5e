//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestErrors checks the status codes of requests that cannot be served,
// through the real server and cluster: the snapshots named do not exist,
// do not fit together, or the secrets are missing. No error may come with
// a page, and no status message may contain a key.
func TestErrors(t *testing.T) {
	conn := connectAdmin(t)
	a, img := createVolume(t, conn, "", "err-a", 8*mib, imageFeatures)
	fillAt(t, img, 0, 4*kib)
	snapshot(t, img, "s1")
	fillAt(t, img, 4*kib, 4*kib)
	snapshot(t, img, "s2")
	b, imgB := createVolume(t, conn, "", "err-b", 8*mib, imageFeatures)
	snapshot(t, imgB, "s1")
	ns, imgNS := createVolume(t, conn, namespace, "err-ns", 8*mib, imageFeatures)
	snapshot(t, imgNS, "s1")
	srv := startServer(t, "--ceph-connect-timeout=5s")

	secrets := csiSecrets(t)
	without := func(k string) map[string]string {
		m := map[string]string{}
		for key, v := range secrets {
			if key != k {
				m[key] = v
			}
		}
		return m
	}
	A := func(snap string) string { return a.id(snap) }
	for _, tc := range []struct {
		name string
		req  metaReq
		want codes.Code
	}{
		// Allocated
		{"unknown cluster", metaReq{target: "no-such-cluster/rbd/" + a.name + "@s1"}, codes.NotFound},
		{"unknown pool", metaReq{target: clusterID + "/no-such-pool/" + a.name + "@s1"}, codes.NotFound},
		{"unknown namespace", metaReq{target: clusterID + "/rbd/no-such-ns/" + a.name + "@s1"}, codes.NotFound},
		{"unknown image", metaReq{target: clusterID + "/rbd/no-such-image@s1"}, codes.NotFound},
		{"unknown snapshot", metaReq{target: A("no-such-snap")}, codes.NotFound},
		{"image of another namespace", metaReq{target: clusterIDNS + "/rbd/" + a.name + "@s1"}, codes.NotFound},
		{"namespace image without its namespace", metaReq{target: clusterID + "/rbd/" + ns.name + "@s1"}, codes.NotFound},
		{"empty ID", metaReq{target: ""}, codes.InvalidArgument},
		{"ID without cluster", metaReq{target: "rbd/" + a.name + "@s1"}, codes.InvalidArgument},
		{"ID without snapshot", metaReq{target: clusterID + "/rbd/" + a.name}, codes.InvalidArgument},
		{"ID with empty snapshot", metaReq{target: A("")}, codes.InvalidArgument},
		{"ID with too many parts", metaReq{target: clusterID + "/rbd/ns1/x/" + a.name + "@s1"}, codes.InvalidArgument},
		{"negative max_results", metaReq{target: A("s1"), max: -1}, codes.InvalidArgument},
		{"no secrets", metaReq{target: A("s1"), secrets: map[string]string{}}, codes.InvalidArgument},
		{"no userKey", metaReq{target: A("s1"), secrets: without("userKey")}, codes.InvalidArgument},
		{"no userID", metaReq{target: A("s1"), secrets: without("userID")}, codes.InvalidArgument},
		{"userKey not a cephx key", metaReq{target: A("s1"), secrets: map[string]string{"userID": secrets["userID"], "userKey": "not a key!"}}, codes.InvalidArgument},
		// Delta
		{"delta: unknown base snapshot", metaReq{base: A("no-such-snap"), target: A("s2")}, codes.NotFound},
		{"delta: unknown target snapshot", metaReq{base: A("s1"), target: A("no-such-snap")}, codes.NotFound},
		{"delta: unknown image", metaReq{base: clusterID + "/rbd/no-such-image@s1", target: clusterID + "/rbd/no-such-image@s2"}, codes.NotFound},
		// Native IDs of different images name different volumes whether
		// or not they exist: the server need not look.
		{"delta: base in an unknown image", metaReq{base: clusterID + "/rbd/no-such-image@s1", target: A("s2")}, codes.InvalidArgument},
		{"delta: unknown cluster", metaReq{base: "no-such-cluster/rbd/" + a.name + "@s1", target: "no-such-cluster/rbd/" + a.name + "@s2"}, codes.NotFound},
		{"delta: base equals target", metaReq{base: A("s2"), target: A("s2")}, codes.InvalidArgument},
		{"delta: base newer than target", metaReq{base: A("s2"), target: A("s1")}, codes.InvalidArgument},
		{"delta: snapshots of different images", metaReq{base: A("s1"), target: b.id("s1")}, codes.InvalidArgument},
		{"delta: snapshots of different images, reversed", metaReq{base: b.id("s1"), target: A("s2")}, codes.InvalidArgument},
		{"delta: same image name in another namespace", metaReq{base: ns.id("s1"), target: clusterID + "/rbd/" + ns.name + "@s1"}, codes.InvalidArgument},
		{"delta: snapshots of different clusters", metaReq{base: A("s1"), target: clusterIDNS + "/rbd/" + a.name + "@s2"}, codes.InvalidArgument},
		{"delta: malformed base", metaReq{base: "rbd@s1", target: A("s2")}, codes.InvalidArgument},
		{"delta: no secrets", metaReq{base: A("s1"), target: A("s2"), secrets: map[string]string{}}, codes.InvalidArgument},
		{"delta: negative max_results", metaReq{base: A("s1"), target: A("s2"), max: -5}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req
			if r.secrets == nil {
				r.secrets = secrets
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			t0 := time.Now()
			m := srv.call(ctx, r)
			checkFailure(t, srv, r, m, tc.want)
			t.Logf("%v: %v (%v)", r, m.err, time.Since(t0).Round(time.Millisecond))
		})
	}

	// GetMetadataDelta without a base is not an Allocated call: the raw
	// client must be used, as metaReq turns an empty base into Allocated.
	t.Run("delta: empty base_snapshot_id", func(t *testing.T) {
		rawDeltaFails(t, srv, "", A("s2"), codes.InvalidArgument)
	})
	t.Run("delta: empty target_snapshot_id", func(t *testing.T) {
		rawDeltaFails(t, srv, A("s1"), "", codes.InvalidArgument)
	})
}

// checkFailure checks that a call failed with code want, sent no page,
// and that its message contains no key.
func checkFailure(t testing.TB, srv *rsmServer, r metaReq, m metaStream, want codes.Code) {
	t.Helper()
	if got := status.Code(m.err); got != want {
		t.Errorf("%v: %v, want %v", r, m.err, want)
	}
	if len(m.pages) > 0 {
		t.Errorf("%v: %d pages before the error", r, len(m.pages))
	}
	msg := status.Convert(m.err).Message()
	if msg == "" {
		t.Errorf("%v: %v has no message", r, m.err)
	}
	for _, k := range srv.hide {
		if k != "" && strings.Contains(msg, k) {
			t.Errorf("%v: the status message contains a key: %q", r, msg)
		}
	}
}

func rawDeltaFails(t testing.TB, srv *rsmServer, base, target string, want codes.Code) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := srv.sm.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{
		BaseSnapshotId: base, TargetSnapshotId: target, Secrets: csiSecrets(t)})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != want {
		t.Errorf("Delta(%q, %q): %v, want %v", base, target, err, want)
	}
}

// wrongKey returns key with its secret changed: still a well-formed cephx
// key, but not the user's.
func wrongKey(t testing.TB, key string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(key)
	if err != nil || len(b) <= 12 {
		t.Fatalf("CEPH_CSI_KEY is not a cephx key: %v", err)
	}
	for i := 12; i < len(b); i++ {
		b[i] ^= 0x5a
	}
	return base64.StdEncoding.EncodeToString(b)
}

// TestWrongKey: a wrong key, or an unknown user, fails with UNAUTHENTICATED
// (the spec's code for secrets that fail authentication) within about the
// connect timeout, well under 30 s, over msgr v1 and msgr2 alike;
// unreachable monitors are UNAVAILABLE. The key must appear neither in a
// status message nor in the server's log, and the right key works
// afterwards. TestMonitorForms covers every form of monitor address.
func TestWrongKey(t *testing.T) {
	conn := connectAdmin(t)
	v, img := createVolume(t, conn, "", "wrongkey", 8*mib, imageFeatures)
	fillAt(t, img, 0, 4*kib)
	snapshot(t, img, "s1")
	fillAt(t, img, mib, 4*kib)
	snapshot(t, img, "s2")

	// A cluster config with two more cluster IDs: the same monitor by its
	// msgr v2 address, and a monitor address where nothing listens.
	v2 := regexp.MustCompile(`v2:([0-9.]+:[0-9]+)`).FindStringSubmatch(clusterEnv(t, "CEPH_MON_HOST"))
	if v2 == nil {
		t.Fatalf("no v2 address in CEPH_MON_HOST=%s", clusterEnv(t, "CEPH_MON_HOST"))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	config := filepath.Join(t.TempDir(), "config.json")
	raw, err := os.ReadFile(filepath.Join(clusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var clusters []map[string]any
	if err := json.Unmarshal(raw, &clusters); err != nil {
		t.Fatal(err)
	}
	clusters = append(clusters,
		map[string]any{"clusterID": "rsm-e2e-v2", "monitors": []string{"v2:" + v2[1]}},
		map[string]any{"clusterID": "rsm-e2e-down", "monitors": []string{closed}})
	raw, _ = json.Marshal(clusters)
	if err := os.WriteFile(config, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	const connectTimeout = 5 * time.Second
	srv := startServer(t, "--ceph-connect-timeout="+connectTimeout.String(), "--clusterconfig", config)

	user, key := clusterEnv(t, "CEPH_CSI_USER"), clusterEnv(t, "CEPH_CSI_KEY")
	bad := wrongKey(t, key)
	srv.hide = append(srv.hide, bad)
	badSecrets := map[string]string{"userID": user, "userKey": bad}
	viaV2 := func(snap string) string { return "rsm-e2e-v2/rbd/" + v.name + "@" + snap }
	cases := map[string]struct {
		req  metaReq
		want codes.Code
	}{
		"allocated, wrong key":        {metaReq{target: v.id("s2"), secrets: badSecrets}, codes.Unauthenticated},
		"delta, wrong key":            {metaReq{base: v.id("s1"), target: v.id("s2"), secrets: badSecrets}, codes.Unauthenticated},
		"unknown user":                {metaReq{target: v.id("s2"), secrets: map[string]string{"userID": uniqueName(t, "nobody"), "userKey": key}}, codes.Unauthenticated},
		"msgr v2, wrong key":          {metaReq{target: viaV2("s2"), secrets: badSecrets}, codes.Unauthenticated},
		"msgr v2, right key":          {metaReq{base: viaV2("s1"), target: viaV2("s2")}, codes.OK},
		"unreachable monitors":        {metaReq{target: "rsm-e2e-down/rbd/" + v.name + "@s2"}, codes.Unavailable},
		"msgr v1, right key, at once": {metaReq{target: v.id("s2")}, codes.OK},
	}
	type result struct {
		m       metaStream
		elapsed time.Duration
	}
	results := map[string]result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, c := range cases {
		r := c.req
		if r.secrets == nil {
			r.secrets = csiSecrets(t)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			t0 := time.Now()
			m := srv.call(ctx, r)
			mu.Lock()
			results[name] = result{m, time.Since(t0)}
			mu.Unlock()
		}()
	}
	wg.Wait()
	for name, c := range cases {
		res := results[name]
		t.Run(name, func(t *testing.T) {
			if c.want == codes.OK {
				if res.m.err != nil || len(res.m.tuples()) == 0 {
					t.Errorf("%v: %d tuples, %v; want tuples", c.req, len(res.m.tuples()), res.m.err)
				}
			} else if !unknownUserUnanswered(t, c.want == codes.Unauthenticated, res.m.err) {
				checkFailure(t, srv, c.req, res.m, c.want)
			}
			if res.elapsed > 3*connectTimeout {
				t.Errorf("%v took %v; want about the connect timeout of %v at most, well under 30 s", c.req, res.elapsed, connectTimeout)
			}
			t.Logf("%d tuples, %v, after %v", len(res.m.tuples()), res.m.err, res.elapsed.Round(time.Millisecond))
		})
	}
	// The right key, after the wrong ones.
	if got := srv.get(t, metaReq{base: v.id("s1"), target: v.id("s2")}); len(got.tuples()) == 0 {
		t.Errorf("the right key after the wrong ones: no tuples")
	}
}

// unknownUserUnanswered reports whether err is tentacle's known answer to
// a refused login (a wrong key or an unknown user) over msgr v1: sometimes
// none at all, so that librados times out and the server says UNAVAILABLE
// (retryable) instead of UNAUTHENTICATED. Reef answers at once. It logs the
// case, so that a run shows how often it happened.
func unknownUserUnanswered(t testing.TB, refusedLogin bool, err error) bool {
	t.Helper()
	if !refusedLogin || os.Getenv("RSM_CEPH") != "tentacle" || status.Code(err) != codes.Unavailable {
		return false
	}
	t.Logf("tentacle's monitor gave a refused login no answer (a known limitation, see the README): %v", err)
	return true
}

// TestKeyOfAnotherType: an aes256k cephx key (tentacle's default), which
// reef's librados cannot read, fails with INVALID_ARGUMENT and a message
// that says so; tentacle's librados reads it and the cluster refuses it as
// a wrong key. A key of a type no librados reads fails the same way with
// both. Neither key may reach the log: librados quotes a key it cannot
// decode on its own stderr stream.
func TestKeyOfAnotherType(t *testing.T) {
	conn := connectAdmin(t)
	v, img := createVolume(t, conn, "", "keytype", 8*mib, imageFeatures)
	fillAt(t, img, 0, 4*kib)
	snapshot(t, img, "s1")
	srv := startServer(t)
	key := func(typ uint16) string {
		raw := make([]byte, 2+8+2+32) // type, created, length, secret
		binary.LittleEndian.PutUint16(raw, typ)
		binary.LittleEndian.PutUint16(raw[10:], 32)
		if _, err := rand.Read(raw[12:]); err != nil {
			t.Fatal(err)
		}
		k := base64.StdEncoding.EncodeToString(raw)
		srv.hide = append(srv.hide, k)
		return k
	}
	tentacle := os.Getenv("RSM_CLIENT_CEPH") == "tentacle"
	for _, c := range []struct {
		name string
		typ  uint16
		want codes.Code
		says string
	}{
		{"aes256k", 2, codes.InvalidArgument, "aes256k"},
		{"type 7", 7, codes.InvalidArgument, "type 7"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := metaReq{target: v.id("s1"), secrets: map[string]string{"userID": clusterEnv(t, "CEPH_CSI_USER"), "userKey": key(c.typ)}}
			if tentacle && c.typ == 2 {
				c.want, c.says = codes.Unauthenticated, ""
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			m := srv.call(ctx, r)
			if c.want == codes.Unauthenticated && unknownUserUnanswered(t, true, m.err) {
				return
			}
			checkFailure(t, srv, r, m, c.want)
			if msg := status.Convert(m.err).Message(); !strings.Contains(msg, c.says) {
				t.Errorf("%v: %q does not say %q", r, msg, c.says)
			}
		})
	}
}
