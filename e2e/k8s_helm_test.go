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
	chart := filepath.Join(root, "helm", "rbd-snapshot-metadata")
	image := chartSet("image.repository="+chartImage, "image.tag=v0.1.0")

	t.Run("lint", func(t *testing.T) {
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
	})

	// ---- helm template and the kustomize examples, the same values.
	for _, c := range []struct {
		example, ns string
		values      []string
	}{
		{"ceph-csi-operator", "ceph-csi-operator-system", nil},
		{"rook", "rook-ceph", chartSet("driverName=rook-ceph.rbd.csi.ceph.com")},
	} {
		t.Run("same-as-kustomize/"+c.example, func(t *testing.T) {
			genCerts(t, root, c.example, c.ns)
			example := filepath.Join(root, "examples", c.example)
			built := k.Kubectl(t, "kustomize", example)
			caFile := filepath.Join(example, "certs", "ca.crt")
			host := "csi-rbdplugin-snapshot-metadata." + c.ns
			for _, mode := range []string{"generate", "secret"} {
				args := append([]string{"template", "rsm", chart, "-n", c.ns}, image...)
				args = append(args, c.values...)
				if mode == "secret" {
					args = append(args, "--set", "tls.mode=secret", "--set-file", "tls.caCert="+caFile)
				}
				got := objectsOf(t, k, k.Helm(t, args...))
				want := objectsOf(t, k, built)
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
				tlsKey := "Secret " + c.ns + "/csi-rbdplugin-snapshot-metadata-tls"
				caKey := "Secret " + c.ns + "/csi-rbdplugin-snapshot-metadata-ca-keypair"
				switch mode {
				case "generate":
					// The chart's own CA and certificate: valid for the
					// Service's name, and the CR trusts that CA.
					if got[caKey] == nil || got[tlsKey] == nil {
						t.Fatalf("generate: no %s or %s", caKey, tlsKey)
					}
					leaf := tlsCheck(t, "helm template", got[tlsKey], hs["spec"].(kobj)["caCert"].(string), host)
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
				t.Logf("%s, tls.mode=%s: %d objects alike", c.example, mode, len(got))
			}
		})
	}

	// ---- The cert-manager route: the same Issuer and Certificate as
	// examples/cert-manager for the same namespace.
	t.Run("same-as-kustomize/cert-manager", func(t *testing.T) {
		const ns = "ceph-csi-rbd"
		genCerts(t, root, "cert-manager", ns)
		example := filepath.Join(root, "examples", "cert-manager")
		kust := objectsOf(t, k, k.Kubectl(t, "kustomize", example))
		args := append([]string{"template", "rsm", chart, "-n", ns, "--set", "tls.mode=certManager",
			"--set-file", "tls.caCert=" + filepath.Join(example, "certs", "ca.crt")}, image...)
		got := objectsOf(t, k, k.Helm(t, args...))
		for _, key := range []string{"Issuer " + ns + "/csi-rbdplugin-snapshot-metadata-ca", "Certificate " + ns + "/csi-rbdplugin-snapshot-metadata", "SnapshotMetadataService /rbd.csi.ceph.com"} {
			h, w := got[key], kust[key]
			if h == nil || w == nil {
				t.Errorf("%s: helm %v, kustomize %v", key, h != nil, w != nil)
				continue
			}
			stripHelm(t, key, h, "rsm")
			for _, d := range diffObj(key, h, w) {
				t.Error(d)
			}
		}
		if got["Secret "+ns+"/csi-rbdplugin-snapshot-metadata-tls"] != nil {
			t.Error("tls.mode=certManager renders the Secret cert-manager writes")
		}
	})

	// ---- Install, upgrade, a second install, uninstall, on the API server.
	const ns, ns2 = "rsm-helm", "rsm-helm-2"
	host := "csi-rbdplugin-snapshot-metadata." + ns
	type state struct {
		rv         map[string]string
		tlsData    string
		caData     string
		caCert     string
		args       []string
		notAfter   string
		dnsNames   string
		leafSerial string
	}
	objs := []string{"-n", ns, "deployment,service,secret,serviceaccount,snapshotmetadataservice,clusterrole,clusterrolebinding"}
	read := func(t *testing.T) state {
		t.Helper()
		var s state
		s.rv = k.ResourceVersions(t, objs...)
		var sec, ca kobj
		k.GetJSON(t, &sec, "-n", ns, "secret", "csi-rbdplugin-snapshot-metadata-tls")
		k.GetJSON(t, &ca, "-n", ns, "secret", "csi-rbdplugin-snapshot-metadata-ca-keypair")
		var sms struct {
			Spec struct{ Address, CACert, Audience string }
		}
		k.GetJSON(t, &sms, "snapshotmetadataservice", "rbd.csi.ceph.com")
		if sms.Spec.Address != host+":6443" || sms.Spec.Audience != "rbd.csi.ceph.com" {
			t.Errorf("SnapshotMetadataService %+v", sms.Spec)
		}
		leaf := tlsCheck(t, "installed", sec, sms.Spec.CACert, host)
		s.leafSerial = leaf.SerialNumber.String()
		b, _ := json.Marshal(sec["data"])
		s.tlsData = string(b)
		b, _ = json.Marshal(ca["data"])
		s.caData = string(b)
		s.caCert = sms.Spec.CACert
		ann := sec["metadata"].(kobj)["annotations"].(kobj)
		s.notAfter, _ = ann["rbd-snapshot-metadata/not-after"].(string)
		s.dnsNames, _ = ann["rbd-snapshot-metadata/dns-names"].(string)
		d := deployment(t, k, ns, "rbd-snapshot-metadata")
		for _, c := range d.Spec.Template.Spec.Containers {
			s.args = append(s.args, c.Args...)
		}
		return s
	}
	changed := func(a, b map[string]string) []string {
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
	var first state
	t.Run("install", func(t *testing.T) {
		k.Kubectl(t, "create", "namespace", ns)
		k.Kubectl(t, "-n", ns, "create", "configmap", "ceph-csi-config", `--from-literal=config.json=[{"clusterID":"c1","monitors":["192.0.2.1:6789"]}]`)
		// deploy/README.md's Helm route.
		k.Helm(t, append([]string{"install", "rsm", chart, "-n", ns}, image...)...)
		first = read(t)
		if !slices.Contains(first.args, "--max-streaming-duration-min=120") || !slices.Contains(first.args, "--v=2") {
			t.Errorf("args %q", first.args)
		}
		for _, r := range [][3]string{
			{"create", "authentication.k8s.io", "tokenreviews"},
			{"create", "authorization.k8s.io", "subjectaccessreviews"},
			{"get", "", "secrets"},
			{"list", "cbt.storage.k8s.io", "snapshotmetadataservices"},
		} {
			if !k.Allowed(t, ns, "rbd-snapshot-metadata", r[0], r[1], r[2]) {
				t.Errorf("%s/rbd-snapshot-metadata may not %s %s.%s", ns, r[0], r[2], r[1])
			}
		}
		k.Helm(t, "status", "rsm", "-n", ns)
	})

	t.Run("upgrade", func(t *testing.T) {
		// A changed value: the Deployment changes, the certificate and CA stay.
		k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", ns}, image...), chartSet("server.logLevel=4")...)...)
		s := read(t)
		if !slices.Contains(s.args, "--v=4") {
			t.Errorf("after upgrade with server.logLevel=4: args %q", s.args)
		}
		if s.tlsData != first.tlsData || s.caData != first.caData || s.caCert != first.caCert {
			t.Errorf("an upgrade changed the certificate or the CA")
		}
		ch := changed(first.rv, s.rv)
		t.Logf("objects an upgrade with a changed value wrote: %v", ch)
		if !slices.Equal(ch, []string{"Deployment " + ns + "/rbd-snapshot-metadata"}) {
			t.Errorf("objects changed by the upgrade: %v, want only the Deployment", ch)
		}
		// The same values again: nothing is written.
		k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", ns}, image...), chartSet("server.logLevel=4")...)...)
		if again := read(t); len(changed(s.rv, again.rv)) != 0 {
			t.Errorf("an upgrade with the same values wrote %v", changed(s.rv, again.rv))
		}
		first = read(t)
	})

	t.Run("cert-renewal", func(t *testing.T) {
		// A certificate within renewDays of its end (here: renewDays beyond
		// its whole validity) is issued again at the next upgrade, from the
		// same CA: caCert stays, clients need nothing new.
		k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", ns, "--reuse-values"}, image...), chartSet("tls.generate.renewDays=366")...)...)
		s := read(t)
		if s.tlsData == first.tlsData || s.leafSerial == first.leafSerial {
			t.Errorf("the certificate was not issued again")
		}
		if s.caData != first.caData || s.caCert != first.caCert {
			t.Errorf("renewing the certificate changed the CA")
		}
		t.Logf("renewed: serial %s -> %s, not-after %s -> %s, CA kept; objects written: %v", first.leafSerial, s.leafSerial, first.notAfter, s.notAfter, changed(first.rv, s.rv))
		k.Helm(t, append(append([]string{"upgrade", "rsm", chart, "-n", ns, "--reuse-values"}, image...), chartSet("tls.generate.renewDays=30")...)...)
		first = read(t)
		if first.tlsData != s.tlsData {
			t.Errorf("an upgrade with the certificate far from its end issued it again")
		}

		// CA rotation: delete the CA's Secret and upgrade: a new CA, a new
		// certificate from it, and the CR's caCert, in one upgrade.
		k.Kubectl(t, "-n", ns, "delete", "secret", "csi-rbdplugin-snapshot-metadata-ca-keypair")
		k.Helm(t, append([]string{"upgrade", "rsm", chart, "-n", ns, "--reuse-values"}, image...)...)
		r := read(t)
		if r.caData == first.caData || r.caCert == first.caCert || r.tlsData == first.tlsData {
			t.Errorf("deleting the CA and upgrading did not rotate CA, caCert and certificate")
		}
		first = r
	})

	t.Run("second-namespace", func(t *testing.T) {
		k.Kubectl(t, "create", "namespace", ns2)
		k.Kubectl(t, "-n", ns2, "create", "configmap", "rook-ceph-csi-config", `--from-literal=csi-cluster-config-json=[{"clusterID":"c2","monitors":["192.0.2.2:6789"]}]`)
		// The same driver in another namespace: one SnapshotMetadataService
		// per driver, so Helm refuses to take the first release's CR.
		out, err := k.HelmErr(t, append([]string{"install", "rsm", chart, "-n", ns2}, image...)...)
		if err == nil || !strings.Contains(out, "SnapshotMetadataService") || !strings.Contains(out, "rbd.csi.ceph.com") {
			t.Errorf("a second release for driver rbd.csi.ceph.com: %v, want a refusal naming the SnapshotMetadataService", err)
		}
		if again := read(t); len(changed(first.rv, again.rv)) != 0 || again.caCert != first.caCert {
			t.Errorf("the refused install changed the first one: %v", changed(first.rv, again.rv))
		}
		// Another driver, older Rook's ConfigMap and key.
		k.Helm(t, append(append([]string{"install", "rsm", chart, "-n", ns2}, image...),
			chartSet("driverName="+ns2+".rbd.csi.ceph.com", "cephCSIConfig.configMapName=rook-ceph-csi-config", "cephCSIConfig.key=csi-cluster-config-json")...)...)
		d := deployment(t, k, ns2, "rbd-snapshot-metadata")
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == "ceph-csi-config" && (v.ConfigMap == nil || v.ConfigMap.Name != "rook-ceph-csi-config" || len(v.ConfigMap.Items) != 1 || v.ConfigMap.Items[0].Key != "csi-cluster-config-json" || v.ConfigMap.Items[0].Path != "config.json") {
				t.Errorf("ceph-csi-config volume %+v", v.ConfigMap)
			}
		}
		k.Kubectl(t, "get", "snapshotmetadataservice", ns2+".rbd.csi.ceph.com")
		for _, n := range []string{ns, ns2} {
			if !k.Allowed(t, n, "rbd-snapshot-metadata", "create", "authentication.k8s.io", "tokenreviews") {
				t.Errorf("%s's sidecar lost its RBAC", n)
			}
		}
	})

	t.Run("uninstall", func(t *testing.T) {
		k.Helm(t, "uninstall", "rsm", "-n", ns2)
		left := k.Kubectl(t, "get", "clusterrole,clusterrolebinding,snapshotmetadataservice", "-o", "name")
		for _, n := range []string{"rbd-snapshot-metadata:" + ns2 + ":sidecar", "rbd-snapshot-metadata:" + ns2 + ":client", ns2 + ".rbd.csi.ceph.com"} {
			if strings.Contains(left, n) {
				t.Errorf("%s is left after uninstall", n)
			}
		}
		for _, l := range strings.Split(k.Kubectl(t, "-n", ns2, "get", "deployment,service,secret,serviceaccount", "-o", "name"), "\n") {
			if strings.Contains(l, "/") {
				t.Errorf("left in %s after uninstall: %s", ns2, l)
			}
		}
		// The first install is whole.
		if again := read(t); len(changed(first.rv, again.rv)) != 0 {
			t.Errorf("uninstalling the second release changed the first: %v", changed(first.rv, again.rv))
		}
		if !k.Allowed(t, ns, "rbd-snapshot-metadata", "create", "authentication.k8s.io", "tokenreviews") {
			t.Errorf("%s's sidecar lost its RBAC", ns)
		}
		k.Helm(t, "uninstall", "rsm", "-n", ns)
		if out, err := k.KubectlErr(t, "get", "snapshotmetadataservice", "rbd.csi.ceph.com"); err == nil || !bytes.Contains([]byte(out), []byte("NotFound")) {
			t.Errorf("the CR is left after uninstall: %v", err)
		}
	})
	t.Logf("helm test: %.1fs", time.Since(t0).Seconds())
}
