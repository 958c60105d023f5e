//go:build e2e

package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// --------------------------------------------------------- kubectl, helm --

// Kubectl runs the real kubectl as admin; it fails the test on an error.
func (k *Env) Kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := k.KubectlErr(t, args...)
	return orFail(t, "kubectl", redacted(args), out, err)
}

// orFail is the output of a command that succeeded; it fails the test on
// an error.
func orFail(t *testing.T, name string, args []string, out string, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// KubectlErr runs the real kubectl as admin and returns its output and
// error.
func (k *Env) KubectlErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := k.kubectl(k.AdminKubeconfig(t), args...)
	t.Logf("$ kubectl %s\n%s", strings.Join(redacted(args), " "), strings.TrimRight(out, "\n"))
	return out, err
}

// kubectl runs the real kubectl with the kubeconfig cfg and returns its
// output and error, logging nothing.
func (k *Env) kubectl(cfg string, args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(k.Bin, "kubectl"), append([]string{"--kubeconfig", cfg}, args...)...).CombinedOutput()
	return string(out), err
}

// redacted is args as logged: the value of a --from-literal whose key
// names a key (Ceph-CSI's userKey) is replaced, as a user's secrets stay
// out of logs.
func redacted(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		lit, ok := strings.CutPrefix(a, "--from-literal=")
		if !ok {
			continue
		}
		if k, v, ok := strings.Cut(lit, "="); ok && v != "" && strings.Contains(strings.ToLower(k), "key") {
			out[i] = "--from-literal=" + k + "=(redacted)"
		}
	}
	return out
}

// KubectlQuiet runs kubectl as admin without logging (for polling).
func (k *Env) KubectlQuiet(args ...string) (string, error) {
	return k.kubectl(filepath.Join(k.Dir, "admin.kubeconfig"), args...)
}

// GetJSON decodes the JSON of kubectl get args into v. It logs the
// command, not the JSON: that of Secrets holds keys (the chart's TLS and
// CA keys, Ceph-CSI's userKey), which stay out of test logs as out of
// the server's.
func (k *Env) GetJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	args = append([]string{"get", "-o", "json"}, args...)
	out, err := k.kubectl(k.AdminKubeconfig(t), args...)
	t.Logf("$ kubectl %s (%d bytes of JSON, not logged)", strings.Join(args, " "), len(out))
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatal(err)
	}
}

// ResourceVersions are those of the objects kubectl get args lists, by
// "Kind namespace/name": a second run of an install must leave them as
// they are.
func (k *Env) ResourceVersions(t *testing.T, args ...string) map[string]string {
	t.Helper()
	var list struct {
		Items []struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name, Namespace, ResourceVersion string
			} `json:"metadata"`
		} `json:"items"`
	}
	k.GetJSON(t, &list, args...)
	m := map[string]string{}
	for _, it := range list.Items {
		m[it.Kind+" "+it.Metadata.Namespace+"/"+it.Metadata.Name] = it.Metadata.ResourceVersion
	}
	return m
}

// Allowed asks the API server whether the service account may do verb on
// resource (group/resource, group "" for the core API), as the RBAC
// authorizer answers a SubjectAccessReview for that account.
func (k *Env) Allowed(t *testing.T, ns, sa, verb, group, resource string) bool {
	t.Helper()
	p := filepath.Join(k.Dir, "sar.yaml")
	WriteFile(t, p, fmt.Sprintf(`apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec:
  user: system:serviceaccount:%s:%s
  groups: [system:serviceaccounts, "system:serviceaccounts:%s", system:authenticated]
  resourceAttributes: {verb: %s, group: %q, resource: %s, namespace: %s}
`, ns, sa, ns, verb, group, resource, ns))
	return strings.TrimSpace(k.Kubectl(t, "create", "-f", p, "-o", "jsonpath={.status.allowed}")) == "true"
}

// Helm runs the real helm against the test's API server as admin.
func (k *Env) Helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := k.HelmErr(t, args...)
	return orFail(t, "helm", args, out, err)
}

// HelmErr runs the real helm (RSM_HELM_BIN) as admin, with its homes in
// the test's folder, and returns its output and error.
func (k *Env) HelmErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := BuildDir(t, "RSM_HELM", "helm", "helm")
	cfg := k.AdminKubeconfig(t)
	home := filepath.Join(k.Dir, "helm-home")
	cmd := exec.Command(filepath.Join(bin, "helm"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cfg, "HELM_CACHE_HOME="+home+"/cache",
		"HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	s := strings.TrimRight(string(out), "\n")
	if len(s) > 1500 {
		s = s[:1500] + "\n[...]"
	}
	t.Logf("$ helm %s (%.1fs)\n%s", strings.Join(args, " "), time.Since(t0).Seconds(), s)
	return string(out), err
}

// --------------------------------------------------------------- sidecar --

// StartSidecar runs csi-snapshot-metadata in front of sock, as its
// ServiceAccount, on the gRPC and health ports given. It connects, then
// waits for our Probe to say ready, then checks our capabilities; only then
// is it healthy.
func (k *Env) StartSidecar(t *testing.T, name, sock string, grpcPort, healthPort int) *Proc {
	t.Helper()
	kc := k.SAKubeconfig(t, SidecarSA)
	return k.StartProcess(t, name, "csi-snapshot-metadata", "--kubeconfig="+kc, "--csi-address=unix://"+sock,
		"--tls-cert="+k.PKI.Path("sidecar.crt"), "--tls-key="+k.PKI.Path("sidecar.key"),
		// The gRPC port has no bind flag: it listens on all interfaces.
		// The HTTP endpoint defaults to :8080; keep it on 127.0.0.1.
		fmt.Sprintf("--port=%d", grpcPort), fmt.Sprintf("--http-endpoint=127.0.0.1:%d", healthPort),
		"--timeout=30s", "--v=5",
		// The cap on a stream's length, at its least (whole minutes):
		// TestK8sSidecar's stream-cap reaches it.
		"--max-streaming-duration-min=1")
}

// Healthy reports whether the sidecar's /health answers 200.
func Healthy(port int) bool {
	c := &http.Client{Timeout: 5 * time.Second}
	r, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == 200
}

// --------------------------------------------------------------- lister --

// Lister runs snapshot-metadata-lister as the ServiceAccount sa, with its
// own kubeconfig; it mints the audience-scoped token for the sidecar.
func (k *Env) Lister(t *testing.T, sa string, args ...string) (string, error) {
	t.Helper()
	return k.ListerAs(t, k.SAKubeconfig(t, sa), sa, args...)
}

// ListerAs runs the lister with kubeconfig, asking for a token of sa.
func (k *Env) ListerAs(t *testing.T, kubeconfig, sa string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append([]string{"-kubeconfig", kubeconfig, "-service-account", sa, "-service-account-namespace", NS, "-n", NS}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(k.Bin, "snapshot-metadata-lister"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t0 := time.Now()
	out, err := cmd.Output()
	t.Logf("lister %s: %.2fs, %d bytes, %v", strings.Join(args[8:], " "), time.Since(t0).Seconds(), len(out), err)
	return string(out) + stderr.String(), err
}

// Record is one record of the lister: one response message.
type Record struct {
	Capacity int64
	Tuples   []harness.Span
}

// ParseLister reads the lister's output, -o json (a list of records) or
// the table.
func ParseLister(t *testing.T, out string) []Record {
	t.Helper()
	s := strings.TrimSpace(out)
	var pages []Record
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
			p := Record{Capacity: r.Capacity}
			for _, b := range r.Blocks {
				p.Tuples = append(p.Tuples, harness.Span{Offset: b.Offset, Length: b.Size})
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
			pages = append(pages, Record{Capacity: capacity})
			rec = n
		}
		pages[len(pages)-1].Tuples = append(pages[len(pages)-1].Tuples, harness.Span{Offset: off, Length: size})
	}
	if len(pages) == 0 && s != "" {
		t.Fatalf("lister printed no tuples:\n%s", out)
	}
	return pages
}

// ----------------------------------------------------------------- hold --

// Hold (e2e/k8s/k8s.sh up) writes dir/env and waits while dir/hold exists,
// at most 2 h, so that one can run the lister by hand.
func (k *Env) Hold(t *testing.T) {
	backup := k.SAKubeconfig(t, BackupSA)
	env := fmt.Sprintf(`# e2e/k8s/k8s.sh down ends it
export RSM_K8S_BIN=%s
export KUBECONFIG=%s
export BACKUP_KUBECONFIG=%s
export ESM_NAMESPACE=%s ESM_GRPC=127.0.0.1:%d ESM_HEALTH=127.0.0.1:%d
# VolumeSnapshots snap-a1, snap-a2 (rsm-e2e), snap-b1, snap-b2 (rsm-e2e-ns1)
# logs: %s/logs
# $RSM_K8S_BIN/snapshot-metadata-lister -kubeconfig $BACKUP_KUBECONFIG -service-account %s -service-account-namespace %s -n %s -s snap-a2 -p snap-a1
`, k.Bin, k.Kubeconfig(t, "admin", ""), backup, NS, k.Ports.GRPC, k.Ports.Health, k.Dir, BackupSA, NS, NS)
	WriteFile(t, filepath.Join(k.Dir, "env.tmp"), env)
	if err := os.Rename(filepath.Join(k.Dir, "env.tmp"), filepath.Join(k.Dir, "env")); err != nil {
		t.Fatal(err)
	}
	t.Logf("holding until %s/hold is removed (e2e/k8s/k8s.sh down)", k.Dir)
	for t0 := time.Now(); time.Since(t0) < 2*time.Hour; time.Sleep(time.Second) {
		if _, err := os.Stat(filepath.Join(k.Dir, "hold")); err != nil {
			return
		}
	}
}
