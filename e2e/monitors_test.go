//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestMonitorForms: every way Ceph-CSI's config.json can name a monitor
// connects, as it does with librados, and a wrong key or an unknown user is
// UNAUTHENTICATED, an answer the monitor gives, not a timeout (a timeout is
// UNAVAILABLE). The test cluster's monitor listens on non-default ports
// (msgr2 on BASE, v1 on BASE+1), so a bare address there is ambiguous to
// librados; a second cluster on IPv6 loopback, on Ceph's default ports 3300
// and 6789, covers the default-port and IPv6 forms.
func TestMonitorForms(t *testing.T) {
	r := &monFormsRun{forms: testClusterForms(t)}
	r.addIPv6Forms(t)
	// One image with data on each cluster, and a config with a cluster ID
	// per form.
	r.images(t)
	r.startServer(t)
	checkMonFormResults(t, r.callAll(t))
}

// monForm is one way of naming the monitors in config.json.
type monForm struct {
	name     string
	monitors []string
	cluster  *harness.ExtraCluster // nil: the test cluster
}

// monFormResult is one request's answer: the form and credentials it
// used, the code it wants, its stream and how long it took.
type monFormResult struct {
	name    string
	want    codes.Code
	m       harness.MetaStream
	elapsed time.Duration
}

// monFormsRun is what TestMonitorForms' steps share: the forms, the IPv6
// cluster, the volume with data on each cluster and the server.
type monFormsRun struct {
	forms       []monForm
	six         *harness.ExtraCluster
	vol, sixVol harness.RbdVolume
	srv         *harness.Server
}

// testClusterForms: the forms that name the test cluster's monitor, on its
// non-default ports, beside one where nothing listens.
func testClusterForms(t *testing.T) []monForm {
	m := regexp.MustCompile(`^\[v2:127\.0\.0\.1:(\d+),v1:127\.0\.0\.1:(\d+)\]$`).
		FindStringSubmatch(harness.ClusterEnv(t, "CEPH_MON_HOST"))
	if m == nil {
		t.Fatalf("CEPH_MON_HOST=%s: want [v2:127.0.0.1:P2,v1:127.0.0.1:P1]", harness.ClusterEnv(t, "CEPH_MON_HOST"))
	}
	v2, v1 := "127.0.0.1:"+m[1], "127.0.0.1:"+m[2]
	down := closedAddr(t)

	return []monForm{
		{"bare, non-default port speaking v1", []string{v1}, nil},
		{"bare, non-default port speaking msgr2", []string{v2}, nil},
		{"v1: typed", []string{"v1:" + v1}, nil},
		{"v2: typed", []string{"v2:" + v2}, nil},
		{"any: on the msgr2 port", []string{"any:" + v2}, nil},
		{"addrvec", []string{"[v2:" + v2 + ",v1:" + v1 + "]"}, nil},
		{"two entries in one string", []string{down + "," + v2}, nil},
		{"several monitors, the first down", []string{down, v2}, nil},
		{"several monitors, one down, typed", []string{"v2:" + v2, "v1:" + down}, nil},
		{"host name on the msgr2 port", []string{"localhost:" + m[1]}, nil},
		{"host name on the v1 port", []string{"localhost:" + m[2]}, nil},
	}
}

// addIPv6Forms starts the IPv6 cluster and adds the forms that name it;
// the host name form only where ::1 has one.
func (r *monFormsRun) addIPv6Forms(t *testing.T) {
	six := startIPv6Cluster(t)
	r.six = six
	r.forms = append(r.forms,
		monForm{"IPv6, bare on 6789 (v1)", []string{"[::1]:6789"}, six},
		monForm{"IPv6, bare on 3300 (msgr2)", []string{"[::1]:3300"}, six},
		monForm{"IPv6, no port (3300 and 6789)", []string{"::1"}, six},
		monForm{"IPv6, no port, bracketed", []string{"[::1]"}, six},
		monForm{"IPv6, typed v2", []string{"v2:[::1]:3300"}, six},
		monForm{"IPv6, addrvec", []string{"[v2:[::1]:3300,v1:[::1]:6789]"}, six},
		monForm{"IPv6, host name on 6789", []string{"ip6-localhost:6789"}, six},
	)
	if _, err := net.LookupHost("ip6-localhost"); err != nil {
		// Debian's /etc/hosts names ::1 so; a rootfs without it cannot test it.
		r.forms = r.forms[:len(r.forms)-1]
		t.Logf("no host name for ::1 (%v): that form is not tested", err)
	}
}

// images: one image with data, and its snapshot s1, on each cluster.
func (r *monFormsRun) images(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	vol, img := harness.CreateVolume(t, conn, "", "monforms", 8*harness.MiB, harness.ImageFeatures)
	harness.FillAt(t, img, harness.MiB, 4*harness.KiB)
	harness.Snapshot(t, img, "s1")
	// librbd's exclusive lock (a writer's) needs a client address of the
	// cluster's family; the server opens images read-only and needs none.
	sixConn := harness.ConnectTo(t, r.six.Env["CEPH_MON_HOST"], "admin", r.six.Env["CEPH_KEY"],
		[2]string{"ms_bind_ipv6", "true"}, [2]string{"ms_bind_ipv4", "false"})
	sixVol, sixImg := harness.CreateVolume(t, sixConn, "", "monforms6", 8*harness.MiB, harness.ImageFeatures)
	harness.FillAt(t, sixImg, 2*harness.MiB, 4*harness.KiB)
	harness.Snapshot(t, sixImg, "s1")
	r.vol, r.sixVol = vol, sixVol
}

// startServer: a config with a cluster ID per form, and a server on it.
func (r *monFormsRun) startServer(t *testing.T) {
	var clusters []map[string]any
	for i, f := range r.forms {
		clusters = append(clusters, map[string]any{"clusterID": fmt.Sprintf("form%d", i), "monitors": f.monitors})
	}
	raw, _ := json.MarshalIndent(clusters, "", "  ")
	config := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(config, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	const connectTimeout = 10 * time.Second
	// Every form's requests at once: more than the default --max-streams.
	r.srv = harness.StartServer(t, "--ceph-connect-timeout="+connectTimeout.String(), "--clusterconfig", config, "--max-streams=0")
}

// monFormSecrets are the CSI user's secrets for cluster c (nil: the test
// cluster).
func monFormSecrets(t *testing.T, c *harness.ExtraCluster) map[string]string {
	if c == nil {
		return harness.CSISecrets(t)
	}
	return map[string]string{"userID": "csi", "userKey": c.Env["CEPH_CSI_KEY"]}
}

// callAll: every form's requests, with the right key, a wrong key and an
// unknown user, all at once; their answers once all ended.
func (r *monFormsRun) callAll(t *testing.T) []monFormResult {
	var (
		mu      sync.Mutex
		results []monFormResult
		wg      sync.WaitGroup
	)
	for i, f := range r.forms {
		name := r.vol.Name
		if f.cluster != nil {
			name = r.sixVol.Name
		}
		id := fmt.Sprintf("form%d/%s/%s@s1", i, harness.Pool, name)
		good := monFormSecrets(t, f.cluster)
		bad := map[string]string{"userID": good["userID"], "userKey": harness.WrongKey(t, good["userKey"])}
		r.srv.Hide = append(r.srv.Hide, bad["userKey"])
		nobody := map[string]string{"userID": harness.UniqueName(t, "nobody"), "userKey": good["userKey"]}
		for _, c := range []struct {
			what    string
			secrets map[string]string
			want    codes.Code
		}{
			{"right key", good, codes.OK},
			{"wrong key", bad, codes.Unauthenticated},
			{"unknown user", nobody, codes.Unauthenticated},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				t0 := time.Now()
				got := r.srv.Call(ctx, harness.MetaReq{Target: id, Secrets: c.secrets})
				mu.Lock()
				results = append(results, monFormResult{f.name + ", " + c.what + " (" + strings.Join(f.monitors, " ") + ")", c.want, got, time.Since(t0)})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return results
}

// checkMonFormResults: a subtest per request: it got the code it wants
// (or a login the monitor left unanswered), and a right key's tuples.
func checkMonFormResults(t *testing.T, results []monFormResult) {
	for _, r := range results {
		t.Run(r.name, func(t *testing.T) {
			if got := codeOf(r.m.Err); got != r.want && !loginUnanswered(t, r.want == codes.Unauthenticated, r.m.Err) {
				t.Errorf("%v after %v; want %v", r.m.Err, r.elapsed.Round(time.Millisecond), r.want)
			}
			if r.want == codes.OK && len(r.m.Tuples()) == 0 {
				t.Errorf("no tuples")
			}
			t.Logf("%v, %d tuples, after %v", codeOf(r.m.Err), len(r.m.Tuples()), r.elapsed.Round(time.Millisecond))
		})
	}
}

// codeOf is the gRPC code of a stream's error: OK for nil.
func codeOf(err error) codes.Code { return status.Code(err) }

// closedAddr returns 127.0.0.1:PORT where nothing listens.
func closedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

// startIPv6Cluster starts a cluster on [::1] with the monitor on Ceph's
// default ports (v2 3300, v1 6789), stopped when the test ends. Only one
// can run on a machine at a time.
func startIPv6Cluster(t testing.TB) *harness.ExtraCluster {
	t.Helper()
	for _, p := range []string{"3300", "6789"} {
		if l, err := net.Listen("tcp", "[::1]:"+p); err != nil {
			t.Fatalf("[::1]:%s is taken (%v): is another e2e run's IPv6 cluster up? Run one at a time", p, err)
		} else {
			l.Close()
		}
	}
	base := 0
	for b := 17500; b < 18500 && base == 0; b += 100 {
		if l, err := net.Listen("tcp", "[::1]:"+strconv.Itoa(b+10)); err == nil {
			l.Close()
			base = b
		}
	}
	if base == 0 {
		t.Fatal("no free OSD port block on [::1] among 17500..18400")
	}
	return harness.StartExtraCluster(t, "::1", base, 3300, 6789)
}
