// Package deploy_test builds each example kustomization offline, the way the
// README tells users to (gen-certs.sh, then kustomize), decodes every object
// strictly into the Kubernetes API types, and checks that the pieces refer to
// each other correctly: socket, volumes, ports, service account, TLS and the
// SnapshotMetadataService CR. For the in-pod examples it applies the
// provisioner patch to Ceph-CSI's real provisioner Deployment (read from
// ../../shared/reference/upstream when it is there) with the strategic merge
// that `kubectl patch` uses, and checks that all of Ceph-CSI's pod is kept.
// e2e/k8s_deploy_test.go applies the same to a real API server with kubectl.
package deploy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	ourContainer     = "rbd-snapshot-metadata"
	sidecarContainer = "csi-snapshot-metadata"
	sidecarImage     = "registry.k8s.io/sig-storage/csi-snapshot-metadata:v1.1.0"
	serviceName      = "csi-rbdplugin-snapshot-metadata"
	metricsService   = "rbd-snapshot-metadata-metrics"
	metricsPort      = 9191
	defaultContainer = "kubectl.kubernetes.io/default-container"
	// Ceph-CSI v3.13.1's deploy/rbd/kubernetes/csi-rbdplugin-provisioner.yaml,
	// reference data next to the repository (never copied into it).
	upstreamProvisioner = "../../shared/reference/upstream/ceph-csi-v3.13.1/csi-rbdplugin-provisioner.yaml"
)

// The cluster-scoped RBAC names of an install in namespace ns.
func sidecarRole(ns string) string { return "rbd-snapshot-metadata:" + ns + ":sidecar" }
func clientRole(ns string) string  { return "rbd-snapshot-metadata:" + ns + ":client" }

// SnapshotMetadataService mirrors the CRD cbt.storage.k8s.io/v1beta1 of
// external-snapshot-metadata v1.1.0: unknown fields fail the strict decode.
type SnapshotMetadataService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Address string `json:"address"`
		// format: byte: strict base64, which the API server checks and Go's
		// decoders do not (they skip line breaks): kept as the string.
		CACert   string `json:"caCert"`
		Audience string `json:"audience"`
	} `json:"spec"`
}

// The parts of cert-manager.io/v1 that the cert-manager component uses.
type Issuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		CA *struct {
			SecretName string `json:"secretName"`
		} `json:"ca"`
	} `json:"spec"`
}

type Certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string   `json:"secretName"`
		DNSNames    []string `json:"dnsNames"`
		Duration    string   `json:"duration"`
		RenewBefore string   `json:"renewBefore"`
		IssuerRef   struct {
			Name string `json:"name"`
			Kind string `json:"kind"`
		} `json:"issuerRef"`
		PrivateKey struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		Usages []string `json:"usages"`
	} `json:"spec"`
}

// objects is one kustomize build, decoded.
type objects struct {
	deployments  []appsv1.Deployment
	services     []corev1.Service
	secrets      []corev1.Secret
	accounts     []corev1.ServiceAccount
	roles        []rbacv1.ClusterRole
	bindings     []rbacv1.ClusterRoleBinding
	sms          []SnapshotMetadataService
	issuers      []Issuer
	certificates []Certificate
	namespace    string
	// inPod: the example patches Ceph-CSI's provisioner, whose Deployment
	// (before the patch) is base.
	inPod bool
	base  *appsv1.Deployment
}

// The examples, and whether they go into Ceph-CSI's provisioner pod (by the
// patch that ceph-csi/provisioner builds) or run standalone.
var examples = map[string]bool{"ceph-csi": true, "cert-manager": true, "rook": false, "ceph-csi-operator": false}

func TestExamples(t *testing.T) {
	owner := map[string]string{} // cluster-scoped object -> namespace of the example that has it
	for _, example := range slices.Sorted(maps.Keys(examples)) {
		t.Run(example, func(t *testing.T) {
			objs := build(t, example)
			check(t, objs)
			if objs.inPod {
				checkKept(t, objs.base, objs.deployments[0])
			}
			// Two installs in different namespaces share no cluster-scoped
			// object: applying one must not take anything from the other.
			// (The CR is one per driver on purpose: see the README.)
			for _, name := range clusterScoped(objs) {
				if ns, ok := owner[name]; ok && ns != objs.namespace {
					t.Errorf("%s is also the install's in namespace %s", name, ns)
				}
				owner[name] = objs.namespace
			}
		})
	}
}

func clusterScoped(objs *objects) []string {
	var names []string
	for _, r := range objs.roles {
		names = append(names, "ClusterRole "+r.Name)
	}
	for _, b := range objs.bindings {
		names = append(names, "ClusterRoleBinding "+b.Name)
	}
	return names
}

// TestCACertIsOneLine: the CRD's `format: byte` takes strict base64 only.
// kustomize wraps a Secret's data at 70 columns, which the API server refuses
// in caCert ("spec.caCert in body must be of type byte").
func TestCACertIsOneLine(t *testing.T) {
	for example := range examples {
		objs := build(t, example)
		if len(objs.sms) != 1 {
			t.Fatalf("%s: %d SnapshotMetadataServices", example, len(objs.sms))
		}
		if _, err := base64.StdEncoding.Strict().DecodeString(objs.sms[0].Spec.CACert); err != nil || strings.ContainsAny(objs.sms[0].Spec.CACert, "\r\n ") {
			t.Errorf("%s: caCert is not one line of base64 (%v): %q", example, err, objs.sms[0].Spec.CACert)
		}
	}
}

// build copies deploy/ to a temporary folder, runs gen-certs.sh for the
// example's namespace into the example's certs/ (the README's first step),
// and builds the example with kustomize's library, on disk, offline.
func build(t *testing.T, example string) *objects {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"components", "examples", "standalone"} {
		if err := os.CopyFS(filepath.Join(root, d), os.DirFS(d)); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "examples", example)
	_ = os.RemoveAll(filepath.Join(dir, "certs")) // a developer's own
	k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kust struct {
		Namespace string `json:"namespace"`
	}
	if err := yaml.Unmarshal(k, &kust); err != nil || kust.Namespace == "" {
		t.Fatalf("%s: no namespace in kustomization.yaml (%v)", example, err)
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("gen-certs.sh needs openssl: apt-get install openssl")
	}
	out, err := exec.Command("./gen-certs.sh", "-n", kust.Namespace, filepath.Join(dir, "certs")).CombinedOutput()
	if err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, out)
	}
	objs := &objects{namespace: kust.Namespace, inPod: examples[example]}
	for _, r := range kustomize(t, dir) {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		decode(t, b, objs)
		if ns := r.GetNamespace(); ns != "" && ns != kust.Namespace {
			t.Errorf("%s %s in namespace %q, want %q", r.GetKind(), r.GetName(), ns, kust.Namespace)
		}
	}
	if !objs.inPod {
		return objs
	}
	// In the pod: the objects hold no Deployment; the provisioner patch goes
	// onto Ceph-CSI's, as `kubectl patch` (a strategic merge) does.
	if len(objs.deployments) != 0 {
		t.Fatalf("%s: the in-pod example builds a Deployment, which would replace Ceph-CSI's", example)
	}
	res := kustomize(t, filepath.Join(root, "examples", "ceph-csi", "provisioner"))
	if len(res) != 1 || res[0].GetKind() != "Deployment" || res[0].GetName() != "csi-rbdplugin-provisioner" {
		t.Fatalf("ceph-csi/provisioner: want one Deployment csi-rbdplugin-provisioner, got %d objects", len(res))
	}
	patch, err := res[0].MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	objs.base = upstreamDeployment(t)
	orig, err := json.Marshal(objs.base)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, appsv1.Deployment{})
	if err != nil {
		t.Fatalf("strategic merge of the provisioner patch: %v", err)
	}
	var dep appsv1.Deployment
	if err := json.Unmarshal(merged, &dep); err != nil {
		t.Fatal(err)
	}
	dep.Namespace = kust.Namespace
	objs.deployments = append(objs.deployments, dep)
	return objs
}

func kustomize(t *testing.T, dir string) []*resource.Resource {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return m.Resources()
}

// upstreamDeployment is Ceph-CSI's real csi-rbdplugin-provisioner Deployment,
// or, when the reference data is not there, a minimal one with what the
// patch relies on (its name, labels, service account and ceph-csi-config).
func upstreamDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	b, err := os.ReadFile(upstreamProvisioner)
	if err != nil {
		t.Logf("no Ceph-CSI reference manifest (%v): patching a minimal stand-in instead", err)
		var dep appsv1.Deployment
		if err := yaml.UnmarshalStrict([]byte(minimalProvisioner), &dep); err != nil {
			t.Fatal(err)
		}
		return &dep
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var tm metav1.TypeMeta
		if yaml.Unmarshal([]byte(doc), &tm) != nil || tm.Kind != "Deployment" {
			continue
		}
		var dep appsv1.Deployment
		if err := yaml.UnmarshalStrict([]byte(doc), &dep); err != nil {
			t.Fatalf("%s: %v", upstreamProvisioner, err)
		}
		return &dep
	}
	t.Fatalf("%s: no Deployment", upstreamProvisioner)
	return nil
}

const minimalProvisioner = `apiVersion: apps/v1
kind: Deployment
metadata: {name: csi-rbdplugin-provisioner}
spec:
  selector: {matchLabels: {app: csi-rbdplugin-provisioner}}
  template:
    metadata: {labels: {app: csi-rbdplugin-provisioner}}
    spec:
      serviceAccountName: rbd-csi-provisioner
      containers:
        - name: csi-rbdplugin
          image: quay.io/cephcsi/cephcsi
          args: ["--type=rbd", "--controllerserver=true", "--drivername=rbd.csi.ceph.com"]
          volumeMounts: [{name: ceph-csi-config, mountPath: /etc/ceph-csi-config/}]
      volumes:
        - {name: ceph-csi-config, configMap: {name: ceph-csi-config}}
`

// checkKept: the patched pod has every container of Ceph-CSI's with the
// same image, arguments, environment and mounts, and every volume.
func checkKept(t *testing.T, base *appsv1.Deployment, got appsv1.Deployment) {
	t.Helper()
	bp, gp := &base.Spec.Template.Spec, &got.Spec.Template.Spec
	for _, c := range bp.Containers {
		g := container(gp, c.Name)
		if g == nil {
			t.Errorf("Ceph-CSI's container %s is gone", c.Name)
			continue
		}
		if g.Image != c.Image || !slices.Equal(g.Args, c.Args) || len(g.Env) != len(c.Env) || len(g.VolumeMounts) != len(c.VolumeMounts) {
			t.Errorf("Ceph-CSI's container %s changed", c.Name)
		}
	}
	for _, v := range bp.Volumes {
		if !slices.ContainsFunc(gp.Volumes, func(w corev1.Volume) bool { return w.Name == v.Name }) {
			t.Errorf("Ceph-CSI's volume %s is gone", v.Name)
		}
	}
	if want := len(bp.Containers) + 2; len(gp.Containers) != want {
		t.Errorf("%d containers after the patch, want Ceph-CSI's %d and our 2", len(gp.Containers), len(bp.Containers))
	}
	if got.Spec.Template.Spec.ServiceAccountName != base.Spec.Template.Spec.ServiceAccountName || got.Spec.Replicas == nil != (base.Spec.Replicas == nil) {
		t.Error("the patch changed the Deployment's service account or replicas")
	}
	// The CSI driver's name: ours is csi-rbdplugin's.
	if rbd := container(gp, "csi-rbdplugin"); rbd != nil {
		ours := container(gp, ourContainer)
		if d := flags(t, rbd)["drivername"]; d != "" && expand(ours, flags(t, ours)["drivername"]) != d {
			t.Errorf("our --drivername is not csi-rbdplugin's %s", d)
		}
	}
}

// decode decodes one object strictly (unknown or duplicate fields fail) into
// its API type, by apiVersion and kind.
func decode(t *testing.T, b []byte, objs *objects) {
	t.Helper()
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(b, &tm); err != nil {
		t.Fatal(err)
	}
	strict := func(v any) {
		if err := yaml.UnmarshalStrict(b, v); err != nil {
			t.Errorf("%s %s: %v\n%s", tm.APIVersion, tm.Kind, err, b)
		}
	}
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		var o appsv1.Deployment
		strict(&o)
		objs.deployments = append(objs.deployments, o)
	case "v1 Service":
		var o corev1.Service
		strict(&o)
		objs.services = append(objs.services, o)
	case "v1 Secret":
		var o corev1.Secret
		strict(&o)
		objs.secrets = append(objs.secrets, o)
	case "v1 ServiceAccount":
		var o corev1.ServiceAccount
		strict(&o)
		objs.accounts = append(objs.accounts, o)
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		var o rbacv1.ClusterRole
		strict(&o)
		objs.roles = append(objs.roles, o)
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		var o rbacv1.ClusterRoleBinding
		strict(&o)
		objs.bindings = append(objs.bindings, o)
	case "cbt.storage.k8s.io/v1beta1 SnapshotMetadataService":
		var o SnapshotMetadataService
		strict(&o)
		objs.sms = append(objs.sms, o)
	case "cert-manager.io/v1 Issuer":
		var o Issuer
		strict(&o)
		objs.issuers = append(objs.issuers, o)
	case "cert-manager.io/v1 Certificate":
		var o Certificate
		strict(&o)
		objs.certificates = append(objs.certificates, o)
	default:
		t.Errorf("unexpected object %s %s", tm.APIVersion, tm.Kind)
	}
}

// check checks one example's build. The steps that each read one part of
// our pod, or one object, run as subtests: a Fatal in one leaves the rest
// to report. The Service, the CR and TLS build on each other (the CR's
// address is the Service's, TLS checks against the CR's CA), so they are
// plain steps, and a Fatal in one stops the ones after it.
func check(t *testing.T, objs *objects) {
	p := findPod(t, objs)
	for _, step := range []struct {
		name  string
		check func(*testing.T, *ourPod)
	}{
		{"names", checkNames},
		{"socket", checkSocket},
		{"cluster-config", checkClusterConfig},
		{"security-context", checkSecurityContext},
		{"server-flags", checkServerFlags},
		{"images", checkImages},
		{"ports", checkPorts},
		{"sidecar-flags", checkSidecarFlags},
		{"liveness", checkLiveness},
		{"default-container", checkDefaultContainer},
		{"memory", checkMemory},
		{"metrics-service", checkMetricsService},
	} {
		t.Run(step.name, func(t *testing.T) { step.check(t, p) })
	}
	svc, sp := checkService(t, p)
	host, caPEM, ca := checkCR(t, p, svc, sp)
	checkTLS(t, p, host, caPEM, ca)
	t.Run("sidecar-rbac", func(t *testing.T) { checkSidecarRBAC(t, p) })
	t.Run("client-rbac", func(t *testing.T) { checkClientRBAC(t, p) })
}

// ourPod is what check's steps read: the build, the Deployment that
// carries our server, its pod, our container and the sidecar, their
// --flag=values (oa, sa) and the pod's volumes by name.
type ourPod struct {
	objs       *objects
	dep        *appsv1.Deployment
	pod        *corev1.PodSpec
	ours, side *corev1.Container
	oa, sa     map[string]string
	vols       map[string]*corev1.Volume
}

// findPod finds the one Deployment that carries our server, with the
// sidecar next to it: every step reads them, so without them check stops.
func findPod(t *testing.T, objs *objects) *ourPod {
	var dep *appsv1.Deployment
	for i := range objs.deployments {
		if container(&objs.deployments[i].Spec.Template.Spec, ourContainer) != nil {
			if dep != nil {
				t.Fatalf("two Deployments carry %s", ourContainer)
			}
			dep = &objs.deployments[i]
		}
	}
	if dep == nil {
		t.Fatalf("no Deployment carries %s", ourContainer)
	}
	pod := &dep.Spec.Template.Spec
	ours, side := container(pod, ourContainer), container(pod, sidecarContainer)
	if side == nil {
		t.Fatalf("Deployment %s has no %s container", dep.Name, sidecarContainer)
	}
	p := &ourPod{objs: objs, dep: dep, pod: pod, ours: ours, side: side, vols: map[string]*corev1.Volume{}}
	p.oa, p.sa = flags(t, ours), flags(t, side)
	for i, v := range pod.Volumes {
		p.vols[v.Name] = &pod.Volumes[i]
	}
	return p
}

// checkNames: volume and container names are unique in the pod, and
// every mount names a volume of the pod.
func checkNames(t *testing.T, p *ourPod) {
	vols := map[string]bool{}
	for _, v := range p.pod.Volumes {
		if vols[v.Name] {
			t.Errorf("volume %s defined twice", v.Name)
		}
		vols[v.Name] = true
	}
	names := map[string]bool{}
	for _, c := range p.pod.Containers {
		if names[c.Name] {
			t.Errorf("container %s defined twice", c.Name)
		}
		names[c.Name] = true
		for _, m := range c.VolumeMounts {
			if p.vols[m.Name] == nil {
				t.Errorf("container %s mounts %s, which is no volume of the pod", c.Name, m.Name)
			}
		}
	}
}

// checkSocket: our --endpoint is the sidecar's --csi-address, in a volume
// that both mount (an emptyDir of their own).
func checkSocket(t *testing.T, p *ourPod) {
	sock, ok := strings.CutPrefix(p.oa["endpoint"], "unix://")
	if !ok {
		t.Fatalf("%s --endpoint=%q: want unix:///path", ourContainer, p.oa["endpoint"])
	}
	if got := strings.TrimPrefix(p.sa["csi-address"], "unix://"); got != sock {
		t.Errorf("sidecar --csi-address=%q, server listens on %q", p.sa["csi-address"], sock)
	}
	ov, sv := mountOf(p.ours, sock), mountOf(p.side, sock)
	if ov == nil || sv == nil || ov.Name != sv.Name {
		t.Errorf("the socket %s is not in one volume mounted by both containers (%v, %v)", sock, ov, sv)
		return
	}
	if ov.ReadOnly || sv.ReadOnly {
		t.Errorf("socket volume %s mounted read-only", ov.Name)
	}
	if v := p.vols[ov.Name]; v == nil || v.EmptyDir == nil {
		t.Errorf("socket volume %s is not an emptyDir", ov.Name)
	}
	for _, c := range p.pod.Containers {
		if c.Name != ourContainer && c.Name != sidecarContainer && mountOfVolume(&c, ov.Name) {
			t.Errorf("container %s also mounts the socket volume %s", c.Name, ov.Name)
		}
	}
}

// checkClusterConfig: a ConfigMap volume, mounted read-only, holds the
// file --clusterconfig names.
func checkClusterConfig(t *testing.T, p *ourPod) {
	cfg := p.oa["clusterconfig"]
	m := mountOf(p.ours, cfg)
	if m == nil {
		t.Errorf("--clusterconfig=%s is in no mount of %s", cfg, ourContainer)
		return
	}
	v := p.vols[m.Name]
	if v == nil || v.ConfigMap == nil || v.ConfigMap.Name == "" {
		t.Errorf("--clusterconfig=%s: volume %s is not a ConfigMap", cfg, m.Name)
		return
	}
	rel, _ := filepath.Rel(m.MountPath, cfg)
	if len(v.ConfigMap.Items) > 0 {
		found := false
		for _, it := range v.ConfigMap.Items {
			found = found || it.Path == rel
		}
		if !found {
			t.Errorf("ConfigMap volume %s has no item at %s", m.Name, rel)
		}
	} else if rel != "config.json" {
		t.Errorf("--clusterconfig=%s: Ceph-CSI's ConfigMap key is config.json", cfg)
	}
	if !m.ReadOnly {
		t.Errorf("%s mounts the cluster config read-write", ourContainer)
	}
}

// checkSecurityContext: the socket is 0660, so both containers run
// non-root in the same group; our uid is the image's USER.
func checkSecurityContext(t *testing.T, p *ourPod) {
	ours, side := p.ours, p.side
	for _, c := range []*corev1.Container{ours, side} {
		sc := c.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 ||
			sc.RunAsGroup == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: want runAsNonRoot, runAsUser and runAsGroup set, no privilege escalation", c.Name)
		}
	}
	if g1, g2 := ours.SecurityContext.RunAsGroup, side.SecurityContext.RunAsGroup; g1 != nil && g2 != nil && *g1 != *g2 {
		t.Errorf("runAsGroup %d and %d differ: the sidecar cannot open the server's 0660 socket", *g1, *g2)
	}
	if u := dockerfileUser(t); ours.SecurityContext.RunAsUser != nil && strconv.FormatInt(*ours.SecurityContext.RunAsUser, 10) != u {
		t.Errorf("runAsUser %d, the image's USER is %s", *ours.SecurityContext.RunAsUser, u)
	}
}

// checkServerFlags: flags that the server does not define would stop it
// at start.
func checkServerFlags(t *testing.T, p *ourPod) {
	known := serverFlags(t)
	for f := range p.oa {
		if !known[f] {
			t.Errorf("%s: flag --%s is not one of the server's", ourContainer, f)
		}
	}
}

// checkImages: both images pinned.
func checkImages(t *testing.T, p *ourPod) {
	if p.side.Image != sidecarImage {
		t.Errorf("sidecar image %s, want %s", p.side.Image, sidecarImage)
	}
	ours := p.ours.Image
	if i := strings.LastIndex(ours, ":"); i < 0 || strings.Contains(ours[i:], "/") || ours[i+1:] == "latest" {
		t.Errorf("image %s: want a pinned tag", ours)
	}
}

// checkPorts: unique in the pod; metrics as the brief for Prometheus says;
// the sidecar's --http-endpoint its own, where its readiness probe asks.
func checkPorts(t *testing.T, p *ourPod) {
	ours, side := p.ours, p.side
	ports := map[int32]string{}
	for _, c := range p.pod.Containers {
		for _, cp := range c.Ports {
			if other, dup := ports[cp.ContainerPort]; dup {
				t.Errorf("port %d used by %s and %s", cp.ContainerPort, other, c.Name)
			}
			ports[cp.ContainerPort] = c.Name
		}
	}
	if mp := port(ours, "metrics"); mp == nil || mp.ContainerPort != metricsPort || portOf(t, p.oa["metrics-address"]) != metricsPort {
		t.Errorf("%s: want port %d named metrics and --metrics-address=:%d", ourContainer, metricsPort, metricsPort)
	}
	httpPort := portOf(t, p.sa["http-endpoint"])
	if owner, used := ports[int32(httpPort)]; used && owner != sidecarContainer {
		t.Errorf("sidecar --http-endpoint port %d is %s's", httpPort, owner)
	}
	if rp := side.ReadinessProbe; rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/health" || resolve(side, rp.HTTPGet.Port) != httpPort {
		t.Errorf("sidecar readiness probe: want GET /health on port %d", httpPort)
	}
}

// checkSidecarFlags: the sidecar's cap on a stream's length (default
// 10 min) is set, and longer than our --stall-timeout (default 5m):
// deploy/README.md, "How long a stream may last". Its TLS files are set.
func checkSidecarFlags(t *testing.T, p *ourPod) {
	sa := p.sa
	if m, err := strconv.Atoi(sa["max-streaming-duration-min"]); err != nil || m <= 10 {
		t.Errorf("sidecar --max-streaming-duration-min=%q: want it set above the default 10", sa["max-streaming-duration-min"])
	}
	if st := p.oa["stall-timeout"]; st != "" {
		if d, err := time.ParseDuration(st); err != nil || d <= 0 || d >= 10*time.Minute {
			t.Errorf("--stall-timeout=%s: want it well inside the sidecar's cap", st)
		}
	}
	for _, f := range []string{"tls-cert", "tls-key"} {
		if sa[f] == "" {
			t.Errorf("sidecar --%s not set", f)
		}
	}
}

// checkLiveness: our server's gRPC health, asked over the socket by the
// image's snapmeta.
func checkLiveness(t *testing.T, p *ourPod) {
	endpoint := p.oa["endpoint"]
	if lp := p.ours.LivenessProbe; lp == nil || lp.Exec == nil || len(lp.Exec.Command) == 0 ||
		!strings.HasSuffix(lp.Exec.Command[0], "/snapmeta") || lp.Exec.Command[len(lp.Exec.Command)-1] != "health" ||
		!slices.Contains(lp.Exec.Command, "--endpoint="+endpoint) {
		t.Errorf("%s: want an exec liveness probe `snapmeta --endpoint=%s health`", ourContainer, endpoint)
	}
}

// checkDefaultContainer: kubectl logs/exec without -c land in the pod's
// main container (csi-rbdplugin in Ceph-CSI's pod, ours on our own).
func checkDefaultContainer(t *testing.T, p *ourPod) {
	inPod := p.objs.inPod
	if dc := p.dep.Spec.Template.Annotations[defaultContainer]; container(p.pod, dc) == nil {
		t.Errorf("pod annotation %s=%q names no container", defaultContainer, dc)
	} else if inPod && dc != "csi-rbdplugin" || !inPod && dc != ourContainer {
		t.Errorf("pod annotation %s=%q", defaultContainer, dc)
	}
}

// checkMemory: both containers have memory requests and limits, and no
// CPU limit; Go's memory limit follows the container's: the server reads
// its limit in bytes from the downward API (cmd's goMemoryLimit), and no
// GOMEMLIMIT overrides it.
func checkMemory(t *testing.T, p *ourPod) {
	for _, c := range []*corev1.Container{p.ours, p.side} {
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() || !c.Resources.Limits.Cpu().IsZero() {
			t.Errorf("container %s: want memory requests and limits, no CPU limit", c.Name)
		}
	}
	if e := findEnv(p.ours, "MEMORY_LIMIT_BYTES"); e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
		e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" || e.ValueFrom.ResourceFieldRef.ContainerName != ourContainer ||
		!e.ValueFrom.ResourceFieldRef.Divisor.IsZero() && e.ValueFrom.ResourceFieldRef.Divisor.Value() != 1 {
		t.Errorf("%s: want env MEMORY_LIMIT_BYTES from resourceFieldRef limits.memory of %s, in bytes", ourContainer, ourContainer)
	}
	for _, e := range p.ours.Env {
		if e.Name == "GOMEMLIMIT" {
			t.Errorf("%s: GOMEMLIMIT set, which overrides the limit derived from the container's", ourContainer)
		}
	}
}

// checkMetricsService: a Service selects the pod and reaches our metrics
// port and the sidecar's.
func checkMetricsService(t *testing.T, p *ourPod) {
	ms := find(p.objs.services, func(s corev1.Service) bool { return s.Name == metricsService })
	if ms == nil {
		t.Errorf("no Service %s", metricsService)
		return
	}
	for k, v := range ms.Spec.Selector {
		if p.dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service %s selector %s=%s does not match the pod", ms.Name, k, v)
		}
	}
	targets := map[int]bool{}
	for _, sp := range ms.Spec.Ports {
		targets[resolve(p.ours, sp.TargetPort)+resolve(p.side, sp.TargetPort)] = true
	}
	if !targets[metricsPort] || !targets[portOf(t, p.sa["http-endpoint"])] {
		t.Errorf("Service %s does not reach ports %d and %s", ms.Name, metricsPort, p.sa["http-endpoint"])
	}
}

// checkService: the Service selects this pod and forwards its one port to
// the sidecar's gRPC --port. The CR's address is the Service's.
func checkService(t *testing.T, p *ourPod) (*corev1.Service, corev1.ServicePort) {
	dep := p.dep
	grpcPort, err := strconv.Atoi(p.sa["port"])
	if err != nil {
		t.Fatalf("sidecar --port=%q", p.sa["port"])
	}
	svc := find(p.objs.services, func(s corev1.Service) bool { return s.Name == serviceName })
	if svc == nil {
		t.Fatalf("no Service %s", serviceName)
	}
	if len(svc.Spec.Selector) == 0 {
		t.Errorf("Service %s selects nothing", svc.Name)
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v || dep.Spec.Selector.MatchLabels[k] != v {
			t.Errorf("Service selector %s=%s does not match Deployment %s", k, v, dep.Name)
		}
	}
	if svc.Namespace != dep.Namespace {
		t.Errorf("Service in %q, Deployment in %q", svc.Namespace, dep.Namespace)
	}
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("Service %s: want one port, got %d", svc.Name, len(svc.Spec.Ports))
	}
	sp := svc.Spec.Ports[0]
	if resolve(p.side, sp.TargetPort) != grpcPort {
		t.Errorf("Service targetPort %s is not the sidecar's --port %d", sp.TargetPort.String(), grpcPort)
	}
	return svc, sp
}

// checkCR: the one SnapshotMetadataService is named after the driver,
// cluster-scoped, and has the Service's address and a CA. It returns the
// Service's host name and the CA, which TLS is checked against.
func checkCR(t *testing.T, p *ourPod, svc *corev1.Service, sp corev1.ServicePort) (string, []byte, *x509.CertPool) {
	if len(p.objs.sms) != 1 {
		t.Fatalf("want one SnapshotMetadataService, got %d", len(p.objs.sms))
	}
	sms := p.objs.sms[0]
	if sms.Namespace != "" {
		t.Errorf("SnapshotMetadataService is cluster-scoped, has namespace %q", sms.Namespace)
	}
	if driver := expand(p.ours, p.oa["drivername"]); driver != sms.Name {
		t.Errorf("server --drivername=%s, SnapshotMetadataService %s: both must be the CSI driver's name", driver, sms.Name)
	}
	host := svc.Name + "." + svc.Namespace
	if want := net.JoinHostPort(host, strconv.Itoa(int(sp.Port))); sms.Spec.Address != want {
		t.Errorf("SnapshotMetadataService address %q, want %q", sms.Spec.Address, want)
	}
	if sms.Spec.Audience == "" {
		t.Error("SnapshotMetadataService has no audience")
	}
	caPEM, err := base64.StdEncoding.Strict().DecodeString(sms.Spec.CACert)
	if err != nil {
		t.Errorf("SnapshotMetadataService caCert: %v", err)
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM(caPEM) {
		t.Fatalf("SnapshotMetadataService caCert is no PEM certificate: %q", sms.Spec.CACert)
	}
	return host, caPEM, ca
}

// checkTLS: the Secret the sidecar mounts is the serving certificate for
// the Service's name, signed by the CR's CA (kustomize-generated), or the
// one a cert-manager Certificate for that name writes. No Secret meant for
// kustomize alone is in the output, and a key is only in a TLS Secret.
func checkTLS(t *testing.T, p *ourPod, host string, caPEM []byte, ca *x509.CertPool) {
	side, sa, objs := p.side, p.sa, p.objs
	tm := mountOf(side, sa["tls-cert"])
	if tm == nil || mountOf(side, sa["tls-key"]) != tm || p.vols[tm.Name] == nil || p.vols[tm.Name].Secret == nil {
		t.Fatalf("sidecar --tls-cert and --tls-key are not in one Secret volume")
	}
	secretName := p.vols[tm.Name].Secret.SecretName
	certFile, _ := filepath.Rel(tm.MountPath, sa["tls-cert"])
	keyFile, _ := filepath.Rel(tm.MountPath, sa["tls-key"])
	if certFile != corev1.TLSCertKey || keyFile != corev1.TLSPrivateKeyKey {
		t.Errorf("sidecar reads %s and %s, a TLS Secret holds %s and %s", certFile, keyFile, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	if s := find(objs.secrets, func(s corev1.Secret) bool { return s.Name == secretName }); s != nil {
		checkServingSecret(t, s, host, ca)
	} else if c := find(objs.certificates, func(c Certificate) bool { return c.Spec.SecretName == secretName }); c != nil {
		checkCertificate(t, objs, c, host, caPEM)
	} else {
		t.Errorf("the sidecar mounts Secret %s, which is neither built here nor a Certificate's", secretName)
	}
	for _, s := range objs.secrets {
		if _, local := s.Annotations["config.kubernetes.io/local-config"]; local {
			t.Errorf("Secret %s is local-config but in the output", s.Name)
		}
		if block, _ := pem.Decode(s.Data[corev1.TLSPrivateKeyKey]); block != nil && s.Name == secretName && s.Type != corev1.SecretTypeTLS {
			t.Errorf("Secret %s holds a key but is not of type TLS", s.Name)
		}
	}
}

// checkServingSecret: a kustomize-generated TLS Secret holds a key pair
// whose certificate the CR's CA verifies for host, as a server's.
func checkServingSecret(t *testing.T, s *corev1.Secret, host string, ca *x509.CertPool) {
	if s.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret %s has type %s", s.Name, s.Type)
	}
	pair, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatalf("Secret %s: %v", s.Name, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: ca, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("Secret %s's certificate for %s with the CR's CA: %v", s.Name, host, err)
	}
}

// checkCertificate: a cert-manager Certificate names host, and its CA
// Issuer's key pair is the CR's caCert.
func checkCertificate(t *testing.T, objs *objects, c *Certificate, host string, caPEM []byte) {
	if !slices.Contains(c.Spec.DNSNames, host) {
		t.Errorf("Certificate %s: dnsNames %v lack %s", c.Name, c.Spec.DNSNames, host)
	}
	iss := find(objs.issuers, func(i Issuer) bool { return i.Name == c.Spec.IssuerRef.Name })
	if iss == nil || c.Spec.IssuerRef.Kind != "Issuer" || iss.Spec.CA == nil {
		t.Fatalf("Certificate %s: no CA Issuer %s", c.Name, c.Spec.IssuerRef.Name)
	}
	kp := find(objs.secrets, func(s corev1.Secret) bool { return s.Name == iss.Spec.CA.SecretName })
	if kp == nil {
		t.Fatalf("Issuer %s: no Secret %s", iss.Name, iss.Spec.CA.SecretName)
	}
	if _, err := tls.X509KeyPair(kp.Data[corev1.TLSCertKey], kp.Data[corev1.TLSPrivateKeyKey]); err != nil {
		t.Errorf("Secret %s: %v", kp.Name, err)
	}
	if !bytes.Equal(kp.Data[corev1.TLSCertKey], caPEM) {
		t.Errorf("the Issuer's CA (Secret %s) is not the SnapshotMetadataService's caCert", kp.Name)
	}
}

// checkSidecarRBAC: the sidecar's ClusterRole allows what it asks the API
// server, and is bound to the pod's service account and to nothing else.
func checkSidecarRBAC(t *testing.T, p *ourPod) {
	dep, name := p.dep, sidecarRole(p.dep.Namespace)
	role := find(p.objs.roles, func(r rbacv1.ClusterRole) bool { return r.Name == name })
	if role == nil {
		t.Fatalf("no ClusterRole %s", name)
	}
	for _, need := range []struct{ group, resource, verb string }{
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "get"},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "list"},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "watch"},
		{"authentication.k8s.io", "tokenreviews", "create"},
		{"authorization.k8s.io", "subjectaccessreviews", "create"},
		{"snapshot.storage.k8s.io", "volumesnapshots", "get"},
		{"snapshot.storage.k8s.io", "volumesnapshots", "list"},
		{"snapshot.storage.k8s.io", "volumesnapshotcontents", "get"},
		{"snapshot.storage.k8s.io", "volumesnapshotcontents", "list"},
		{"snapshot.storage.k8s.io", "volumesnapshotclasses", "get"},
		{"snapshot.storage.k8s.io", "volumesnapshotclasses", "list"},
		{"", "secrets", "get"},
	} {
		if !allows(role.Rules, need.group, need.resource, need.verb) {
			t.Errorf("ClusterRole %s does not allow %s %s.%s", role.Name, need.verb, need.resource, need.group)
		}
	}
	account := dep.Spec.Template.Spec.ServiceAccountName
	if account == "" {
		t.Errorf("Deployment %s names no service account", dep.Name)
	}
	bound := false
	for _, b := range p.objs.bindings {
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != name {
			continue
		}
		for _, s := range b.Subjects {
			if s.Kind == "ServiceAccount" && s.Name == account && s.Namespace == dep.Namespace {
				bound = true
			} else {
				t.Errorf("ClusterRoleBinding %s binds %s %s/%s, not the pod's service account %s/%s",
					b.Name, s.Kind, s.Namespace, s.Name, dep.Namespace, account)
			}
		}
	}
	if !bound {
		t.Errorf("no ClusterRoleBinding gives %s to %s/%s", name, dep.Namespace, account)
	}
	if len(p.objs.accounts) > 0 && find(p.objs.accounts, func(a corev1.ServiceAccount) bool { return a.Name == account }) == nil {
		t.Errorf("service account %s is not among the ServiceAccounts built", account)
	}
}

// checkClientRBAC: the ClusterRole for backup applications lets them get
// their VolumeSnapshots, list the CRs and create a service account token
// (for the CR's audience).
func checkClientRBAC(t *testing.T, p *ourPod) {
	name := clientRole(p.dep.Namespace)
	client := find(p.objs.roles, func(r rbacv1.ClusterRole) bool { return r.Name == name })
	if client == nil {
		t.Fatalf("no ClusterRole %s", name)
	}
	for _, need := range [][3]string{
		{"snapshot.storage.k8s.io", "volumesnapshots", "get"},
		{"cbt.storage.k8s.io", "snapshotmetadataservices", "list"},
		{"", "serviceaccounts/token", "create"},
	} {
		if !allows(client.Rules, need[0], need[1], need[2]) {
			t.Errorf("ClusterRole %s does not allow %s %s.%s", name, need[2], need[1], need[0])
		}
	}
}
func findEnv(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func container(pod *corev1.PodSpec, name string) *corev1.Container {
	for i := range pod.Containers {
		if pod.Containers[i].Name == name {
			return &pod.Containers[i]
		}
	}
	return nil
}

// flags returns a container's --name=value arguments, $(VAR)s expanded.
func flags(t *testing.T, c *corev1.Container) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !ok {
			t.Errorf("container %s: argument %q is not --flag=value", c.Name, a)
			continue
		}
		m[name] = value
	}
	return m
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) with the container's literal env value.
func expand(c *corev1.Container, s string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := varRef.FindStringSubmatch(ref)[1]
		for _, e := range c.Env {
			if e.Name == name && e.ValueFrom == nil {
				return e.Value
			}
		}
		return ref
	})
}

// mountOf is the mount that holds path (the longest matching mount path).
func mountOf(c *corev1.Container, path string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if strings.HasPrefix(path, mp+"/") && (best == nil || len(mp) > len(strings.TrimSuffix(best.MountPath, "/"))) {
			best = &c.VolumeMounts[i]
		}
	}
	return best
}

func mountOfVolume(c *corev1.Container, volume string) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return true
		}
	}
	return false
}

func port(c *corev1.Container, name string) *corev1.ContainerPort {
	for i := range c.Ports {
		if c.Ports[i].Name == name {
			return &c.Ports[i]
		}
	}
	return nil
}

// resolve turns a named or numbered port of c into its number (0: none).
func resolve(c *corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return int(p.IntVal)
	}
	if cp := port(c, p.StrVal); cp != nil {
		return int(cp.ContainerPort)
	}
	return 0
}

// portOf is the port of a host:port flag value, $(VAR) hosts allowed.
func portOf(t *testing.T, hostport string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Errorf("%q: %v", hostport, err)
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

func find[T any](list []T, ok func(T) bool) *T {
	for i := range list {
		if ok(list[i]) {
			return &list[i]
		}
	}
	return nil
}

// serverFlags are the flags rbd-snapshot-metadata defines (its flag.FlagSet
// calls in cmd/rbd-snapshot-metadata) plus klog's.
func serverFlags(t *testing.T) map[string]bool {
	t.Helper()
	files, _ := filepath.Glob("../cmd/rbd-snapshot-metadata/*.go")
	// fs.String("name", ...) and fs.StringVar(&f.name, "name", ...) alike.
	def := regexp.MustCompile(`fs\.(?:(?:String|Bool|Int|Int64|Uint|Uint64|Float64|Duration)(?:Var)?|Var|Func)\(\s*(?:[^,"]+,\s*)?"([a-z0-9-]+)"`)
	known := map[string]bool{"v": true, "vmodule": true, "logtostderr": true}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllSubmatch(b, -1) {
			known[string(m[1])] = true
		}
	}
	if len(known) < 6 {
		t.Fatalf("found only %d flags in ../cmd/rbd-snapshot-metadata", len(known))
	}
	return known
}

// dockerfileUser is the runtime stage's USER uid in ../Dockerfile.
func dockerfileUser(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	user := ""
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "USER" {
			user, _, _ = strings.Cut(f[1], ":")
		}
	}
	if user == "" {
		t.Fatal("../Dockerfile has no USER")
	}
	return user
}

// TestDriverTLSKeyPatch: next to ceph-csi-operator v1.0.1-v1.0.4 (and Rook
// v1.20) the Driver CR needs a controllerPlugin volume named tls-key at
// /tmp/certificates, where the sidecar the operator injects reads
// tls.crt/tls.key (its internal/utils/csi.go); the patch mounts the
// example's own TLS Secret, and the README patches the Driver named like
// the example's CR, in the example's namespace.
func TestDriverTLSKeyPatch(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for example, inPod := range examples {
		if inPod {
			continue
		}
		t.Run(example, func(t *testing.T) {
			objs := build(t, example)
			b, err := os.ReadFile(filepath.Join("examples", example, "driver-tls-key.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var patch struct {
				Spec struct {
					ControllerPlugin struct {
						Volumes []struct {
							Volume corev1.Volume      `json:"volume"`
							Mount  corev1.VolumeMount `json:"mount"`
						} `json:"volumes"`
					} `json:"controllerPlugin"`
				} `json:"spec"`
			}
			if err := yaml.UnmarshalStrict(b, &patch); err != nil {
				t.Fatal(err)
			}
			vs := patch.Spec.ControllerPlugin.Volumes
			if len(vs) != 1 || vs[0].Volume.Name != "tls-key" || vs[0].Mount.Name != "tls-key" ||
				vs[0].Mount.MountPath != "/tmp/certificates" || vs[0].Volume.Secret == nil {
				t.Fatalf("want one Secret volume tls-key mounted at /tmp/certificates: %+v", vs)
			}
			i := slices.IndexFunc(objs.secrets, func(s corev1.Secret) bool { return s.Name == vs[0].Volume.Secret.SecretName })
			if i < 0 || objs.secrets[i].Type != corev1.SecretTypeTLS {
				t.Errorf("Secret %s is not the example's TLS Secret", vs[0].Volume.Secret.SecretName)
			}
			cmd := "kubectl -n " + objs.namespace + " patch driver " + objs.sms[0].Name +
				" --type=merge --patch-file=deploy/examples/" + example + "/driver-tls-key.yaml"
			if !bytes.Contains(readme, []byte(cmd)) {
				t.Errorf("README.md lacks %q", cmd)
			}
		})
	}
}
