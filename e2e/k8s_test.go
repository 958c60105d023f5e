//go:build e2e

package e2e

// TestK8sSidecar runs the CO side for real: etcd and kube-apiserver on
// 127.0.0.1, Kubernetes' external-snapshot-metadata sidecar in front of our
// server's socket, and the sidecar's own client, snapshot-metadata-lister,
// as a backup application's ServiceAccount. The binaries come from
// e2e/k8s/k8s.sh build (run-e2e.sh passes their folder in RSM_K8S_BIN); there
// is no kubectl or curl in the rootfs, so the test speaks HTTP to the API
// server itself and does the snapshot controller's work by hand. Every
// process is the test's child, stopped by PID when it ends.
//
// With RSM_K8S_HOLD=DIR (e2e/k8s/k8s.sh up), TestK8sSidecar keeps its state in
// DIR and, once it passed, waits while DIR/hold exists.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

func TestK8sSidecar(t *testing.T) {
	r := startSidecar(t)
	r.identity(t)
	r.snapshots(t)
	r.listerQueries(t)
	t.Run("error/base-not-older", r.baseNotOlder)
	t.Run("no-role", r.noRole)
	t.Run("our-client-at-the-sidecar", r.ourClientAtTheSidecar)
	t.Run("stream-cap", r.streamCap)

	if os.Getenv("RSM_K8S_HOLD") != "" {
		r.k.Hold(t)
	}
}

// sidecarRun is what TestK8sSidecar's steps share: the control plane, our
// server behind the sidecar, and the Ceph-CSI snapshots (a1, a2 in the
// pool's default namespace, b1, b2 in ns1) and their bytes.
type sidecarRun struct {
	k                  *kube.Env
	srv                *harness.Server
	a1, a2, b1, b2     *harness.CSISnap
	da1, da2, db1, db2 []byte
}

// startSidecar: the control plane, our server and the sidecar in front of
// its socket come up, and the sidecar becomes healthy.
func startSidecar(t *testing.T) *sidecarRun {
	t0 := time.Now()
	k := kube.Start(t)
	srv := harness.StartServer(t, "-v=4", "--drivername", kube.Driver)
	sidecar := k.StartSidecar(t, "csi-snapshot-metadata", srv.Sock, k.Ports.GRPC, k.Ports.Health)
	harness.WaitFor(t, "sidecar /health", time.Minute, func() bool { return kube.Healthy(k.Ports.Health) || !sidecar.Running() })
	if !sidecar.Running() {
		t.Fatalf("the sidecar exited: %v\n%s", sidecar.Err, harness.Tail(k.Log("csi-snapshot-metadata"), 30))
	}
	t.Logf("bring-up: control plane, our server and the sidecar in %.1fs", time.Since(t0).Seconds())
	return &sidecarRun{k: k, srv: srv}
}

// identity: the sidecar accepted our Identity: it took the driver name
// from GetPluginInfo, waited for Probe to say ready and checked the
// capabilities before it became healthy.
func (r *sidecarRun) identity(t *testing.T) {
	if want := `CSI driver name: "` + kube.Driver + `"`; !strings.Contains(r.k.Log("csi-snapshot-metadata"), want) {
		t.Errorf("sidecar log lacks %q", want)
	}
	var identity []string
	for _, l := range strings.Split(r.srv.Log(), "\n") {
		if strings.Contains(l, `"Request"`) && strings.Contains(l, "csi.v1.Identity/") {
			identity = append(identity, l[strings.Index(l, "method="):])
		}
	}
	t.Logf("Identity calls (the first Probe is the test's):\n%s", strings.Join(identity, "\n"))
	for _, m := range []string{"GetPluginInfo", "Probe", "GetPluginCapabilities"} {
		if !strings.Contains(strings.Join(identity, "\n"), "/csi.v1.Identity/"+m+`"`) {
			t.Errorf("the sidecar did not call %s", m)
		}
	}
}

// snapshots: Ceph-CSI volumes and snapshots, in the pool's default
// namespace and in ns1, with their VolumeSnapshots.
func (r *sidecarRun) snapshots(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	def := harness.NewCSICluster(t, conn, harness.ClusterID, "")
	a := def.CreateVolume(t, csiVolSize, nil)
	for _, w := range [][2]uint64{{0, 4096}, {5*harness.MiB + 12288, 8192}, {9 * harness.MiB, 64 << 10}, {12 * harness.MiB, harness.ObjSize}, {20*harness.MiB + 7, 100}, {csiVolSize - 4096, 4096}} {
		a.Write(t, w[0], w[1])
	}
	r.a1 = a.Snapshot(t)
	a.Write(t, 4096, 8192)
	a.Write(t, 9*harness.MiB+1000, 50)
	a.Write(t, 16*harness.MiB-2048, 4096)
	a.Discard(t, 12*harness.MiB, harness.ObjSize)
	a.Write(t, 28*harness.MiB, 4096)
	r.a2 = a.Snapshot(t)
	a.Write(t, 24*harness.MiB, 4096) // after the last snapshot: no answer may see it

	ns1 := harness.NewCSICluster(t, conn, harness.ClusterIDNS, harness.Namespace)
	b := ns1.CreateVolume(t, 16*harness.MiB, nil)
	b.Write(t, harness.MiB, 3*harness.MiB)
	r.b1 = b.Snapshot(t)
	b.Write(t, 2*harness.MiB, 4096)
	b.Write(t, 15*harness.MiB, 100)
	r.b2 = b.Snapshot(t)

	r.da1, r.da2, r.db1, r.db2 = r.a1.Data(t), r.a2.Data(t), r.b1.Data(t), r.b2.Data(t)
	for _, v := range []struct {
		name string
		s    *harness.CSISnap
		size int
	}{{"snap-a1", r.a1, len(r.da1)}, {"snap-a2", r.a2, len(r.da2)}, {"snap-b1", r.b1, len(r.db1)}, {"snap-b2", r.b2, len(r.db2)}} {
		r.k.VolumeSnapshot(t, v.name, v.s.Handle(), int64(v.size))
	}
}

// sidecarQuery is a lister run through the sidecar: its subtest's name,
// the lister's arguments, and the request our server must get (base
// nil: allocated) with the bytes its answer must match.
type sidecarQuery struct {
	name       string
	args       []string
	base, targ *harness.CSISnap
	before     []byte // nil: allocated
	after      []byte
	start      int64
	max        int32
}

// listerQueries: the lister's Allocated and Delta, by name and by handle,
// paged and from an offset, in both namespaces (listerMatches).
func (r *sidecarRun) listerQueries(t *testing.T) {
	a1, a2, b1, b2 := r.a1, r.a2, r.b1, r.b2
	da1, da2, db1, db2 := r.da1, r.da2, r.db1, r.db2
	for _, q := range []sidecarQuery{
		{"allocated", []string{"-s", "snap-a1", "-o", "table"}, nil, a1, nil, da1, 0, 0},
		{"allocated/max-results=2", []string{"-s", "snap-a2", "-max-results", "2"}, nil, a2, nil, da2, 0, 2},
		{"delta/by-name", []string{"-s", "snap-a2", "-p", "snap-a1", "-max-results", "3"}, a1, a2, da1, da2, 0, 3},
		{"delta/by-handle", []string{"-s", "snap-a2", "-P", a1.Handle()}, a1, a2, da1, da2, 0, 0},
		{"delta/by-name/from-9MiB", []string{"-s", "snap-a2", "-p", "snap-a1", "-starting-offset", fmt.Sprint(9*harness.MiB + 512)}, a1, a2, da1, da2, int64(9*harness.MiB + 512), 0},
		{"ns1/allocated", []string{"-s", "snap-b2"}, nil, b2, nil, db2, 0, 0},
		{"ns1/delta/by-handle", []string{"-s", "snap-b2", "-P", b1.Handle(), "-o", "table", "-max-results", "1"}, b1, b2, db1, db2, 0, 1},
	} {
		t.Run(q.name, func(t *testing.T) { r.listerMatches(t, q) })
	}
}

// listerMatches: the lister's answer to q matches the byte oracle (and,
// for a Delta, covers the writes between the snapshots); our server got
// the one request q stands for; and the sidecar passed our pages through
// as a direct call gets them, within max-results.
func (r *sidecarRun) listerMatches(t *testing.T, q sidecarQuery) {
	srv := r.srv
	before := len(requestLines(srv.Log()))
	out, err := r.k.Lister(t, kube.BackupSA, q.args...)
	if err != nil {
		t.Fatalf("lister %v: %v\n%s", q.args, err, out)
	}
	pages := kube.ParseLister(t, out)
	got := csiAnswer{capacity: -1}
	for _, p := range pages {
		got.capacity = p.Capacity
		got.extents = append(got.extents, p.Tuples...)
	}
	what := "lister " + strings.Join(q.args, " ")
	csiCheckOracle(t, what, got, q.before, q.after, q.start)
	if q.base != nil {
		csiCheckTouched(t, what, got, 0, q.targ.Vol.Writes[q.base.Mark:q.targ.Mark])
	}

	// What the sidecar sent us, as our server logged it.
	reqs := requestLines(srv.Log())[before:]
	if len(reqs) != 1 {
		t.Fatalf("%s: our server got %d requests, want 1:\n%s", what, len(reqs), strings.Join(reqs, "\n"))
	}
	t.Logf("the sidecar sent: %s", reqs[0])
	req := harness.MetaReq{Target: q.targ.Handle(), Start: q.start, Max: q.max}
	if q.base != nil {
		req.Base = q.base.Handle()
	}
	checkRequestLine(t, reqs[0], req)

	// The sidecar passes pages through as they are: the lister
	// gets exactly what a direct call gets.
	direct := srv.Get(t, req)
	if len(direct.Pages) != len(pages) {
		t.Errorf("%s: %d records, a direct call %d pages", what, len(pages), len(direct.Pages))
	}
	if d := harness.DiffSpans(direct.Tuples(), got.extents); d != "" {
		t.Errorf("%s vs a direct call: %s", what, d)
	}
	if q.max > 0 {
		for i, p := range pages {
			if len(p.Tuples) > int(q.max) {
				t.Errorf("%s: record %d has %d tuples, max-results %d", what, i+1, len(p.Tuples), q.max)
			}
		}
	}
}

// baseNotOlder: our error codes pass through the sidecar to the client:
// a Delta from a newer base gets our InvalidArgument.
func (r *sidecarRun) baseNotOlder(t *testing.T) {
	out, err := r.k.Lister(t, kube.BackupSA, "-s", "snap-a1", "-p", "snap-a2")
	if err == nil || !strings.Contains(out, "InvalidArgument") || !strings.Contains(out, "not older") {
		t.Fatalf("delta from a newer base: %v\n%s\nwant InvalidArgument, not older", err, out)
	}
	t.Logf("the lister got: %s", lastLine(out))
}

// noRole: a ServiceAccount without the client role: given a token of it
// (the lister runs as admin to get that far), the sidecar refuses it and
// never calls us; with its own kubeconfig it cannot even read the
// snapshot.
func (r *sidecarRun) noRole(t *testing.T) {
	k, srv := r.k, r.srv
	n := len(requestLines(srv.Log()))
	out, err := k.ListerAs(t, k.Kubeconfig(t, "admin", ""), kube.NoRoleSA, "-s", "snap-a1")
	if err == nil || !strings.Contains(out, "PermissionDenied") {
		t.Errorf("lister with a token of %s (no role): %v\n%s\nwant PermissionDenied", kube.NoRoleSA, err, out)
	} else {
		t.Logf("refused as it should be: %s", lastLine(out))
	}
	own := k.SAKubeconfig(t, kube.NoRoleSA)
	out, err = k.ListerAs(t, own, kube.NoRoleSA, "-s", "snap-a1")
	if err == nil || !strings.Contains(strings.ToLower(out), "forbidden") {
		t.Errorf("lister as %s: %v\n%s\nwant forbidden", kube.NoRoleSA, err, out)
	} else {
		t.Logf("refused as it should be: %s", lastLine(out))
	}
	if reqs := requestLines(srv.Log())[n:]; len(reqs) != 0 {
		t.Errorf("our server was called for a refused client: %v", reqs)
	}
}

// ourClientAtTheSidecar: the project's client speaks CSI's
// SnapshotMetadata; the sidecar serves its own API
// (external-snapshot-metadata's schema.proto: namespace, VolumeSnapshot
// names and a security token). The client cannot use it.
func (r *sidecarRun) ourClientAtTheSidecar(t *testing.T) {
	k := r.k
	pool := x509.NewCertPool()
	pool.AddCert(k.PKI.CA)
	cc, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", k.Ports.GRPC),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = client.New(cc).Stream(ctx, client.Request{Target: r.a1.Handle(), Secrets: map[string]string{"userID": harness.ClusterEnv(t, "CEPH_CSI_USER"), "userKey": harness.ClusterEnv(t, "CEPH_CSI_KEY")}}, func(client.Page) error { return nil })
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("csi.v1.SnapshotMetadata at the sidecar: %v, want Unimplemented", err)
	}
	t.Logf("as expected, the sidecar does not serve csi.v1.SnapshotMetadata: %v", err)
}

// streamCap: the sidecar's cap on a stream (--max-streaming-duration-min,
// 1 here): its deadline covers the whole call and travels with its call
// to us. Our server is stopped (SIGSTOP) so that the call outlasts the
// cap: the client must get DEADLINE_EXCEEDED at the cap, never OK, and
// our server, once it runs again, must end that call as cancelled by its
// caller (its deadline is relative, so our server cannot tell it has
// passed: the sidecar's cancellation ends it).
func (r *sidecarRun) streamCap(t *testing.T) {
	srv := r.srv
	if os.Getenv("RSM_K8S_HOLD") != "" {
		t.Skip("held run: no one-minute wait")
	}
	// Our server's end of the capped call: cancelled by the caller. (The
	// call's message may not even be read: no "Request" line then.)
	cancelled := func() int {
		n := 0
		for _, l := range strings.Split(srv.Log(), "\n") {
			if strings.Contains(l, "/csi.v1.SnapshotMetadata/GetMetadataAllocated") && strings.Contains(l, `code="Canceled"`) {
				n++
			}
		}
		return n
	}
	n := cancelled()
	if err := srv.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			_ = srv.Cmd.Process.Signal(syscall.SIGCONT)
			stopped = false
		}
	}
	defer cont()
	t0 := time.Now()
	out, err := r.k.Lister(t, kube.BackupSA, "-s", "snap-a1")
	took := time.Since(t0)
	cont()
	if err == nil || !strings.Contains(out, "DeadlineExceeded") {
		t.Fatalf("a call beyond the sidecar's cap: %v\n%s\nwant DeadlineExceeded", err, out)
	}
	if took < time.Minute {
		t.Errorf("the lister got DeadlineExceeded after %v, before the 1 min cap", took)
	}
	t.Logf("at the cap (1 min) the client got, after %.1fs: %s", took.Seconds(), lastLine(out))
	harness.WaitFor(t, "our server's end of the capped call (Canceled)", 30*time.Second, func() bool {
		return cancelled() > n
	})
}

// TestK8sSidecarWaitsForNotReadyServer: a sidecar that starts before our
// server is ready (its cluster config is not there yet: a ConfigMap volume
// not yet filled, a broken edit) must wait, and become healthy once the
// config is there. The sidecar waits with csi-lib-utils' ProbeForever: it
// retries while Probe answers ready=false or DEADLINE_EXCEEDED, and exits on
// any other error, FAILED_PRECONDITION included; the pod then restarts,
// with a growing back-off.
func TestK8sSidecarWaitsForNotReadyServer(t *testing.T) {
	k := kube.Start(t)
	config := filepath.Join(k.Dir, "late", "csi-config.json")
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(k.Dir, "late.sock")
	srv := k.StartProcess(t, "rbd-snapshot-metadata", harness.ClusterEnv(t, "RSM_SERVER_BIN"), "--endpoint", "unix://"+sock,
		"--clusterconfig", config, "--drivername", kube.Driver, "-v=4")
	harness.WaitFor(t, "our server's socket", 20*time.Second, func() bool {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode()&os.ModeSocket != 0 || !srv.Running()
	})
	if !srv.Running() {
		t.Fatalf("our server exited without its cluster config: %v\n%s", srv.Err, k.Log(srv.Name))
	}
	sidecar := k.StartSidecar(t, "csi-snapshot-metadata", sock, k.Ports.GRPC, k.Ports.Health)
	sidecar.MayExit = true
	time.Sleep(3 * time.Second) // 3 probes
	if !sidecar.Running() {
		t.Fatalf("the sidecar exited while our server was not ready, instead of waiting (%v):\n%s\nour server:\n%s",
			sidecar.Err, harness.Tail(k.Log(sidecar.Name), 4), grepLines(k.Log(srv.Name), "Identity/Probe"))
	}
	if kube.Healthy(k.Ports.Health) {
		t.Fatal("the sidecar is healthy before our server is ready")
	}
	b, err := os.ReadFile(filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	kube.WriteFile(t, config, string(b))
	harness.WaitFor(t, "sidecar /health once the config is there", 30*time.Second, func() bool {
		return kube.Healthy(k.Ports.Health) || !sidecar.Running()
	})
	if !sidecar.Running() {
		t.Fatalf("the sidecar exited: %v\n%s", sidecar.Err, harness.Tail(k.Log(sidecar.Name), 10))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// ------------------------------------------------------- our server's log --

// requestLines returns the server's -v=4 "Request" lines of SnapshotMetadata
// RPCs, in order.
func requestLines(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `"Request"`) && strings.Contains(l, "csi.v1.SnapshotMetadata/") {
			out = append(out, l)
		}
	}
	return out
}

// checkRequestLine checks a logged request against what the sidecar must
// have sent: the snapshot handles, starting_offset, max_results, and
// secrets (stripped in the log).
func checkRequestLine(t *testing.T, line string, want harness.MetaReq) {
	t.Helper()
	m := regexp.MustCompile(`request="(.*)"\s*$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no request in the log line %q", line)
	}
	js, err := strconv.Unquote(`"` + m[1] + `"`)
	if err != nil {
		t.Fatalf("log line %q: %v", line, err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatalf("logged request %s: %v", js, err)
	}
	exp := map[string]any{"secrets": "***stripped***"}
	if want.Base == "" {
		exp["snapshot_id"] = want.Target
	} else {
		exp["base_snapshot_id"] = want.Base
		exp["target_snapshot_id"] = want.Target
	}
	if want.Start != 0 {
		exp["starting_offset"] = float64(want.Start)
	}
	if want.Max != 0 {
		exp["max_results"] = float64(want.Max)
	}
	if fmt.Sprint(got) != fmt.Sprint(exp) {
		t.Errorf("the sidecar sent %v, want %v", got, exp)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}
