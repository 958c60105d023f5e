//go:build e2e

package e2e

// TestK8sHelm: the chart deploy/helm/rbd-snapshot-metadata with the real
// helm v3.22.0 (e2e/k8s/k8s.sh helm) and the real kube-apiserver and kubectl
// v1.34.2. It lints the chart; renders it (helm template) and the kustomize
// examples it stands for (kubectl kustomize) with the same values and
// compares the objects, allowing only Helm's labels, the chart's own CA
// Secret and the certificate material (checked on its own); then installs
// it as deploy/README.md says, upgrades it (changed values, the same values,
// a certificate near its end, a deleted CA), installs it in a second
// namespace, refuses a second release for the same driver, and uninstalls,
// reading every object back. No pod runs (there is no kubelet).

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

const chartImage = "registry.example.com/rbd-snapshot-metadata"

// kobj is one object, decoded from kubectl's JSON.
type kobj = map[string]any

// objectsOf decodes a multi-document manifest with kubectl (client-side dry
// run: kubectl's own decoding, without defaults) into objects by
// "Kind namespace/name".
func objectsOf(t *testing.T, k *kube.Env, manifest string) map[string]kobj {
	t.Helper()
	p := filepath.Join(k.Dir, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()))
	kube.WriteFile(t, p, manifest)
	out, err := k.KubectlErr(t, "create", "--dry-run=client", "-o", "json", "-f", p)
	if err != nil {
		t.Fatalf("kubectl create --dry-run=client: %v\n%s", err, out)
	}
	m := map[string]kobj{}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var o kobj
		if err := dec.Decode(&o); err != nil {
			t.Fatal(err)
		}
		md := o["metadata"].(kobj)
		ns, _ := md["namespace"].(string)
		key := fmt.Sprintf("%s %s/%s", o["kind"], ns, md["name"])
		if _, dup := m[key]; dup {
			t.Errorf("%s rendered twice", key)
		}
		m[key] = o
	}
	return m
}

// helmLabels are what Helm's conventions add (rsm.labels in _helpers.tpl).
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "app.kubernetes.io/version"}

// stripHelm removes the chart's labels; they must all be there, with the
// release's name.
func stripHelm(t *testing.T, key string, o kobj, release string) {
	t.Helper()
	md := o["metadata"].(kobj)
	labels, _ := md["labels"].(kobj)
	if labels["app.kubernetes.io/instance"] != release {
		t.Errorf("%s: instance label %v, want %s", key, labels["app.kubernetes.io/instance"], release)
	}
	for _, l := range helmLabels {
		if _, ok := labels[l]; !ok {
			t.Errorf("%s: no label %s", key, l)
		}
		delete(labels, l)
	}
	if len(labels) == 0 {
		delete(md, "labels")
	}
}

// diffObj lists the paths where a and b differ.
func diffObj(path string, a, b any) []string {
	am, aok := a.(kobj)
	bm, bok := b.(kobj)
	if aok && bok {
		var d []string
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			d = append(d, diffObj(path+"."+k, am[k], bm[k])...)
		}
		return d
	}
	al, aok := a.([]any)
	bl, bok := b.([]any)
	if aok && bok && len(al) == len(bl) {
		var d []string
		for i := range al {
			d = append(d, diffObj(fmt.Sprintf("%s[%d]", path, i), al[i], bl[i])...)
		}
		return d
	}
	if !reflect.DeepEqual(a, b) {
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		return []string{fmt.Sprintf("%s: helm %s, kustomize %s", path, ja, jb)}
	}
	return nil
}

// tlsCheck: the serving certificate in the Secret names host and chains to
// the CA in the CR's caCert.
func tlsCheck(t *testing.T, what string, secret kobj, caCertB64, host string) *x509.Certificate {
	t.Helper()
	data, _ := secret["data"].(kobj)
	crtB64, _ := data["tls.crt"].(string)
	keyB64, _ := data["tls.key"].(string)
	crtPEM, err1 := base64.StdEncoding.DecodeString(crtB64)
	keyPEM, err2 := base64.StdEncoding.DecodeString(keyB64)
	caPEM, err3 := base64.StdEncoding.Strict().DecodeString(caCertB64)
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatalf("%s: not base64: %v %v %v", what, err1, err2, err3)
	}
	if kb, _ := pem.Decode(keyPEM); kb == nil || !strings.Contains(kb.Type, "PRIVATE KEY") {
		t.Errorf("%s: tls.key is no PEM private key", what)
	}
	blk, _ := pem.Decode(crtPEM)
	if blk == nil {
		t.Fatalf("%s: tls.crt is no PEM", what)
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s: caCert is no PEM certificate", what)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("%s: the certificate for %s with the CR's CA: %v", what, host, err)
	}
	return leaf
}

func chartSet(kv ...string) []string {
	var a []string
	for _, s := range kv {
		a = append(a, "--set", s)
	}
	return a
}

func TestK8sHelm(t *testing.T) {
	t0 := time.Now()
	k := kube.StartControlPlane(t)
	certManagerCRDs(t, k)
	root := deployTree(t)
	h := &helmRun{k: k, root: root, chart: filepath.Join(root, "helm", "rbd-snapshot-metadata"),
		image: chartSet("image.repository="+chartImage, "image.tag=v0.1.0")}

	t.Run("lint", h.lint)

	// ---- helm template and the kustomize examples, the same values.
	for _, c := range []struct {
		example, ns string
		values      []string
	}{
		{"ceph-csi-operator", "ceph-csi-operator-system", nil},
		{"rook", "rook-ceph", chartSet("driverName=rook-ceph.rbd.csi.ceph.com")},
	} {
		t.Run("same-as-kustomize/"+c.example, func(t *testing.T) { h.sameAsKustomize(t, c.example, c.ns, c.values) })
	}

	// ---- The cert-manager route: the same Issuer and Certificate as
	// examples/cert-manager for the same namespace.
	t.Run("same-as-kustomize/cert-manager", h.sameAsKustomizeCertManager)

	// ---- Install, upgrade, a second install, uninstall, on the API server.
	t.Run("install", h.install)
	t.Run("upgrade", h.upgrade)
	t.Run("cert-renewal", h.certRenewal)
	t.Run("second-namespace", h.secondNamespace)
	t.Run("uninstall", h.uninstall)
	t.Logf("helm test: %.1fs", time.Since(t0).Seconds())
}

// helmRun is what TestK8sHelm's steps share: the API server, the copy of
// deploy/ and its chart, the image values, and the first release's state
// as the last step left it.
type helmRun struct {
	k     *kube.Env
	root  string
	chart string
	image []string
	first helmState
}

// The namespaces of the first release and of the second.
const helmNS, helmNS2 = "rsm-helm", "rsm-helm-2"

// helmHost is the first release's Service name, in its certificate.
const helmHost = "csi-rbdplugin-snapshot-metadata." + helmNS

// lint: the chart lints strictly, and refuses a wrong TLS mode or a
// missing CA with a message.
func (h *helmRun) lint(t *testing.T) {
	k, chart := h.k, h.chart
	k.Helm(t, "lint", "--strict", chart)
	k.Helm(t, append([]string{"lint", "--strict", chart, "--set-file", "tls.caCert=" + filepath.Join(k.Dir, "pki", "ca.crt")},
		chartSet("tls.mode=certManager")...)...)
	// A wrong mode or a missing CA is refused with a message, not rendered.
	if out, err := k.HelmErr(t, append([]string{"template", "x", chart}, chartSet("tls.mode=secret")...)...); err == nil || !strings.Contains(out, "tls.caCert") {
		t.Errorf("tls.mode=secret without tls.caCert: %v, want a refusal naming tls.caCert", err)
	}
	if out, err := k.HelmErr(t, append([]string{"template", "x", chart}, chartSet("tls.mode=acme")...)...); err == nil || !strings.Contains(out, "want generate, secret or certManager") {
		t.Errorf("tls.mode=acme: %v, want a refusal", err)
	}
}

// sameAsKustomize: helm template with values, in each TLS mode, renders
// the objects kubectl kustomize builds of the example, but for Helm's
// labels and the certificate material.
func (h *helmRun) sameAsKustomize(t *testing.T, ex, ns string, values []string) {
	k := h.k
	genCerts(t, h.root, ex, ns)
	example := filepath.Join(h.root, "examples", ex)
	built := k.Kubectl(t, "kustomize", example)
	caFile := filepath.Join(example, "certs", "ca.crt")
	for _, mode := range []string{"generate", "secret"} {
		args := append([]string{"template", "rsm", h.chart, "-n", ns}, h.image...)
		args = append(args, values...)
		if mode == "secret" {
			args = append(args, "--set", "tls.mode=secret", "--set-file", "tls.caCert="+caFile)
		}
		got := objectsOf(t, k, k.Helm(t, args...))
		want := objectsOf(t, k, built)
		checkTLSMode(t, mode, ns, got, want)
		for key, o := range got {
			stripHelm(t, key, o, "rsm")
			w, ok := want[key]
			if !ok {
				t.Errorf("%s: helm renders %s, kustomize does not", mode, key)
				continue
			}
			for _, d := range diffObj(key, o, w) {
				t.Errorf("%s: %s", mode, d)
			}
		}
		for key := range want {
			if got[key] == nil {
				t.Errorf("%s: kustomize builds %s, helm does not", mode, key)
			}
		}
		t.Logf("%s, tls.mode=%s: %d objects alike", ex, mode, len(got))
	}
}

// checkTLSMode checks the certificate material that helm renders (got) in
// mode against what kustomize builds (want), then takes it out of both
// for the comparison of the rest: the chart's own CA and certificate, the
// certificate's data, and the CRs' caCert.
func checkTLSMode(t *testing.T, mode, ns string, got, want map[string]kobj) {
	t.Helper()
	sms := func(m map[string]kobj) kobj {
		for key, o := range m {
			if strings.HasPrefix(key, "SnapshotMetadataService ") {
				return o
			}
		}
		t.Fatalf("no SnapshotMetadataService")
		return nil
	}
	hs, ks := sms(got), sms(want)
	tlsKey := "Secret " + ns + "/csi-rbdplugin-snapshot-metadata-tls"
	caKey := "Secret " + ns + "/csi-rbdplugin-snapshot-metadata-ca-keypair"
	switch mode {
	case "generate":
		// The chart's own CA and certificate: valid for the
		// Service's name, and the CR trusts that CA.
		if got[caKey] == nil || got[tlsKey] == nil {
			t.Fatalf("generate: no %s or %s", caKey, tlsKey)
		}
		leaf := tlsCheck(t, "helm template", got[tlsKey], hs["spec"].(kobj)["caCert"].(string), "csi-rbdplugin-snapshot-metadata."+ns)
		if d := leaf.NotAfter.Sub(time.Now()); d < 364*24*time.Hour || d > 366*24*time.Hour {
			t.Errorf("certificate valid for %v, want 365 days", d)
		}
		stripHelm(t, caKey, got[caKey], "rsm")
		delete(got, caKey)
		for _, o := range []kobj{got[tlsKey], want[tlsKey]} {
			delete(o, "data")
			delete(o["metadata"].(kobj), "annotations")
		}
	case "secret":
		// Your Secret, your CA: the CR's caCert is kustomize's.
		if got[tlsKey] != nil || got[caKey] != nil {
			t.Errorf("tls.mode=secret renders a Secret")
		}
		delete(want, tlsKey)
		if hs["spec"].(kobj)["caCert"] != ks["spec"].(kobj)["caCert"] {
			t.Errorf("tls.mode=secret: caCert differs from kustomize's")
		}
	}
	hs["spec"].(kobj)["caCert"], ks["spec"].(kobj)["caCert"] = "", ""
}

// sameAsKustomizeCertManager: tls.mode=certManager renders the Issuer,
// Certificate and CR of examples/cert-manager, and no Secret.
func (h *helmRun) sameAsKustomizeCertManager(t *testing.T) {
	k := h.k
	const ns = "ceph-csi-rbd"
	genCerts(t, h.root, "cert-manager", ns)
	example := filepath.Join(h.root, "examples", "cert-manager")
	kust := objectsOf(t, k, k.Kubectl(t, "kustomize", example))
	args := append([]string{"template", "rsm", h.chart, "-n", ns, "--set", "tls.mode=certManager",
		"--set-file", "tls.caCert=" + filepath.Join(example, "certs", "ca.crt")}, h.image...)
	got := objectsOf(t, k, k.Helm(t, args...))
	for _, key := range []string{"Issuer " + ns + "/csi-rbdplugin-snapshot-metadata-ca", "Certificate " + ns + "/csi-rbdplugin-snapshot-metadata", "SnapshotMetadataService /rbd.csi.ceph.com"} {
		rendered, built := got[key], kust[key]
		if rendered == nil || built == nil {
			t.Errorf("%s: helm %v, kustomize %v", key, rendered != nil, built != nil)
			continue
		}
		stripHelm(t, key, rendered, "rsm")
		for _, d := range diffObj(key, rendered, built) {
			t.Error(d)
		}
	}
	if got["Secret "+ns+"/csi-rbdplugin-snapshot-metadata-tls"] != nil {
		t.Error("tls.mode=certManager renders the Secret cert-manager writes")
	}
}

// helmState is what the first release's objects hold, read back.
type helmState struct {
	rv         map[string]string
	tlsData    string
	caData     string
	caCert     string
	args       []string
	notAfter   string
	dnsNames   string
	leafSerial string
}

// read reads the first release's objects back, checking its CR and that
// its caCert verifies its certificate.
func (h *helmRun) read(t *testing.T) helmState {
	t.Helper()
	k := h.k
	var s helmState
	s.rv = k.ResourceVersions(t, "-n", helmNS, "deployment,service,secret,serviceaccount,snapshotmetadataservice,clusterrole,clusterrolebinding")
	var sec, ca kobj
	k.GetJSON(t, &sec, "-n", helmNS, "secret", "csi-rbdplugin-snapshot-metadata-tls")
	k.GetJSON(t, &ca, "-n", helmNS, "secret", "csi-rbdplugin-snapshot-metadata-ca-keypair")
	var sms struct {
		Spec struct{ Address, CACert, Audience string }
	}
	k.GetJSON(t, &sms, "snapshotmetadataservice", "rbd.csi.ceph.com")
	if sms.Spec.Address != helmHost+":6443" || sms.Spec.Audience != "rbd.csi.ceph.com" {
		t.Errorf("SnapshotMetadataService %+v", sms.Spec)
	}
	leaf := tlsCheck(t, "installed", sec, sms.Spec.CACert, helmHost)
	s.leafSerial = leaf.SerialNumber.String()
	b, _ := json.Marshal(sec["data"])
	s.tlsData = string(b)
	b, _ = json.Marshal(ca["data"])
	s.caData = string(b)
	s.caCert = sms.Spec.CACert
	ann := sec["metadata"].(kobj)["annotations"].(kobj)
	s.notAfter, _ = ann["rbd-snapshot-metadata/not-after"].(string)
	s.dnsNames, _ = ann["rbd-snapshot-metadata/dns-names"].(string)
	d := deployment(t, k, helmNS, "rbd-snapshot-metadata")
	for _, c := range d.Spec.Template.Spec.Containers {
		s.args = append(s.args, c.Args...)
	}
	return s
}

// changed are the objects whose resourceVersion differs from a to b,
// Helm's release records aside.
func changed(a, b map[string]string) []string {
	var d []string
	for key, v := range b {
		// Helm's release records are Secrets of the namespace too.
		if a[key] != v && !strings.Contains(key, "/sh.helm.release.v1.") {
			d = append(d, key)
		}
	}
	sort.Strings(d)
	return d
}

// install: deploy/README.md's Helm route, and the sidecar's RBAC.
func (h *helmRun) install(t *testing.T) {
	k := h.k
	k.Kubectl(t, "create", "namespace", helmNS)
	k.Kubectl(t, "-n", helmNS, "create", "configmap", "ceph-csi-config", `--from-literal=config.json=[{"clusterID":"c1","monitors":["192.0.2.1:6789"]}]`)
	// deploy/README.md's Helm route.
	k.Helm(t, append([]string{"install", "rsm", h.chart, "-n", helmNS}, h.image...)...)
	h.first = h.read(t)
	if !slices.Contains(h.first.args, "--max-streaming-duration-min=120") || !slices.Contains(h.first.args, "--v=2") {
		t.Errorf("args %q", h.first.args)
	}
	for _, r := range [][3]string{
		{"create", "authentication.k8s.io", "tokenreviews"},
		{"create", "authorization.k8s.io", "subjectaccessreviews"},
		{"get", "", "secrets"},
		{"list", "cbt.storage.k8s.io", "snapshotmetadataservices"},
	} {
		if !k.Allowed(t, helmNS, "rbd-snapshot-metadata", r[0], r[1], r[2]) {
			t.Errorf("%s/rbd-snapshot-metadata may not %s %s.%s", helmNS, r[0], r[2], r[1])
		}
	}
	k.Helm(t, "status", "rsm", "-n", helmNS)
}

// upgrade: a changed value changes the Deployment only, the certificate
// and CA stay; the same values again write nothing.
func (h *helmRun) upgrade(t *testing.T) {
	k, chart, image, first := h.k, h.chart, h.image, h.first
	// A changed value: the Deployment changes, the certificate and CA stay.
	k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", helmNS}, image...), chartSet("server.logLevel=4")...)...)
	s := h.read(t)
	if !slices.Contains(s.args, "--v=4") {
		t.Errorf("after upgrade with server.logLevel=4: args %q", s.args)
	}
	if s.tlsData != first.tlsData || s.caData != first.caData || s.caCert != first.caCert {
		t.Errorf("an upgrade changed the certificate or the CA")
	}
	ch := changed(first.rv, s.rv)
	t.Logf("objects an upgrade with a changed value wrote: %v", ch)
	if !slices.Equal(ch, []string{"Deployment " + helmNS + "/rbd-snapshot-metadata"}) {
		t.Errorf("objects changed by the upgrade: %v, want only the Deployment", ch)
	}
	// The same values again: nothing is written.
	k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", helmNS}, image...), chartSet("server.logLevel=4")...)...)
	if again := h.read(t); len(changed(s.rv, again.rv)) != 0 {
		t.Errorf("an upgrade with the same values wrote %v", changed(s.rv, again.rv))
	}
	h.first = h.read(t)
}

// certRenewal: a certificate near its end is issued again from the same
// CA; one far from it is kept; a deleted CA is made anew with its
// certificate and the CR's caCert.
func (h *helmRun) certRenewal(t *testing.T) {
	k, chart, image := h.k, h.chart, h.image
	// A certificate within renewDays of its end (here: renewDays beyond
	// its whole validity) is issued again at the next upgrade, from the
	// same CA: caCert stays, clients need nothing new.
	k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", helmNS, "--reuse-values"}, image...), chartSet("tls.generate.renewDays=366")...)...)
	s := h.read(t)
	if s.tlsData == h.first.tlsData || s.leafSerial == h.first.leafSerial {
		t.Errorf("the certificate was not issued again")
	}
	if s.caData != h.first.caData || s.caCert != h.first.caCert {
		t.Errorf("renewing the certificate changed the CA")
	}
	t.Logf("renewed: serial %s -> %s, not-after %s -> %s, CA kept; objects written: %v", h.first.leafSerial, s.leafSerial, h.first.notAfter, s.notAfter, changed(h.first.rv, s.rv))
	k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", helmNS, "--reuse-values"}, image...), chartSet("tls.generate.renewDays=30")...)...)
	h.first = h.read(t)
	if h.first.tlsData != s.tlsData {
		t.Errorf("an upgrade with the certificate far from its end issued it again")
	}

	// CA rotation: delete the CA's Secret and upgrade: a new CA, a new
	// certificate from it, and the CR's caCert, in one upgrade.
	k.Kubectl(t, "-n", helmNS, "delete", "secret", "csi-rbdplugin-snapshot-metadata-ca-keypair")
	k.Helm(t, append([]string{"upgrade", "rsm", chart, "-n", helmNS, "--reuse-values"}, image...)...)
	r := h.read(t)
	if r.caData == h.first.caData || r.caCert == h.first.caCert || r.tlsData == h.first.tlsData {
		t.Errorf("deleting the CA and upgrading did not rotate CA, caCert and certificate")
	}
	h.first = r
}

// secondNamespace: Helm refuses a second release for the same driver and
// leaves the first as it was; one for another driver, with older Rook's
// ConfigMap, installs next to it, and both keep their RBAC.
func (h *helmRun) secondNamespace(t *testing.T) {
	k, chart, image := h.k, h.chart, h.image
	k.Kubectl(t, "create", "namespace", helmNS2)
	k.Kubectl(t, "-n", helmNS2, "create", "configmap", "rook-ceph-csi-config", `--from-literal=csi-cluster-config-json=[{"clusterID":"c2","monitors":["192.0.2.2:6789"]}]`)
	// The same driver in another namespace: one SnapshotMetadataService
	// per driver, so Helm refuses to take the first release's CR.
	out, err := k.HelmErr(t, append([]string{"install", "rsm", chart, "-n", helmNS2}, image...)...)
	if err == nil || !strings.Contains(out, "SnapshotMetadataService") || !strings.Contains(out, "rbd.csi.ceph.com") {
		t.Errorf("a second release for driver rbd.csi.ceph.com: %v, want a refusal naming the SnapshotMetadataService", err)
	}
	if again := h.read(t); len(changed(h.first.rv, again.rv)) != 0 || again.caCert != h.first.caCert {
		t.Errorf("the refused install changed the first one: %v", changed(h.first.rv, again.rv))
	}
	// Another driver, older Rook's ConfigMap and key.
	k.Helm(t, append(append([]string{"install", "rsm", chart, "-n", helmNS2}, image...),
		chartSet("driverName="+helmNS2+".rbd.csi.ceph.com", "cephCSIConfig.configMapName=rook-ceph-csi-config", "cephCSIConfig.key=csi-cluster-config-json")...)...)
	d := deployment(t, k, helmNS2, "rbd-snapshot-metadata")
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "ceph-csi-config" && (v.ConfigMap == nil || v.ConfigMap.Name != "rook-ceph-csi-config" || len(v.ConfigMap.Items) != 1 || v.ConfigMap.Items[0].Key != "csi-cluster-config-json" || v.ConfigMap.Items[0].Path != "config.json") {
			t.Errorf("ceph-csi-config volume %+v", v.ConfigMap)
		}
	}
	k.Kubectl(t, "get", "snapshotmetadataservice", helmNS2+".rbd.csi.ceph.com")
	for _, n := range []string{helmNS, helmNS2} {
		if !k.Allowed(t, n, "rbd-snapshot-metadata", "create", "authentication.k8s.io", "tokenreviews") {
			t.Errorf("%s's sidecar lost its RBAC", n)
		}
	}
}

// uninstall: the second release leaves nothing behind and the first whole;
// then the first goes too, its CR with it.
func (h *helmRun) uninstall(t *testing.T) {
	k := h.k
	k.Helm(t, "uninstall", "rsm", "-n", helmNS2)
	left := k.Kubectl(t, "get", "clusterrole,clusterrolebinding,snapshotmetadataservice", "-o", "name")
	for _, n := range []string{"rbd-snapshot-metadata:" + helmNS2 + ":sidecar", "rbd-snapshot-metadata:" + helmNS2 + ":client", helmNS2 + ".rbd.csi.ceph.com"} {
		if strings.Contains(left, n) {
			t.Errorf("%s is left after uninstall", n)
		}
	}
	for _, l := range strings.Split(k.Kubectl(t, "-n", helmNS2, "get", "deployment,service,secret,serviceaccount", "-o", "name"), "\n") {
		if strings.Contains(l, "/") {
			t.Errorf("left in %s after uninstall: %s", helmNS2, l)
		}
	}
	// The first install is whole.
	if again := h.read(t); len(changed(h.first.rv, again.rv)) != 0 {
		t.Errorf("uninstalling the second release changed the first: %v", changed(h.first.rv, again.rv))
	}
	if !k.Allowed(t, helmNS, "rbd-snapshot-metadata", "create", "authentication.k8s.io", "tokenreviews") {
		t.Errorf("%s's sidecar lost its RBAC", helmNS)
	}
	k.Helm(t, "uninstall", "rsm", "-n", helmNS)
	if out, err := k.KubectlErr(t, "get", "snapshotmetadataservice", "rbd.csi.ceph.com"); err == nil || !bytes.Contains([]byte(out), []byte("NotFound")) {
		t.Errorf("the CR is left after uninstall: %v", err)
	}
}
