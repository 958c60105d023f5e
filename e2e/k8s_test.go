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
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
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
)

const (
	k8sDriver    = "rbd.csi.ceph.com" // = the SMS CR's name = the class's driver
	k8sNS        = "backup-e2e"
	k8sAudience  = "rsm-e2e-sidecar"
	k8sClass     = "csi-rbd-snapclass"
	k8sSecret    = "csi-rbd-snapshotter"
	k8sSidecarSA = "csi-snapshot-metadata"
	k8sBackupSA  = "backup-app"
	k8sNoRoleSA  = "intruder"
)

// k8sEnv is a running control plane plus, once started, the sidecar.
type k8sEnv struct {
	bin, dir string
	ports    k8sPorts
	api      string
	http     *http.Client // as admin (system:masters)
	crt      *k8sPKI
}

type k8sPorts struct{ etcd, etcdPeer, api, grpc, health int }

func TestK8sSidecar(t *testing.T) {
	t0 := time.Now()
	k := startK8s(t)
	srv := harness.StartServer(t, "-v=4", "--drivername", k8sDriver)
	sidecar := k.startSidecar(t, "csi-snapshot-metadata", srv.Sock, k.ports.grpc, k.ports.health)
	waitFor(t, "sidecar /health", time.Minute, func() bool { return healthy(k.ports.health) || !sidecar.running() })
	if !sidecar.running() {
		t.Fatalf("the sidecar exited: %v\n%s", sidecar.err, harness.Tail(k.log("csi-snapshot-metadata"), 30))
	}
	t.Logf("bring-up: control plane, our server and the sidecar in %.1fs", time.Since(t0).Seconds())

	// The sidecar accepted our Identity: it took the driver name from
	// GetPluginInfo, waited for Probe to say ready and checked the
	// capabilities before it became healthy.
	if want := `CSI driver name: "` + k8sDriver + `"`; !strings.Contains(k.log("csi-snapshot-metadata"), want) {
		t.Errorf("sidecar log lacks %q", want)
	}
	var identity []string
	for _, l := range strings.Split(srv.Log(), "\n") {
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

	// Ceph-CSI volumes and snapshots, in the pool's default namespace and in
	// ns1, with their VolumeSnapshots.
	conn := harness.ConnectAdmin(t)
	def := harness.NewCSICluster(t, conn, harness.ClusterID, "")
	a := def.CreateVolume(t, csiVolSize, nil)
	for _, w := range [][2]uint64{{0, 4096}, {5*harness.MiB + 12288, 8192}, {9 * harness.MiB, 64 << 10}, {12 * harness.MiB, harness.ObjSize}, {20*harness.MiB + 7, 100}, {csiVolSize - 4096, 4096}} {
		a.Write(t, w[0], w[1])
	}
	a1 := a.Snapshot(t)
	a.Write(t, 4096, 8192)
	a.Write(t, 9*harness.MiB+1000, 50)
	a.Write(t, 16*harness.MiB-2048, 4096)
	a.Discard(t, 12*harness.MiB, harness.ObjSize)
	a.Write(t, 28*harness.MiB, 4096)
	a2 := a.Snapshot(t)
	a.Write(t, 24*harness.MiB, 4096) // after the last snapshot: no answer may see it

	ns1 := harness.NewCSICluster(t, conn, harness.ClusterIDNS, harness.Namespace)
	b := ns1.CreateVolume(t, 16*harness.MiB, nil)
	b.Write(t, harness.MiB, 3*harness.MiB)
	b1 := b.Snapshot(t)
	b.Write(t, 2*harness.MiB, 4096)
	b.Write(t, 15*harness.MiB, 100)
	b2 := b.Snapshot(t)

	da1, da2, db1, db2 := a1.Data(t), a2.Data(t), b1.Data(t), b2.Data(t)
	for _, v := range []struct {
		name string
		s    *harness.CSISnap
		size int
	}{{"snap-a1", a1, len(da1)}, {"snap-a2", a2, len(da2)}, {"snap-b1", b1, len(db1)}, {"snap-b2", b2, len(db2)}} {
		k.volumeSnapshot(t, v.name, v.s.Handle(), int64(v.size))
	}

	type run struct {
		name       string
		args       []string
		base, targ *harness.CSISnap
		before     []byte // nil: allocated
		after      []byte
		start      int64
		max        int32
	}
	for _, r := range []run{
		{"allocated", []string{"-s", "snap-a1", "-o", "table"}, nil, a1, nil, da1, 0, 0},
		{"allocated/max-results=2", []string{"-s", "snap-a2", "-max-results", "2"}, nil, a2, nil, da2, 0, 2},
		{"delta/by-name", []string{"-s", "snap-a2", "-p", "snap-a1", "-max-results", "3"}, a1, a2, da1, da2, 0, 3},
		{"delta/by-handle", []string{"-s", "snap-a2", "-P", a1.Handle()}, a1, a2, da1, da2, 0, 0},
		{"delta/by-name/from-9MiB", []string{"-s", "snap-a2", "-p", "snap-a1", "-starting-offset", fmt.Sprint(9*harness.MiB + 512)}, a1, a2, da1, da2, int64(9*harness.MiB + 512), 0},
		{"ns1/allocated", []string{"-s", "snap-b2"}, nil, b2, nil, db2, 0, 0},
		{"ns1/delta/by-handle", []string{"-s", "snap-b2", "-P", b1.Handle(), "-o", "table", "-max-results", "1"}, b1, b2, db1, db2, 0, 1},
	} {
		t.Run(r.name, func(t *testing.T) {
			before := len(requestLines(srv.Log()))
			out, err := k.lister(t, k8sBackupSA, r.args...)
			if err != nil {
				t.Fatalf("lister %v: %v\n%s", r.args, err, out)
			}
			pages := parseLister(t, out)
			got := csiAnswer{capacity: -1}
			for _, p := range pages {
				got.capacity = p.capacity
				got.extents = append(got.extents, p.tuples...)
			}
			what := "lister " + strings.Join(r.args, " ")
			csiCheckOracle(t, what, got, r.before, r.after, r.start)
			if r.base != nil {
				csiCheckTouched(t, what, got, 0, r.targ.Vol.Writes[r.base.Mark:r.targ.Mark])
			}

			// What the sidecar sent us, as our server logged it.
			reqs := requestLines(srv.Log())[before:]
			if len(reqs) != 1 {
				t.Fatalf("%s: our server got %d requests, want 1:\n%s", what, len(reqs), strings.Join(reqs, "\n"))
			}
			t.Logf("the sidecar sent: %s", reqs[0])
			req := harness.MetaReq{Target: r.targ.Handle(), Start: r.start, Max: r.max}
			if r.base != nil {
				req.Base = r.base.Handle()
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
			if r.max > 0 {
				for i, p := range pages {
					if len(p.tuples) > int(r.max) {
						t.Errorf("%s: record %d has %d tuples, max-results %d", what, i+1, len(p.tuples), r.max)
					}
				}
			}
		})
	}

	// Our error codes pass through the sidecar to the client.
	t.Run("error/base-not-older", func(t *testing.T) {
		out, err := k.lister(t, k8sBackupSA, "-s", "snap-a1", "-p", "snap-a2")
		if err == nil || !strings.Contains(out, "InvalidArgument") || !strings.Contains(out, "not older") {
			t.Fatalf("delta from a newer base: %v\n%s\nwant InvalidArgument, not older", err, out)
		}
		t.Logf("the lister got: %s", lastLine(out))
	})

	// A ServiceAccount without the client role: given a token of it (the
	// lister runs as admin to get that far), the sidecar refuses it and never
	// calls us; with its own kubeconfig it cannot even read the snapshot.
	t.Run("no-role", func(t *testing.T) {
		n := len(requestLines(srv.Log()))
		out, err := k.listerAs(t, k.kubeconfig(t, "admin", ""), k8sNoRoleSA, "-s", "snap-a1")
		if err == nil || !strings.Contains(out, "PermissionDenied") {
			t.Errorf("lister with a token of %s (no role): %v\n%s\nwant PermissionDenied", k8sNoRoleSA, err, out)
		} else {
			t.Logf("refused as it should be: %s", lastLine(out))
		}
		own := k.saKubeconfig(t, k8sNoRoleSA)
		out, err = k.listerAs(t, own, k8sNoRoleSA, "-s", "snap-a1")
		if err == nil || !strings.Contains(strings.ToLower(out), "forbidden") {
			t.Errorf("lister as %s: %v\n%s\nwant forbidden", k8sNoRoleSA, err, out)
		} else {
			t.Logf("refused as it should be: %s", lastLine(out))
		}
		if reqs := requestLines(srv.Log())[n:]; len(reqs) != 0 {
			t.Errorf("our server was called for a refused client: %v", reqs)
		}
	})

	// The project's client speaks CSI's SnapshotMetadata; the sidecar serves
	// its own API (external-snapshot-metadata's schema.proto: namespace,
	// VolumeSnapshot names and a security token). The client cannot use it.
	t.Run("our-client-at-the-sidecar", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AddCert(k.crt.ca)
		cc, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", k.ports.grpc),
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = client.New(cc).Stream(ctx, client.Request{Target: a1.Handle(), Secrets: map[string]string{"userID": harness.ClusterEnv(t, "CEPH_CSI_USER"), "userKey": harness.ClusterEnv(t, "CEPH_CSI_KEY")}}, func(client.Page) error { return nil })
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("csi.v1.SnapshotMetadata at the sidecar: %v, want Unimplemented", err)
		}
		t.Logf("as expected, the sidecar does not serve csi.v1.SnapshotMetadata: %v", err)
	})

	// The sidecar's cap on a stream (--max-streaming-duration-min, 1 here):
	// its deadline covers the whole call and travels with its call to us.
	// Our server is stopped (SIGSTOP) so that the call outlasts the cap: the
	// client must get DEADLINE_EXCEEDED at the cap, never OK, and our server,
	// once it runs again, must end that call as cancelled by its caller
	// (its deadline is relative, so our server cannot tell it has passed:
	// the sidecar's cancellation ends it).
	t.Run("stream-cap", func(t *testing.T) {
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
		out, err := k.lister(t, k8sBackupSA, "-s", "snap-a1")
		took := time.Since(t0)
		cont()
		if err == nil || !strings.Contains(out, "DeadlineExceeded") {
			t.Fatalf("a call beyond the sidecar's cap: %v\n%s\nwant DeadlineExceeded", err, out)
		}
		if took < time.Minute {
			t.Errorf("the lister got DeadlineExceeded after %v, before the 1 min cap", took)
		}
		t.Logf("at the cap (1 min) the client got, after %.1fs: %s", took.Seconds(), lastLine(out))
		waitFor(t, "our server's end of the capped call (Canceled)", 30*time.Second, func() bool {
			return cancelled() > n
		})
	})

	if os.Getenv("RSM_K8S_HOLD") != "" {
		k.hold(t)
	}
}

// TestK8sSidecarWaitsForNotReadyServer: a sidecar that starts before our
// server is ready (its cluster config is not there yet: a ConfigMap volume
// not yet filled, a broken edit) must wait, and become healthy once the
// config is there. The sidecar waits with csi-lib-utils' ProbeForever: it
// retries while Probe answers ready=false or DEADLINE_EXCEEDED, and exits on
// any other error, FAILED_PRECONDITION included; the pod then restarts,
// with a growing back-off.
func TestK8sSidecarWaitsForNotReadyServer(t *testing.T) {
	k := startK8s(t)
	config := filepath.Join(k.dir, "late", "csi-config.json")
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(k.dir, "late.sock")
	srv := k.start(t, "rbd-snapshot-metadata", harness.ClusterEnv(t, "RSM_SERVER_BIN"), "--endpoint", "unix://"+sock,
		"--clusterconfig", config, "--drivername", k8sDriver, "-v=4")
	waitFor(t, "our server's socket", 20*time.Second, func() bool {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode()&os.ModeSocket != 0 || !srv.running()
	})
	if !srv.running() {
		t.Fatalf("our server exited without its cluster config: %v\n%s", srv.err, k.log(srv.name))
	}
	sidecar := k.startSidecar(t, "csi-snapshot-metadata", sock, k.ports.grpc, k.ports.health)
	sidecar.mayExit = true
	time.Sleep(3 * time.Second) // 3 probes
	if !sidecar.running() {
		t.Fatalf("the sidecar exited while our server was not ready, instead of waiting (%v):\n%s\nour server:\n%s",
			sidecar.err, harness.Tail(k.log(sidecar.name), 4), grepLines(k.log(srv.name), "Identity/Probe"))
	}
	if healthy(k.ports.health) {
		t.Fatal("the sidecar is healthy before our server is ready")
	}
	b, err := os.ReadFile(filepath.Join(harness.ClusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, config, string(b))
	waitFor(t, "sidecar /health once the config is there", 30*time.Second, func() bool {
		return healthy(k.ports.health) || !sidecar.running()
	})
	if !sidecar.running() {
		t.Fatalf("the sidecar exited: %v\n%s", sidecar.err, harness.Tail(k.log(sidecar.name), 10))
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

// ------------------------------------------------------------ binaries --

func k8sBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("RSM_K8S_BIN")
	if msg := os.Getenv("RSM_K8S_BUILD_ERROR"); dir == "" && msg != "" {
		t.Fatal(msg)
	}
	if dir == "" {
		t.Fatal("RSM_K8S_BIN is not set: run e2e/run-e2e.sh (./dev.sh e2e), or export RSM_K8S_BIN=$(e2e/k8s/k8s.sh build) and add it to RSM_BIND")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl", "csi-snapshot-metadata", "snapshot-metadata-lister", "crds"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%v: e2e/k8s/k8s.sh build failed or its folder is not bound into the rootfs (see run-e2e.sh's output)", err)
		}
	}
	return dir
}

// ---------------------------------------------------------------- ports --

// k8sPortsFor picks five ports from base: etcd client and peer, API server,
// sidecar gRPC (which listens on all interfaces) and sidecar health. With
// RSM_K8S_PORT_BASE set, those or nothing; else the first free block of
// 23790, 23800, ..., 23890 (Ceph's clusters use 16500..17499).
func k8sPortsFor(t *testing.T) k8sPorts {
	t.Helper()
	bases := []int{}
	if v := os.Getenv("RSM_K8S_PORT_BASE"); v != "" {
		b, err := strconv.Atoi(v)
		if err != nil || b < 1024 || b+4 > 65535 || (b+4 >= 16500 && b < 17500) {
			t.Fatalf("bad RSM_K8S_PORT_BASE=%q (1024..65531, outside Ceph's 16500..17499)", v)
		}
		bases = append(bases, b)
	} else {
		for b := 23790; b <= 23890; b += 10 {
			bases = append(bases, b)
		}
	}
	for _, b := range bases {
		if busy := busyPorts(b, 5); len(busy) > 0 {
			t.Logf("ports %v are in use; not using %d..%d", busy, b, b+4)
			continue
		}
		return k8sPorts{etcd: b, etcdPeer: b + 1, api: b + 2, grpc: b + 3, health: b + 4}
	}
	t.Fatalf("no free block of 5 ports among %v (set RSM_K8S_PORT_BASE)", bases)
	return k8sPorts{}
}

func busyPorts(base, n int) []int {
	var busy []int
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			busy = append(busy, p)
			continue
		}
		l.Close()
	}
	return busy
}

// -------------------------------------------------------------- certs --

type k8sPKI struct {
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	dir   string
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newPKI(t *testing.T, dir string) *k8sPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rsm-e2e-k8s-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &k8sPKI{ca: ca, caKey: key, dir: dir}
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", der)
	return p
}

// issue writes dir/name.crt and name.key: a server certificate for
// 127.0.0.1 and localhost, or a client certificate when client is set.
func (p *k8sPKI) issue(t *testing.T, name string, subj pkix.Name, client bool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: subj,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(p.dir, name+".crt"), "CERTIFICATE", der)
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(p.dir, name+".key"), "EC PRIVATE KEY", kd)
}

func (p *k8sPKI) path(name string) string { return filepath.Join(p.dir, name) }

// ------------------------------------------------------------ processes --

// k8sProc is a process of the test, stopped by its PID when the test ends.
type k8sProc struct {
	name     string
	cmd      *exec.Cmd
	exited   chan struct{} // closed once waited for
	err      error
	mayExit  bool // an exit before the end is the test's business
	stopTook time.Duration
}

func (p *k8sProc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// start runs bin (a name in RSM_K8S_BIN, or a path) with args, its output
// in dir/logs/name.log, its PID in dir/pids/name; when the test ends it
// gets SIGTERM, and SIGKILL 20 s later.
func (k *k8sEnv) start(t *testing.T, name, bin string, args ...string) *k8sProc {
	t.Helper()
	logf, err := os.Create(filepath.Join(k.dir, "logs", name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(bin) {
		bin = filepath.Join(k.bin, bin)
	}
	p := &k8sProc{name: name, cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	// Killed with the test binary, should that die first.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	pid := p.cmd.Process.Pid
	go func() { p.err = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	writeFile(t, filepath.Join(k.dir, "pids", name), strconv.Itoa(pid))
	t.Cleanup(func() {
		if !p.running() {
			if !p.mayExit {
				t.Errorf("%s (pid %d) exited before the test ended: %v\n%s", name, pid, p.err, harness.Tail(k.log(name), 30))
			}
			return
		}
		t0 := time.Now()
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			t.Errorf("%s (pid %d) still running 20 s after SIGTERM: SIGKILL", name, pid)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		t.Logf("stopped %s (pid %d) in %.1fs", name, pid, time.Since(t0).Seconds())
		if t.Failed() {
			t.Logf("%s log:\n%s", name, harness.Tail(k.log(name), 60))
		}
	})
	return p
}

func (k *k8sEnv) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(k.dir, "logs", name+".log"))
	return string(b)
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls ok every 100 ms until it returns true, for at most d.
func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	t0 := time.Now()
	for !ok() {
		if time.Since(t0) > d {
			t.Fatalf("%s: not ready after %v", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s ready in %.1fs", what, time.Since(t0).Seconds())
}

// ------------------------------------------------------ control plane --

// startK8s starts etcd and kube-apiserver and creates what the sidecar and
// the backup application need: the CRDs, a namespace, the snapshotter
// secret (the Ceph-CSI-like user, not admin), a VolumeSnapshotClass, the
// SnapshotMetadataService CR, the ServiceAccounts and their RBAC.
func startK8s(t *testing.T) *k8sEnv {
	t.Helper()
	k := startControlPlane(t)
	t0 := time.Now()
	k.objects(t)
	t.Logf("objects created in %.1fs", time.Since(t0).Seconds())
	return k
}

// startControlPlane starts etcd and kube-apiserver and installs the CRDs
// (VolumeSnapshot* and SnapshotMetadataService).
func startControlPlane(t *testing.T) *k8sEnv {
	t.Helper()
	k := &k8sEnv{bin: k8sBin(t), dir: os.Getenv("RSM_K8S_HOLD")}
	if k.dir == "" {
		k.dir = t.TempDir()
	}
	for _, d := range []string{"logs", "pids", "pki"} {
		if err := os.MkdirAll(filepath.Join(k.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	k.ports = k8sPortsFor(t)
	k.api = fmt.Sprintf("https://127.0.0.1:%d", k.ports.api)
	t.Logf("ports: etcd %d/%d, kube-apiserver %d, sidecar gRPC %d (all interfaces), health %d; folder %s",
		k.ports.etcd, k.ports.etcdPeer, k.ports.api, k.ports.grpc, k.ports.health, k.dir)

	pki := newPKI(t, filepath.Join(k.dir, "pki"))
	pki.issue(t, "apiserver", pkix.Name{CommonName: "kube-apiserver"}, false)
	pki.issue(t, "sidecar", pkix.Name{CommonName: "csi-snapshot-metadata"}, false)
	pki.issue(t, "admin", pkix.Name{CommonName: "rsm-e2e-admin", Organization: []string{"system:masters"}}, true)
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, pki.path("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa))
	pub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	writePEM(t, pki.path("sa.pub"), "PUBLIC KEY", pub)
	k.crt = pki

	admin, err := tls.LoadX509KeyPair(pki.path("admin.crt"), pki.path("admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(pki.ca)
	k.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{admin}}}}

	etcd := fmt.Sprintf("http://127.0.0.1:%d", k.ports.etcd)
	peer := fmt.Sprintf("http://127.0.0.1:%d", k.ports.etcdPeer)
	k.start(t, "etcd", "etcd", "--name", "rsm-e2e", "--data-dir", filepath.Join(k.dir, "etcd"),
		"--listen-client-urls", etcd, "--advertise-client-urls", etcd,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "rsm-e2e="+peer, "--listen-metrics-urls=", "--unsafe-no-fsync")
	plain := &http.Client{Timeout: 5 * time.Second}
	waitFor(t, "etcd", time.Minute, func() bool {
		r, err := plain.Get(etcd + "/health")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		return bytes.Contains(b, []byte(`"health":"true"`))
	})

	k.start(t, "kube-apiserver", "kube-apiserver", "--etcd-servers="+etcd,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", k.ports.api),
		// Else it advertises the default route's address, and fails to
		// start without one; 127.0.0.1 needs the reconciler off.
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--tls-cert-file="+pki.path("apiserver.crt"), "--tls-private-key-file="+pki.path("apiserver.key"),
		"--client-ca-file="+pki.path("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki.path("sa.pub"), "--service-account-signing-key-file="+pki.path("sa.key"),
		"--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/24",
		// As on any cluster running Ceph-CSI: its nodeplugin DaemonSet is
		// privileged, and refused without it (k8s_operator_test.go).
		"--allow-privileged=true")
	waitFor(t, "kube-apiserver", 3*time.Minute, func() bool {
		code, body := k.do(t, "GET", "/readyz", "", "")
		return code == 200 && string(body) == "ok"
	})

	t0 := time.Now()
	crds := []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"}
	for _, c := range crds {
		k.createFile(t, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
			filepath.Join(k.bin, "crds", "snapshot.storage.k8s.io_"+c+".yaml"))
	}
	k.createFile(t, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
		filepath.Join(k.bin, "crds", "cbt.storage.k8s.io_snapshotmetadataservices.yaml"))
	for _, c := range append([]string{"snapshotmetadataservices.cbt.storage.k8s.io"}, crdNames(crds)...) {
		waitFor(t, "CRD "+c, time.Minute, func() bool {
			code, body := k.do(t, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+c, "", "")
			var crd struct {
				Status struct {
					Conditions []struct{ Type, Status string }
				}
			}
			_ = json.Unmarshal(body, &crd)
			for _, cond := range crd.Status.Conditions {
				if cond.Type == "Established" && cond.Status == "True" {
					return code == 200
				}
			}
			return false
		})
	}
	t.Logf("CRDs created in %.1fs", time.Since(t0).Seconds())
	return k
}

func crdNames(plural []string) []string {
	var out []string
	for _, p := range plural {
		out = append(out, p+".snapshot.storage.k8s.io")
	}
	return out
}

// do sends one request as admin and returns the status code and body.
func (k *k8sEnv) do(t *testing.T, method, path, ctype, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, k.api+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// must sends a request that must succeed, and keeps its body in
// dir/manifests for reading.
func (k *k8sEnv) must(t *testing.T, method, path, ctype, body string) []byte {
	t.Helper()
	code, resp := k.do(t, method, path, ctype, body)
	if code < 200 || code > 299 {
		t.Fatalf("%s %s: HTTP %d: %s\nrequest:\n%s", method, path, code, resp, body)
	}
	return resp
}

func (k *k8sEnv) create(t *testing.T, path, yaml string) {
	t.Helper()
	k.must(t, "POST", path, "application/yaml", yaml)
}

func (k *k8sEnv) createFile(t *testing.T, path, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	k.create(t, path, string(b))
}

// patchStatus merge-patches the status subresource: a POST drops status.
func (k *k8sEnv) patchStatus(t *testing.T, path, js string) {
	t.Helper()
	k.must(t, "PATCH", path+"/status", "application/merge-patch+json", js)
}

const rbacAPI = "/apis/rbac.authorization.k8s.io/v1"

func (k *k8sEnv) objects(t *testing.T) {
	t.Helper()
	k.create(t, "/api/v1/namespaces", "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+k8sNS+"}\n")
	k.create(t, "/api/v1/namespaces/"+k8sNS+"/secrets", fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: %s, namespace: %s}
stringData: {userID: %q, userKey: %q}
`, k8sSecret, k8sNS, harness.ClusterEnv(t, "CEPH_CSI_USER"), harness.ClusterEnv(t, "CEPH_CSI_KEY")))
	k.create(t, "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses", snapshotClass(k8sClass, k8sDriver))
	// Cluster-scoped and named after the driver; the address must match
	// the sidecar certificate's SAN; caCert is base64 of the PEM CA.
	ca, err := os.ReadFile(k.crt.path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	k.create(t, "/apis/cbt.storage.k8s.io/v1beta1/snapshotmetadataservices", fmt.Sprintf(`apiVersion: cbt.storage.k8s.io/v1beta1
kind: SnapshotMetadataService
metadata: {name: %s}
spec:
  address: 127.0.0.1:%d
  caCert: %s
  audience: %s
`, k8sDriver, k.ports.grpc, base64.StdEncoding.EncodeToString(ca), k8sAudience))
	for _, sa := range []string{k8sSidecarSA, k8sBackupSA, k8sNoRoleSA} {
		k.create(t, "/api/v1/namespaces/"+k8sNS+"/serviceaccounts",
			"apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: "+sa+", namespace: "+k8sNS+"}\n")
	}
	// The backup application: upstream's
	// deploy/snapshot-metadata-client-cluster-role.yaml, as is.
	k.create(t, rbacAPI+"/clusterroles", `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: external-snapshot-metadata-client-runner}
rules:
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshots, volumesnapshotcontents]
  verbs: [get, list, watch]
- apiGroups: [cbt.storage.k8s.io]
  resources: [snapshotmetadataservices]
  verbs: [get, list]
- apiGroups: [""]
  resources: [serviceaccounts/token]
  verbs: [create, get]
`)
	// The sidecar: upstream's deploy/snapshot-metadata-cluster-role.yaml
	// plus what it needs to read the snapshotter secret, which upstream
	// leaves to the driver's other roles: secrets get, and
	// volumesnapshotclasses get, list.
	k.create(t, rbacAPI+"/clusterroles", `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: external-snapshot-metadata-runner}
rules:
- apiGroups: [cbt.storage.k8s.io]
  resources: [snapshotmetadataservices]
  verbs: [get, list, watch]
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshots, volumesnapshotcontents, volumesnapshotclasses]
  verbs: [get, list]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
`)
	for role, sa := range map[string]string{"external-snapshot-metadata-client-runner": k8sBackupSA, "external-snapshot-metadata-runner": k8sSidecarSA} {
		k.create(t, rbacAPI+"/clusterrolebindings", fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: %s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %s}
subjects: [{kind: ServiceAccount, name: %s, namespace: %s}]
`, sa, role, sa, k8sNS))
	}
}

// snapshotClass is a VolumeSnapshotClass of driver whose snapshotter
// secret is the Ceph-CSI-like user's (k8sSecret in k8sNS).
func snapshotClass(name, driver string) string {
	return fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: %s}
driver: %s
deletionPolicy: Retain
parameters:
  clusterID: %s
  csi.storage.k8s.io/snapshotter-secret-name: %s
  csi.storage.k8s.io/snapshotter-secret-namespace: %s
`, name, driver, harness.ClusterID, k8sSecret, k8sNS)
}

// volumeSnapshot creates a bound, ready VolumeSnapshot and its
// VolumeSnapshotContent with the CSI snapshot handle, as the snapshot
// controller and the CSI snapshotter would.
func (k *k8sEnv) volumeSnapshot(t *testing.T, name, handle string, size int64) {
	t.Helper()
	k.volumeSnapshotOf(t, k8sDriver, k8sClass, name, handle, size)
}

// volumeSnapshotOf is volumeSnapshot for another driver and its class.
func (k *k8sEnv) volumeSnapshotOf(t *testing.T, driver, class, name, handle string, size int64) {
	t.Helper()
	const ss = "/apis/snapshot.storage.k8s.io/v1"
	vsc := "snapcontent-" + name
	k.create(t, ss+"/volumesnapshotcontents", fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: %s}
spec:
  driver: %s
  deletionPolicy: Retain
  volumeSnapshotClassName: %s
  source: {snapshotHandle: %q}
  volumeSnapshotRef: {name: %s, namespace: %s}
`, vsc, driver, class, handle, name, k8sNS))
	k.patchStatus(t, ss+"/volumesnapshotcontents/"+vsc, fmt.Sprintf(
		`{"status":{"snapshotHandle":%q,"readyToUse":true,"restoreSize":%d,"creationTime":%d}}`, handle, size, time.Now().UnixNano()))
	// Without a class (or a default one), the sidecar finds no secret.
	k.create(t, ss+"/namespaces/"+k8sNS+"/volumesnapshots", fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec:
  volumeSnapshotClassName: %s
  source: {volumeSnapshotContentName: %s}
`, name, k8sNS, class, vsc))
	k.patchStatus(t, ss+"/namespaces/"+k8sNS+"/volumesnapshots/"+name, fmt.Sprintf(
		`{"status":{"boundVolumeSnapshotContentName":%q,"readyToUse":true,"restoreSize":"%d"}}`, vsc, size))
}

// kubeconfig writes dir/<name>.kubeconfig: as admin (token empty) or with
// a token file.
func (k *k8sEnv) kubeconfig(t *testing.T, name, token string) string {
	t.Helper()
	user := fmt.Sprintf("{client-certificate: %q, client-key: %q}", k.crt.path("admin.crt"), k.crt.path("admin.key"))
	if token != "" {
		tf := filepath.Join(k.dir, name+".token")
		writeFile(t, tf, token)
		user = fmt.Sprintf("{tokenFile: %q}", tf)
	}
	path := filepath.Join(k.dir, name+".kubeconfig")
	writeFile(t, path, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: %s}]
contexts: [{name: e2e, context: {cluster: e2e, user: u, namespace: %s}}]
current-context: e2e
`, k.api, k.crt.path("ca.crt"), user, k8sNS))
	return path
}

// saKubeconfig is a kubeconfig with a 24 h token of the ServiceAccount.
func (k *k8sEnv) saKubeconfig(t *testing.T, sa string) string {
	t.Helper()
	body := k.must(t, "POST", "/api/v1/namespaces/"+k8sNS+"/serviceaccounts/"+sa+"/token", "application/json",
		`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":86400}}`)
	var tr struct{ Status struct{ Token string } }
	if err := json.Unmarshal(body, &tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("TokenRequest for %s: %v: %s", sa, err, body)
	}
	return k.kubeconfig(t, sa, tr.Status.Token)
}

// --------------------------------------------------------------- sidecar --

// startSidecar runs csi-snapshot-metadata in front of sock, as its
// ServiceAccount, on the gRPC and health ports given. It connects, then
// waits for our Probe to say ready, then checks our capabilities; only then
// is it healthy.
func (k *k8sEnv) startSidecar(t *testing.T, name, sock string, grpcPort, healthPort int) *k8sProc {
	t.Helper()
	kc := k.saKubeconfig(t, k8sSidecarSA)
	return k.start(t, name, "csi-snapshot-metadata", "--kubeconfig="+kc, "--csi-address=unix://"+sock,
		"--tls-cert="+k.crt.path("sidecar.crt"), "--tls-key="+k.crt.path("sidecar.key"),
		// The gRPC port has no bind flag: it listens on all interfaces.
		// The HTTP endpoint defaults to :8080; keep it on 127.0.0.1.
		fmt.Sprintf("--port=%d", grpcPort), fmt.Sprintf("--http-endpoint=127.0.0.1:%d", healthPort),
		"--timeout=30s", "--v=5",
		// The cap on a stream's length, at its least (whole minutes):
		// TestK8sSidecar's stream-cap reaches it.
		"--max-streaming-duration-min=1")
}

// healthy reports whether the sidecar's /health answers 200.
func healthy(port int) bool {
	c := &http.Client{Timeout: 5 * time.Second}
	r, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == 200
}

// --------------------------------------------------------------- lister --

// lister runs snapshot-metadata-lister as the ServiceAccount sa, with its
// own kubeconfig; it mints the audience-scoped token for the sidecar.
func (k *k8sEnv) lister(t *testing.T, sa string, args ...string) (string, error) {
	t.Helper()
	return k.listerAs(t, k.saKubeconfig(t, sa), sa, args...)
}

// listerAs runs the lister with kubeconfig, asking for a token of sa.
func (k *k8sEnv) listerAs(t *testing.T, kubeconfig, sa string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append([]string{"-kubeconfig", kubeconfig, "-service-account", sa, "-service-account-namespace", k8sNS, "-n", k8sNS}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(k.bin, "snapshot-metadata-lister"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t0 := time.Now()
	out, err := cmd.Output()
	t.Logf("lister %s: %.2fs, %d bytes, %v", strings.Join(args[8:], " "), time.Since(t0).Seconds(), len(out), err)
	return string(out) + stderr.String(), err
}

// k8sRecord is one record of the lister: one response message.
// parseLister reads the lister's output, -o json (a list of records) or
// the table.
type k8sRecord struct {
	capacity int64
	tuples   []harness.Span
}

func parseLister(t *testing.T, out string) []k8sRecord {
	t.Helper()
	s := strings.TrimSpace(out)
	var pages []k8sRecord
	if strings.HasPrefix(s, "[") {
		var recs []struct {
			Type     int   `json:"block_metadata_type"`
			Capacity int64 `json:"volume_capacity_bytes"`
			Blocks   []struct {
				Offset int64 `json:"byte_offset"`
				Size   int64 `json:"size_bytes"`
			} `json:"block_metadata"`
		}
		if err := json.Unmarshal([]byte(s), &recs); err != nil {
			t.Fatalf("lister JSON: %v\n%s", err, out)
		}
		for _, r := range recs {
			if r.Type != 2 { // VARIABLE_LENGTH in its schema.proto, as in CSI's
				t.Errorf("record of type %d, want VARIABLE_LENGTH (2)", r.Type)
			}
			p := k8sRecord{capacity: r.Capacity}
			for _, b := range r.Blocks {
				p.tuples = append(p.tuples, harness.Span{Offset: b.Offset, Length: b.Size})
			}
			pages = append(pages, p)
		}
		return pages
	}
	// Record#   VolCapBytes  BlockMetadataType   ByteOffset     SizeBytes
	rec := 0
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) != 5 || f[0] == "Record#" || strings.HasPrefix(f[0], "-") {
			continue
		}
		var n int
		var capacity, off, size int64
		if _, err := fmt.Sscan(strings.Join([]string{f[0], f[1], f[3], f[4]}, " "), &n, &capacity, &off, &size); err != nil {
			t.Fatalf("lister table line %q: %v", line, err)
		}
		if f[2] != "VARIABLE_LENGTH" {
			t.Errorf("lister table line %q: type %s", line, f[2])
		}
		if n != rec {
			pages = append(pages, k8sRecord{capacity: capacity})
			rec = n
		}
		pages[len(pages)-1].tuples = append(pages[len(pages)-1].tuples, harness.Span{Offset: off, Length: size})
	}
	if len(pages) == 0 && s != "" {
		t.Fatalf("lister printed no tuples:\n%s", out)
	}
	return pages
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

// ----------------------------------------------------------------- hold --

// hold (e2e/k8s/k8s.sh up) writes dir/env and waits while dir/hold exists,
// at most 2 h, so that one can run the lister by hand.
func (k *k8sEnv) hold(t *testing.T) {
	backup := k.saKubeconfig(t, k8sBackupSA)
	env := fmt.Sprintf(`# e2e/k8s/k8s.sh down ends it
export RSM_K8S_BIN=%s
export KUBECONFIG=%s
export BACKUP_KUBECONFIG=%s
export ESM_NAMESPACE=%s ESM_GRPC=127.0.0.1:%d ESM_HEALTH=127.0.0.1:%d
# VolumeSnapshots snap-a1, snap-a2 (rsm-e2e), snap-b1, snap-b2 (rsm-e2e-ns1)
# logs: %s/logs
# $RSM_K8S_BIN/snapshot-metadata-lister -kubeconfig $BACKUP_KUBECONFIG -service-account %s -service-account-namespace %s -n %s -s snap-a2 -p snap-a1
`, k.bin, k.kubeconfig(t, "admin", ""), backup, k8sNS, k.ports.grpc, k.ports.health, k.dir, k8sBackupSA, k8sNS, k8sNS)
	writeFile(t, filepath.Join(k.dir, "env.tmp"), env)
	if err := os.Rename(filepath.Join(k.dir, "env.tmp"), filepath.Join(k.dir, "env")); err != nil {
		t.Fatal(err)
	}
	t.Logf("holding until %s/hold is removed (e2e/k8s/k8s.sh down)", k.dir)
	for t0 := time.Now(); time.Since(t0) < 2*time.Hour; time.Sleep(time.Second) {
		if _, err := os.Stat(filepath.Join(k.dir, "hold")); err != nil {
			return
		}
	}
}
