//go:build e2e

package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// The names TestK8sSidecar's objects have (Start makes them); the pods'
// tests use the same.
const (
	Driver    = "rbd.csi.ceph.com" // = the SMS CR's name = the class's driver
	NS        = "backup-e2e"
	Audience  = "rsm-e2e-sidecar"
	Class     = "csi-rbd-snapclass"
	Secret    = "csi-rbd-snapshotter"
	SidecarSA = "csi-snapshot-metadata"
	BackupSA  = "backup-app"
	NoRoleSA  = "intruder"
)

// Env is a running control plane (or the pods' node, Attach) and an admin
// client of its API server.
type Env struct {
	Bin   string // the folder of the binaries (RSM_K8S_BIN)
	Dir   string // the test's folder: logs/, pids/, pki/, kubeconfigs
	Ports Ports
	API   string       // https://host:port of kube-apiserver
	HTTP  *http.Client // as admin (system:masters)
	PKI   *PKI
}

// Ports are the control plane's ports and the sidecar's.
type Ports struct{ Etcd, EtcdPeer, API, GRPC, Health int }

// ------------------------------------------------------------ binaries --

// Bin is the folder of e2e/k8s/k8s.sh build's binaries (RSM_K8S_BIN); it
// fails the test if it is not there.
func Bin(t *testing.T) string {
	t.Helper()
	return BuildDir(t, "RSM_K8S", "build", "etcd", "kube-apiserver", "kubectl", "csi-snapshot-metadata", "snapshot-metadata-lister", "crds")
}

// BuildDir is the folder that e2e/k8s/k8s.sh cmd filled, which run-e2e.sh
// passes in <env>_BIN (or why the build failed, in <env>_BUILD_ERROR),
// with the files given in it; else it fails the test, saying why.
func BuildDir(t *testing.T, env, cmd string, files ...string) string {
	t.Helper()
	dir := os.Getenv(env + "_BIN")
	if msg := os.Getenv(env + "_BUILD_ERROR"); dir == "" && msg != "" {
		t.Fatal(msg)
	}
	if dir == "" {
		t.Fatalf("%s_BIN is not set: run e2e/run-e2e.sh (./dev.sh e2e), or export %[1]s_BIN=$(e2e/k8s/k8s.sh %s) and add it to RSM_BIND", env, cmd)
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%v: e2e/k8s/k8s.sh %s failed or its folder is not bound into the rootfs (see run-e2e.sh's output)", err, cmd)
		}
	}
	return dir
}

// ---------------------------------------------------------------- ports --

// portsFor picks five ports from base: etcd client and peer, API server,
// sidecar gRPC (which listens on all interfaces) and sidecar health. With
// RSM_K8S_PORT_BASE set, those or nothing; else the first free block of
// 23790, 23800, ..., 23890 (Ceph's clusters use 16500..17499).
func portsFor(t *testing.T) Ports {
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
		return Ports{Etcd: b, EtcdPeer: b + 1, API: b + 2, GRPC: b + 3, Health: b + 4}
	}
	t.Fatalf("no free block of 5 ports among %v (set RSM_K8S_PORT_BASE)", bases)
	return Ports{}
}

// busyPorts are those of base..base+n-1 that cannot be listened on.
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

// ------------------------------------------------------ control plane --

// Start starts etcd and kube-apiserver and creates what the sidecar and
// the backup application need: the CRDs, a namespace, the snapshotter
// secret (the Ceph-CSI-like user, not admin), a VolumeSnapshotClass, the
// SnapshotMetadataService CR, the ServiceAccounts and their RBAC.
func Start(t *testing.T) *Env {
	t.Helper()
	k := StartControlPlane(t)
	t0 := time.Now()
	k.objects(t)
	t.Logf("objects created in %.1fs", time.Since(t0).Seconds())
	return k
}

// StartControlPlane starts etcd and kube-apiserver and installs the CRDs
// (VolumeSnapshot* and SnapshotMetadataService).
func StartControlPlane(t *testing.T) *Env {
	t.Helper()
	k := &Env{Bin: Bin(t), Dir: os.Getenv("RSM_K8S_HOLD")}
	if k.Dir == "" {
		k.Dir = t.TempDir()
	}
	for _, d := range []string{"logs", "pids", "pki"} {
		if err := os.MkdirAll(filepath.Join(k.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	k.Ports = portsFor(t)
	k.API = fmt.Sprintf("https://127.0.0.1:%d", k.Ports.API)
	t.Logf("ports: etcd %d/%d, kube-apiserver %d, sidecar gRPC %d (all interfaces), health %d; folder %s",
		k.Ports.Etcd, k.Ports.EtcdPeer, k.Ports.API, k.Ports.GRPC, k.Ports.Health, k.Dir)
	k.makePKI(t)
	etcd := k.startEtcd(t)
	k.startAPIServer(t, etcd)
	k.installCRDs(t)
	return k
}

// makePKI makes the CA, the certificates of kube-apiserver, the sidecar
// and admin (the client k.HTTP uses), and the ServiceAccount token key.
func (k *Env) makePKI(t *testing.T) {
	t.Helper()
	pki := newPKI(t, filepath.Join(k.Dir, "pki"))
	pki.issue(t, "apiserver", pkix.Name{CommonName: "kube-apiserver"}, false)
	pki.issue(t, "sidecar", pkix.Name{CommonName: "csi-snapshot-metadata"}, false)
	pki.issue(t, "admin", pkix.Name{CommonName: "rsm-e2e-admin", Organization: []string{"system:masters"}}, true)
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, pki.Path("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa))
	pub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	writePEM(t, pki.Path("sa.pub"), "PUBLIC KEY", pub)
	k.PKI = pki

	admin, err := tls.LoadX509KeyPair(pki.Path("admin.crt"), pki.Path("admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(pki.CA)
	k.HTTP = adminClient(roots, admin)
}

// startEtcd starts etcd and returns its client URL once it is healthy.
func (k *Env) startEtcd(t *testing.T) string {
	t.Helper()
	etcd := fmt.Sprintf("http://127.0.0.1:%d", k.Ports.Etcd)
	peer := fmt.Sprintf("http://127.0.0.1:%d", k.Ports.EtcdPeer)
	k.StartProcess(t, "etcd", "etcd", "--name", "rsm-e2e", "--data-dir", filepath.Join(k.Dir, "etcd"),
		"--listen-client-urls", etcd, "--advertise-client-urls", etcd,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "rsm-e2e="+peer, "--listen-metrics-urls=", "--unsafe-no-fsync")
	plain := &http.Client{Timeout: 5 * time.Second}
	harness.WaitFor(t, "etcd", time.Minute, func() bool {
		r, err := plain.Get(etcd + "/health")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		return bytes.Contains(b, []byte(`"health":"true"`))
	})
	return etcd
}

// startAPIServer starts kube-apiserver on etcd, with RBAC, and waits until
// it is ready.
func (k *Env) startAPIServer(t *testing.T, etcd string) {
	t.Helper()
	pki := k.PKI
	k.StartProcess(t, "kube-apiserver", "kube-apiserver", "--etcd-servers="+etcd,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", k.Ports.API),
		// Else it advertises the default route's address, and fails to
		// start without one; 127.0.0.1 needs the reconciler off.
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--tls-cert-file="+pki.Path("apiserver.crt"), "--tls-private-key-file="+pki.Path("apiserver.key"),
		"--client-ca-file="+pki.Path("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki.Path("sa.pub"), "--service-account-signing-key-file="+pki.Path("sa.key"),
		"--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/24",
		// As on any cluster running Ceph-CSI: its nodeplugin DaemonSet is
		// privileged, and refused without it (e2e/k8s_operator_test.go).
		"--allow-privileged=true")
	harness.WaitFor(t, "kube-apiserver", 3*time.Minute, func() bool {
		code, body := k.Do(t, "GET", "/readyz", "", "")
		return code == 200 && string(body) == "ok"
	})
}

// installCRDs creates the CRDs of VolumeSnapshot* and
// SnapshotMetadataService and waits until they are established.
func (k *Env) installCRDs(t *testing.T) {
	t.Helper()
	t0 := time.Now()
	crds := []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"}
	for _, c := range crds {
		k.CreateFile(t, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
			filepath.Join(k.Bin, "crds", "snapshot.storage.k8s.io_"+c+".yaml"))
	}
	k.CreateFile(t, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
		filepath.Join(k.Bin, "crds", "cbt.storage.k8s.io_snapshotmetadataservices.yaml"))
	for _, c := range append([]string{"snapshotmetadataservices.cbt.storage.k8s.io"}, crdNames(crds)...) {
		harness.WaitFor(t, "CRD "+c, time.Minute, func() bool {
			code, body := k.Do(t, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+c, "", "")
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
}

func crdNames(plural []string) []string {
	var out []string
	for _, p := range plural {
		out = append(out, p+".snapshot.storage.k8s.io")
	}
	return out
}

// Attach is an admin client of an API server that runs already (the pods'
// node, e2e/k8s/node.sh), whose folder dir holds pki/ (ca.crt, admin.crt,
// admin.key) as StartControlPlane's does.
func Attach(t *testing.T, dir, api string) *Env {
	t.Helper()
	k := &Env{Bin: Bin(t), Dir: dir, API: api, PKI: &PKI{Dir: filepath.Join(dir, "pki")}}
	admin, err := tls.LoadX509KeyPair(k.PKI.Path("admin.crt"), k.PKI.Path("admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(k.PKI.Path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	k.HTTP = adminClient(roots, admin)
	return k
}

// adminClient speaks to the API server with the admin certificate.
func adminClient(roots *x509.CertPool, admin tls.Certificate) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{admin}}}}
}
