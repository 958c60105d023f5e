//go:build e2e

package e2e

// TestK8sDeploy applies every example of deploy/ to the real kube-apiserver
// with the real kubectl (both v1.34.2, from e2e/k8s/k8s.sh), the way
// deploy/README.md tells an operator to: the upstream CRDs first, then what
// the example goes next to (Ceph-CSI v3.13.1's real provisioner manifest,
// read from ../shared/reference/upstream; for Rook and ceph-csi-operator the
// ConfigMap and CSIDriver they write, with their real names), then the
// example, with server-side apply. It reads everything back and checks that
// every upstream container, argument and volume is still there, plus ours;
// that a Ceph-CSI upgrade done with `kubectl apply -f` (or server-side apply)
// keeps our containers, and what `kubectl replace` does; that our install
// steps run twice change nothing; and that installs in two namespaces keep
// each other's RBAC. Nothing here needs Ceph; no pod runs (there is no
// kubelet).

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

// Ceph-CSI v3.13.1's deploy/rbd/kubernetes/csi-rbdplugin-provisioner.yaml:
// reference data next to the repository, never copied into it.
const upstreamProvisioner = "../../shared/reference/upstream/ceph-csi-v3.13.1/csi-rbdplugin-provisioner.yaml"

type kpod struct {
	Metadata struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		ServiceAccountName string       `json:"serviceAccountName"`
		Containers         []kcontainer `json:"containers"`
		Volumes            []struct {
			Name      string `json:"name"`
			ConfigMap *struct {
				Name  string `json:"name"`
				Items []struct{ Key, Path string }
			} `json:"configMap"`
		} `json:"volumes"`
	} `json:"spec"`
}

type kcontainer struct {
	Name  string   `json:"name"`
	Image string   `json:"image"`
	Args  []string `json:"args"`
	Env   []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
}

type kdeploy struct {
	Metadata struct {
		ResourceVersion string            `json:"resourceVersion"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Template kpod `json:"template"`
	} `json:"spec"`
}

func (p *kpod) names() []string {
	var n []string
	for _, c := range p.Spec.Containers {
		n = append(n, c.Name)
	}
	return n
}

func (p *kpod) volumeNames() []string {
	var n []string
	for _, v := range p.Spec.Volumes {
		n = append(n, v.Name)
	}
	return n
}

func deployment(t *testing.T, k *kube.Env, ns, name string) *kdeploy {
	t.Helper()
	var d kdeploy
	k.GetJSON(t, &d, "-n", ns, "deployment", name)
	return &d
}

// deployTree copies deploy/ into a temporary folder, as the operator's
// checkout, and makes each example's certificates (gen-certs.sh).
func deployTree(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "deploy")
	if err := os.CopyFS(root, os.DirFS("../deploy")); err != nil {
		t.Fatal(err)
	}
	return root
}

func genCerts(t *testing.T, root, example, ns string) {
	t.Helper()
	dir := filepath.Join(root, "examples", example, "certs")
	_ = os.RemoveAll(dir)
	if out, err := exec.Command(filepath.Join(root, "gen-certs.sh"), "-n", ns, dir).CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, out)
	}
}

// upstreamYAML is Ceph-CSI's provisioner manifest with its namespace set,
// as its README asks ("replace with non-default namespace name").
func upstreamYAML(t *testing.T, dir, ns, image string) string {
	t.Helper()
	b, err := os.ReadFile(upstreamProvisioner)
	if err != nil {
		t.Skipf("Ceph-CSI's reference manifest is not there (%v): skipping the deploy test against it; "+
			"it reads shared/reference/upstream/ next to the repository", err)
	}
	s := strings.ReplaceAll(string(b), "namespace: default", "namespace: "+ns)
	if image != "" {
		s = strings.ReplaceAll(s, "quay.io/cephcsi/cephcsi:v3.13.1", image)
	}
	path := filepath.Join(dir, ns+"-"+strings.NewReplacer("/", "_", ":", "_").Replace(image)+".yaml")
	kube.WriteFile(t, path, s)
	return path
}

// cephCSIPrereqs: what Ceph-CSI's other manifests create and the provisioner
// refers to (namespace, service account, ConfigMaps).
func cephCSIPrereqs(t *testing.T, k *kube.Env, ns string) {
	t.Helper()
	k.Kubectl(t, "create", "namespace", ns)
	k.Kubectl(t, "-n", ns, "create", "serviceaccount", "rbd-csi-provisioner")
	k.Kubectl(t, "-n", ns, "create", "configmap", "ceph-csi-config", `--from-literal=config.json=[{"clusterID":"c1","monitors":["192.0.2.1:6789"]}]`)
	k.Kubectl(t, "-n", ns, "create", "configmap", "ceph-config", "--from-literal=ceph.conf=[global]")
	k.Kubectl(t, "-n", ns, "create", "configmap", "ceph-csi-encryption-kms-config", "--from-literal=config.json={}")
}

// checkInPod: every container of upstream's pod, with its image and
// arguments, every volume, and ours.
func checkInPod(t *testing.T, got *kdeploy, upstream *kpod, image string) {
	t.Helper()
	pod := &got.Spec.Template
	for _, c := range upstream.Spec.Containers {
		i := slices.IndexFunc(pod.Spec.Containers, func(g kcontainer) bool { return g.Name == c.Name })
		if i < 0 {
			t.Errorf("Ceph-CSI's container %s is gone", c.Name)
			continue
		}
		g := pod.Spec.Containers[i]
		want := c.Image
		if image != "" && strings.HasPrefix(want, "quay.io/cephcsi/cephcsi:") {
			want = image
		}
		if g.Image != want || !slices.Equal(g.Args, c.Args) || len(g.Env) != len(c.Env) {
			t.Errorf("Ceph-CSI's container %s changed: image %s (want %s), args %q (want %q)", c.Name, g.Image, want, g.Args, c.Args)
		}
	}
	for _, v := range upstream.Spec.Volumes {
		if !slices.Contains(pod.volumeNames(), v.Name) {
			t.Errorf("Ceph-CSI's volume %s is gone", v.Name)
		}
	}
	for _, n := range []string{"rbd-snapshot-metadata", "csi-snapshot-metadata"} {
		if !slices.Contains(pod.names(), n) {
			t.Errorf("our container %s is missing: %v", n, pod.names())
		}
	}
	for _, n := range []string{"snapshot-metadata-socket", "snapshot-metadata-tls"} {
		if !slices.Contains(pod.volumeNames(), n) {
			t.Errorf("our volume %s is missing", n)
		}
	}
	if want := len(upstream.Spec.Containers) + 2; len(pod.Spec.Containers) != want {
		t.Errorf("%d containers, want Ceph-CSI's %d and our 2: %v", len(pod.Spec.Containers), len(upstream.Spec.Containers), pod.names())
	}
	if dc := pod.Metadata.Annotations["kubectl.kubernetes.io/default-container"]; dc != "csi-rbdplugin" {
		t.Errorf("default container %q, want csi-rbdplugin", dc)
	}
}

// parsePod is the pod template of the manifest's Deployment, decoded by
// kubectl itself (client-side dry run).
func parsePod(t *testing.T, k *kube.Env, path string) *kpod {
	t.Helper()
	out, err := k.KubectlErr(t, "create", "--dry-run=client", "-o", "json", "-f", path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	// One JSON object per document, one after the other.
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var it json.RawMessage
		if err := dec.Decode(&it); err != nil {
			t.Fatal(err)
		}
		var tm struct{ Kind string }
		_ = json.Unmarshal(it, &tm)
		if tm.Kind != "Deployment" {
			continue
		}
		var d kdeploy
		if err := json.Unmarshal(it, &d); err != nil {
			t.Fatal(err)
		}
		return &d.Spec.Template
	}
	t.Fatalf("%s: no Deployment", path)
	return nil
}

func TestK8sDeploy(t *testing.T) {
	t0 := time.Now()
	d := &deployRun{k: kube.StartControlPlane(t), root: deployTree(t), tmp: t.TempDir()}
	const ns = "ceph-csi-rbd"

	// ---- Ceph-CSI from its manifests, our containers in its provisioner pod.
	t.Run("ceph-csi", func(t *testing.T) { d.cephCSI(t, ns) })

	// ---- The same with Ceph-CSI applied server-side, cert-manager issuing
	// the certificate (its CRDs stand in for cert-manager).
	t.Run("cert-manager", d.certManager)

	// ---- Standalone Deployments next to Rook and ceph-csi-operator. They
	// patch nothing upstream; they read the ConfigMap those write.
	for _, c := range []standaloneExample{
		// Rook >= v1.18 runs ceph-csi-operator, which writes
		// ceph-csi-config; Rook's own rook-ceph-csi-config is left as [].
		{"rook", "rook-ceph", "rook-ceph.rbd.csi.ceph.com", "ceph-csi-config", "config.json"},
		{"ceph-csi-operator", "ceph-csi-operator-system", "rbd.csi.ceph.com", "ceph-csi-config", "config.json"},
	} {
		t.Run(c.example, func(t *testing.T) { d.standalone(t, c) })
	}

	// ---- Installs in several namespaces keep each other's RBAC (the
	// sidecar's TokenReviews and SubjectAccessReviews).
	t.Run("rbac", func(t *testing.T) { d.rbac(t, ns) })
	t.Logf("deploy test: %.1fs", time.Since(t0).Seconds())
}

// deployRun is TestK8sDeploy's API server, its copy of deploy/ and a
// folder for manifests, which its steps share.
type deployRun struct {
	k         *kube.Env
	root, tmp string
}

// ssa is our install's kubectl apply, as deploy/README.md says.
var ssa = []string{"apply", "--server-side", "--field-manager=rbd-snapshot-metadata"}

// patch is deploy/README.md's patch of Ceph-CSI's provisioner Deployment
// in ns.
func (d *deployRun) patch(t *testing.T, ns string) {
	t.Helper()
	patch := filepath.Join(d.tmp, "provisioner-patch.yaml")
	kube.WriteFile(t, patch, d.k.Kubectl(t, "kustomize", filepath.Join(d.root, "examples/ceph-csi/provisioner")))
	d.k.Kubectl(t, "-n", ns, "patch", "deployment", "csi-rbdplugin-provisioner", "--patch-file="+patch)
}

// cephCSI: Ceph-CSI from its manifests in ns, our containers patched into
// its provisioner pod; our install again, and Ceph-CSI's upgrades.
func (d *deployRun) cephCSI(t *testing.T, ns string) {
	k := d.k
	up := upstreamYAML(t, d.tmp, ns, "")
	upstream := parsePod(t, k, up)
	cephCSIPrereqs(t, k, ns)
	// Ceph-CSI's install (its docs: kubectl create -f; apply -f as an
	// upgrade does, which records last-applied-configuration).
	k.Kubectl(t, "apply", "-f", up)
	genCerts(t, d.root, "ceph-csi", ns)
	example := filepath.Join(d.root, "examples/ceph-csi")
	// Our install, as deploy/README.md says.
	k.Kubectl(t, append(ssa, "-k", example)...)
	d.patch(t, ns)
	got := deployment(t, k, ns, "csi-rbdplugin-provisioner")
	checkInPod(t, got, upstream, "")
	t.Logf("containers after our patch: %v", got.Spec.Template.names())

	// The CR as the API server keeps it: caCert is the CA, one line.
	var sms struct {
		Spec struct{ Address, CACert, Audience string }
	}
	k.GetJSON(t, &sms, "snapshotmetadataservice", "rbd.csi.ceph.com")
	ca, _ := os.ReadFile(filepath.Join(example, "certs/ca.crt"))
	if sms.Spec.CACert != base64.StdEncoding.EncodeToString(ca) || sms.Spec.Address != "csi-rbdplugin-snapshot-metadata."+ns+":6443" {
		t.Errorf("SnapshotMetadataService: %+v", sms.Spec)
	}

	// Our steps a second time: accepted, nothing changes.
	objs := []string{"-n", ns, "deployment,service,secret,configmap,snapshotmetadataservice,clusterrole,clusterrolebinding"}
	before := k.ResourceVersions(t, objs...)
	k.Kubectl(t, append(ssa, "-k", example)...)
	d.patch(t, ns)
	if after := k.ResourceVersions(t, objs...); !mapsEqual(before, after) {
		t.Errorf("running our install again changed objects:\nbefore %v\nafter  %v", before, after)
	}
	d.cephCSIUpgrade(t, ns, upstream)
}

// cephCSIUpgrade: a Ceph-CSI upgrade the usual way, kubectl apply -f of the
// new provisioner manifest over the patched Deployment, keeps our
// containers; kubectl replace drops them, and our patch puts them back.
func (d *deployRun) cephCSIUpgrade(t *testing.T, ns string, upstream *kpod) {
	k := d.k
	newImage := "quay.io/cephcsi/cephcsi:v3.14.0"
	k.Kubectl(t, "apply", "-f", upstreamYAML(t, d.tmp, ns, newImage))
	got := deployment(t, k, ns, "csi-rbdplugin-provisioner")
	t.Logf("after kubectl apply -f of the upgraded manifest: %v", got.Spec.Template.names())
	checkInPod(t, got, upstream, newImage)

	// kubectl replace (or delete and create) drops our containers; the
	// README's one step puts them back.
	k.Kubectl(t, "replace", "-f", upstreamYAML(t, d.tmp, ns, newImage))
	got = deployment(t, k, ns, "csi-rbdplugin-provisioner")
	t.Logf("after kubectl replace -f: %v", got.Spec.Template.names())
	if slices.Contains(got.Spec.Template.names(), "rbd-snapshot-metadata") {
		t.Errorf("kubectl replace kept our container: the README's warning is wrong")
	}
	d.patch(t, ns)
	checkInPod(t, deployment(t, k, ns, "csi-rbdplugin-provisioner"), upstream, newImage)
}

// certManager: Ceph-CSI applied server-side, examples/cert-manager in its
// namespace, and Ceph-CSI's upgrade, server-side too.
func (d *deployRun) certManager(t *testing.T) {
	k := d.k
	const ns = "ceph-csi-ssa"
	up := upstreamYAML(t, d.tmp, ns, "")
	upstream := parsePod(t, k, up)
	cephCSIPrereqs(t, k, ns)
	k.Kubectl(t, "apply", "--server-side", "-f", up)
	certManagerCRDs(t, k)
	example := filepath.Join(d.root, "examples/cert-manager")
	setNamespace(t, example, ns)
	genCerts(t, d.root, "cert-manager", ns)
	k.Kubectl(t, append(ssa, "-k", example)...)
	d.patch(t, ns)
	checkInPod(t, deployment(t, k, ns, "csi-rbdplugin-provisioner"), upstream, "")
	newImage := "quay.io/cephcsi/cephcsi:v3.14.0"
	k.Kubectl(t, "apply", "--server-side", "-f", upstreamYAML(t, d.tmp, ns, newImage))
	got := deployment(t, k, ns, "csi-rbdplugin-provisioner")
	t.Logf("after kubectl apply --server-side -f of the upgraded manifest: %v", got.Spec.Template.names())
	checkInPod(t, got, upstream, newImage)
	var cert struct {
		Spec struct{ DNSNames []string }
	}
	k.GetJSON(t, &cert, "-n", ns, "certificate", "csi-rbdplugin-snapshot-metadata")
	if !slices.Contains(cert.Spec.DNSNames, "csi-rbdplugin-snapshot-metadata."+ns) {
		t.Errorf("Certificate dnsNames %v", cert.Spec.DNSNames)
	}
	// One SnapshotMetadataService per driver: this install's CR took
	// over the ceph-csi one's (same name); delete it to leave the
	// driver's name free for the next installs.
	k.Kubectl(t, "delete", "-k", example)
}

// standaloneExample is an example of deploy/ with a Deployment of its own,
// and what the installer it goes next to writes: the namespace, the CSI
// driver's name, and the ConfigMap (and its key) with the cluster config.
type standaloneExample struct {
	example, ns, driver, configMap, key string
}

// standalone installs example c next to what its installer writes, checks
// the Deployment and the config it reads, and runs the install again.
func (d *deployRun) standalone(t *testing.T, c standaloneExample) {
	k := d.k
	k.Kubectl(t, "create", "namespace", c.ns)
	k.Kubectl(t, "-n", c.ns, "create", "configmap", c.configMap, "--from-literal="+c.key+`=[{"clusterID":"c1","monitors":["192.0.2.1:6789"]}]`)
	if c.example == "rook" {
		k.Kubectl(t, "-n", c.ns, "create", "configmap", "rook-ceph-csi-config", "--from-literal=csi-cluster-config-json=[]")
	}
	kube.WriteFile(t, filepath.Join(d.tmp, c.example+"-csidriver.yaml"), "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: "+c.driver+"}\nspec: {attachRequired: true, podInfoOnMount: false}\n")
	k.Kubectl(t, "apply", "-f", filepath.Join(d.tmp, c.example+"-csidriver.yaml"))
	example := filepath.Join(d.root, "examples", c.example)
	genCerts(t, d.root, c.example, c.ns)
	k.Kubectl(t, append(ssa, "-k", example)...)
	got := deployment(t, k, c.ns, "rbd-snapshot-metadata")
	pod := &got.Spec.Template
	if !slices.Equal(pod.names(), []string{"rbd-snapshot-metadata", "csi-snapshot-metadata"}) {
		t.Errorf("containers %v", pod.names())
	}
	if dc := pod.Metadata.Annotations["kubectl.kubernetes.io/default-container"]; dc != "rbd-snapshot-metadata" {
		t.Errorf("default container %q", dc)
	}
	for _, ctr := range pod.Spec.Containers {
		for _, e := range ctr.Env {
			if e.Name == "DRIVER_NAME" && e.Value != c.driver {
				t.Errorf("DRIVER_NAME %s, want %s", e.Value, c.driver)
			}
		}
	}
	k.Kubectl(t, "get", "csidriver", c.driver)
	k.Kubectl(t, "get", "snapshotmetadataservice", c.driver)
	checkConfigRead(t, k, c.ns, pod)
	objs := []string{"-n", c.ns, "deployment,service,secret,configmap,serviceaccount,snapshotmetadataservice,clusterrole,clusterrolebinding"}
	before := k.ResourceVersions(t, objs...)
	k.Kubectl(t, append(ssa, "-k", example)...)
	if after := k.ResourceVersions(t, objs...); !mapsEqual(before, after) {
		t.Errorf("running our install again changed objects:\nbefore %v\nafter  %v", before, after)
	}
}

// checkConfigRead: the config our server reads is the one the installer
// fills, a cluster and not an empty list.
func checkConfigRead(t *testing.T, k *kube.Env, ns string, pod *kpod) {
	t.Helper()
	for _, v := range pod.Spec.Volumes {
		if v.Name != "ceph-csi-config" {
			continue
		}
		var cm struct{ Data map[string]string }
		k.GetJSON(t, &cm, "-n", ns, "configmap", v.ConfigMap.Name)
		key := "config.json"
		for _, it := range v.ConfigMap.Items {
			if it.Path == "config.json" {
				key = it.Key
			}
		}
		if d := strings.TrimSpace(cm.Data[key]); d == "" || d == "[]" {
			t.Errorf("the server would read ConfigMap %s key %s: %q, no cluster", v.ConfigMap.Name, key, d)
		}
	}
}

// rbac: each install's sidecar may do what it needs (the ceph-csi one in
// ns, the standalone ones in theirs), and no more.
func (d *deployRun) rbac(t *testing.T, ns string) {
	k := d.k
	for _, sa := range [][2]string{{ns, "rbd-csi-provisioner"}, {"rook-ceph", "rbd-snapshot-metadata"}, {"ceph-csi-operator-system", "rbd-snapshot-metadata"}} {
		for _, r := range [][3]string{
			{"create", "authentication.k8s.io", "tokenreviews"},
			{"create", "authorization.k8s.io", "subjectaccessreviews"},
			{"get", "", "secrets"},
			{"list", "cbt.storage.k8s.io", "snapshotmetadataservices"},
		} {
			// The RBAC authorizer sees new bindings through an
			// informer: on a loaded machine, ask again for a while.
			ok := k.Allowed(t, sa[0], sa[1], r[0], r[1], r[2])
			for t0 := time.Now(); !ok && time.Since(t0) < 30*time.Second; {
				time.Sleep(time.Second)
				ok = k.Allowed(t, sa[0], sa[1], r[0], r[1], r[2])
			}
			if !ok {
				t.Errorf("%s/%s may not %s %s.%s", sa[0], sa[1], r[0], r[2], r[1])
			}
		}
		// and nothing more than it needs.
		if k.Allowed(t, sa[0], sa[1], "delete", "", "secrets") {
			t.Errorf("%s/%s may delete secrets", sa[0], sa[1])
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// setNamespace points an example at another namespace, as an operator edits
// its kustomization.yaml.
func setNamespace(t *testing.T, example, ns string) {
	t.Helper()
	p := filepath.Join(example, "kustomization.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "\nnamespace: ceph-csi-rbd\n", "\nnamespace: "+ns+"\n", 1)
	kube.WriteFile(t, p, s)
}

// certManagerCRDs: Issuer and Certificate (cert-manager.io/v1) with open
// schemas, so that the cert-manager example applies; cert-manager itself
// is not run here.
func certManagerCRDs(t *testing.T, k *kube.Env) {
	t.Helper()
	var docs []string
	for _, kind := range []string{"Issuer", "Certificate"} {
		plural := strings.ToLower(kind) + "s"
		docs = append(docs, `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: `+plural+`.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {kind: `+kind+`, plural: `+plural+`, singular: `+strings.ToLower(kind)+`}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`)
	}
	p := filepath.Join(k.Dir, "cert-manager-crds.yaml")
	kube.WriteFile(t, p, strings.Join(docs, "---\n"))
	k.Kubectl(t, "apply", "-f", p)
	k.Kubectl(t, "wait", "--for=condition=Established", "crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io", "--timeout=60s")
}
