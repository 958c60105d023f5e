//go:build e2e

package kube

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// Do sends one request as admin and returns the status code and body.
func (k *Env) Do(t *testing.T, method, path, ctype, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, k.API+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := k.HTTP.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// Must sends a request that must succeed and returns the answer's body.
func (k *Env) Must(t *testing.T, method, path, ctype, body string) []byte {
	t.Helper()
	code, resp := k.Do(t, method, path, ctype, body)
	if code < 200 || code > 299 {
		t.Fatalf("%s %s: HTTP %d: %s\nrequest:\n%s", method, path, code, resp, body)
	}
	return resp
}

// Create POSTs a YAML object to path.
func (k *Env) Create(t *testing.T, path, yaml string) {
	t.Helper()
	k.Must(t, "POST", path, "application/yaml", yaml)
}

// CreateFile POSTs the YAML object of file to path.
func (k *Env) CreateFile(t *testing.T, path, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	k.Create(t, path, string(b))
}

// PatchStatus merge-patches the status subresource: a POST drops status.
func (k *Env) PatchStatus(t *testing.T, path, js string) {
	t.Helper()
	k.Must(t, "PATCH", path+"/status", "application/merge-patch+json", js)
}

const rbacAPI = "/apis/rbac.authorization.k8s.io/v1"

// objects makes what Start promises beyond the control plane.
func (k *Env) objects(t *testing.T) {
	t.Helper()
	k.Create(t, "/api/v1/namespaces", "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+NS+"}\n")
	k.Create(t, "/api/v1/namespaces/"+NS+"/secrets", fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: %s, namespace: %s}
stringData: {userID: %q, userKey: %q}
`, Secret, NS, harness.ClusterEnv(t, "CEPH_CSI_USER"), harness.ClusterEnv(t, "CEPH_CSI_KEY")))
	k.Create(t, "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses", SnapshotClass(Class, Driver))
	// Cluster-scoped and named after the driver; the address must match
	// the sidecar certificate's SAN; caCert is base64 of the PEM CA.
	ca, err := os.ReadFile(k.PKI.Path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	k.Create(t, "/apis/cbt.storage.k8s.io/v1beta1/snapshotmetadataservices", fmt.Sprintf(`apiVersion: cbt.storage.k8s.io/v1beta1
kind: SnapshotMetadataService
metadata: {name: %s}
spec:
  address: 127.0.0.1:%d
  caCert: %s
  audience: %s
`, Driver, k.Ports.GRPC, base64.StdEncoding.EncodeToString(ca), Audience))
	for _, sa := range []string{SidecarSA, BackupSA, NoRoleSA} {
		k.Create(t, "/api/v1/namespaces/"+NS+"/serviceaccounts",
			"apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: "+sa+", namespace: "+NS+"}\n")
	}
	// The backup application: upstream's
	// deploy/snapshot-metadata-client-cluster-role.yaml, as is.
	k.Create(t, rbacAPI+"/clusterroles", `apiVersion: rbac.authorization.k8s.io/v1
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
	k.Create(t, rbacAPI+"/clusterroles", `apiVersion: rbac.authorization.k8s.io/v1
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
	for role, sa := range map[string]string{"external-snapshot-metadata-client-runner": BackupSA, "external-snapshot-metadata-runner": SidecarSA} {
		k.Create(t, rbacAPI+"/clusterrolebindings", fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: %s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %s}
subjects: [{kind: ServiceAccount, name: %s, namespace: %s}]
`, sa, role, sa, NS))
	}
}

// SnapshotClass is a VolumeSnapshotClass of driver whose snapshotter
// secret is the Ceph-CSI-like user's (Secret in NS).
func SnapshotClass(name, driver string) string {
	return fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: %s}
driver: %s
deletionPolicy: Retain
parameters:
  clusterID: %s
  csi.storage.k8s.io/snapshotter-secret-name: %s
  csi.storage.k8s.io/snapshotter-secret-namespace: %s
`, name, driver, harness.ClusterID, Secret, NS)
}

// VolumeSnapshot creates a bound, ready VolumeSnapshot and its
// VolumeSnapshotContent with the CSI snapshot handle, as the snapshot
// controller and the CSI snapshotter would.
func (k *Env) VolumeSnapshot(t *testing.T, name, handle string, size int64) {
	t.Helper()
	k.VolumeSnapshotOf(t, Driver, Class, name, handle, size)
}

// VolumeSnapshotOf is VolumeSnapshot for another driver and its class.
func (k *Env) VolumeSnapshotOf(t *testing.T, driver, class, name, handle string, size int64) {
	t.Helper()
	const ss = "/apis/snapshot.storage.k8s.io/v1"
	vsc := "snapcontent-" + name
	k.Create(t, ss+"/volumesnapshotcontents", fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: %s}
spec:
  driver: %s
  deletionPolicy: Retain
  volumeSnapshotClassName: %s
  source: {snapshotHandle: %q}
  volumeSnapshotRef: {name: %s, namespace: %s}
`, vsc, driver, class, handle, name, NS))
	k.PatchStatus(t, ss+"/volumesnapshotcontents/"+vsc, fmt.Sprintf(
		`{"status":{"snapshotHandle":%q,"readyToUse":true,"restoreSize":%d,"creationTime":%d}}`, handle, size, time.Now().UnixNano()))
	// Without a class (or a default one), the sidecar finds no secret.
	k.Create(t, ss+"/namespaces/"+NS+"/volumesnapshots", fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec:
  volumeSnapshotClassName: %s
  source: {volumeSnapshotContentName: %s}
`, name, NS, class, vsc))
	k.PatchStatus(t, ss+"/namespaces/"+NS+"/volumesnapshots/"+name, fmt.Sprintf(
		`{"status":{"boundVolumeSnapshotContentName":%q,"readyToUse":true,"restoreSize":"%d"}}`, vsc, size))
}

// Kubeconfig writes dir/<name>.kubeconfig: as admin (token empty) or with
// a token file.
func (k *Env) Kubeconfig(t *testing.T, name, token string) string {
	t.Helper()
	user := fmt.Sprintf("{client-certificate: %q, client-key: %q}", k.PKI.Path("admin.crt"), k.PKI.Path("admin.key"))
	if token != "" {
		tf := filepath.Join(k.Dir, name+".token")
		WriteFile(t, tf, token)
		user = fmt.Sprintf("{tokenFile: %q}", tf)
	}
	path := filepath.Join(k.Dir, name+".kubeconfig")
	WriteFile(t, path, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: %s}]
contexts: [{name: e2e, context: {cluster: e2e, user: u, namespace: %s}}]
current-context: e2e
`, k.API, k.PKI.Path("ca.crt"), user, NS))
	return path
}

// SAKubeconfig is a kubeconfig with a 24 h token of the ServiceAccount.
func (k *Env) SAKubeconfig(t *testing.T, sa string) string {
	t.Helper()
	return k.Kubeconfig(t, sa, k.token(t, NS, sa))
}

// token is a 24 h token of ns/sa (a TokenRequest).
func (k *Env) token(t *testing.T, ns, sa string) string {
	t.Helper()
	body := k.Must(t, "POST", "/api/v1/namespaces/"+ns+"/serviceaccounts/"+sa+"/token", "application/json",
		`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":86400}}`)
	var tr struct{ Status struct{ Token string } }
	if err := json.Unmarshal(body, &tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("TokenRequest for %s/%s: %v: %s", ns, sa, err, body)
	}
	return tr.Status.Token
}

// AdminKubeconfig is dir/admin.kubeconfig, written on first use.
func (k *Env) AdminKubeconfig(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(k.Dir, "admin.kubeconfig")
	if _, err := os.Stat(cfg); err != nil {
		k.Kubeconfig(t, "admin", "")
	}
	return cfg
}

// TokenKubeconfig is a kubeconfig with a 24 h token of ns/sa.
func (k *Env) TokenKubeconfig(t *testing.T, ns, sa string) string {
	t.Helper()
	return k.Kubeconfig(t, ns+"-"+sa, k.token(t, ns, sa))
}
