//go:build e2e

package e2e

// TestPods/cert-renewal: the chart's serving certificate renewed by a
// `helm upgrade` reaches every running sidecar, as deploy/README.md says:
// no restart, no new pod; each sidecar serves the new certificate once
// the kubelet has updated its mounted Secret; and backup clients, which
// trust the CR's unchanged caCert, are answered in full.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

// sidecarPort is the chart's sidecar.port, the container's gRPC port.
const sidecarPort = "50051"

// chartTLS is the chart's TLS material as the cluster holds it: the CR's
// caCert, the host its address names, and the serving certificate of the
// Secret (checked against both by tlsCheck).
type chartTLS struct {
	caCert string
	host   string
	leaf   *x509.Certificate
	roots  *x509.CertPool
}

func readChartTLS(t *testing.T, k *kube.Env, what string) chartTLS {
	t.Helper()
	var sms struct {
		Spec struct{ Address, CACert string }
	}
	k.GetJSON(t, &sms, "snapshotmetadataservice", "rbd.csi.ceph.com")
	host, _, err := net.SplitHostPort(sms.Spec.Address)
	if err != nil {
		t.Fatalf("the CR's address %q: %v", sms.Spec.Address, err)
	}
	var sec kobj
	k.GetJSON(t, &sec, "-n", podNS, "secret", "csi-rbdplugin-snapshot-metadata-tls")
	c := chartTLS{caCert: sms.Spec.CACert, host: host, leaf: tlsCheck(t, what, sec, sms.Spec.CACert, host)}
	ca, _ := base64.StdEncoding.DecodeString(sms.Spec.CACert)
	c.roots = x509.NewCertPool()
	c.roots.AppendCertsFromPEM(ca)
	return c
}

// served is the certificate that the sidecar at ip serves, verified with
// the CR's CA for its host, as a backup client's TLS handshake does.
func (c chartTLS) served(ip string) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(ip, sidecarPort),
		&tls.Config{RootCAs: c.roots, ServerName: c.host, NextProtos: []string{"h2"}})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

func certRenewal(t *testing.T, k *kube.Env, chart, sel string, da1, da2 []byte) {
	before := pods(t, k, podNS, sel)
	old := readChartTLS(t, k, "before the renewal")
	for _, p := range before {
		got, err := old.served(p.Status.PodIP)
		if err != nil {
			t.Fatalf("pod %s's sidecar: %v", p.Metadata.Name, err)
		}
		if !got.Equal(old.leaf) {
			t.Fatalf("pod %s's sidecar serves serial %s, the Secret holds %s", p.Metadata.Name, got.SerialNumber, old.leaf.SerialNumber)
		}
	}

	// renewDays beyond the certificate's whole validity: the upgrade
	// issues it again, as one within the last 30 days of 365 would be.
	t0 := time.Now()
	k.Helm(t, "upgrade", podRelease, chart, "-n", podNS, "--reuse-values", "--set", "tls.generate.renewDays=366")
	renewed := readChartTLS(t, k, "renewed")
	if renewed.leaf.Equal(old.leaf) {
		t.Fatalf("helm upgrade with renewDays=366 did not issue the certificate again (serial %s)", old.leaf.SerialNumber)
	}
	if renewed.caCert != old.caCert {
		t.Errorf("renewing the certificate changed the CR's caCert")
	}
	t.Logf("renewed: serial %s -> %s", old.leaf.SerialNumber, renewed.leaf.SerialNumber)
	// The kubelet updates a mounted Secret at its next sync of the pod
	// (about a minute), and the sidecar's certificate watcher then reloads
	// it; meanwhile the old certificate, from the same CA, still serves.
	for _, p := range before {
		var polls, failed int
		harness.WaitFor(t, fmt.Sprintf("pod %s's sidecar serving the renewed certificate", p.Metadata.Name), 4*time.Minute, func() bool {
			polls++
			got, err := renewed.served(p.Status.PodIP)
			if err != nil {
				failed++
				return false
			}
			return got.Equal(renewed.leaf)
		})
		t.Logf("pod %s: the renewed certificate served %.1fs after the upgrade began; %d handshakes before it, %d failed",
			p.Metadata.Name, time.Since(t0).Seconds(), polls-1, failed)
		if failed > 0 {
			t.Errorf("pod %s: %d TLS handshakes with the CR's CA failed during the renewal", p.Metadata.Name, failed)
		}
	}

	// The same pods, no container restarted.
	after := map[string]podInfo{}
	for _, p := range pods(t, k, podNS, sel) {
		after[p.Metadata.Name] = p
	}
	for _, p := range before {
		a, ok := after[p.Metadata.Name]
		if !ok {
			t.Errorf("pod %s is gone after the renewal: %v", p.Metadata.Name, podNames(pods(t, k, podNS, sel)))
			continue
		}
		if b, r := p.restarts(), a.restarts(); !maps.Equal(b, r) {
			t.Errorf("pod %s: restarts %v before the renewal, %v after", p.Metadata.Name, b, r)
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d pods after the renewal, %d before", len(after), len(before))
	}

	// A backup client, which trusts the CR's caCert, through the renewed
	// sidecars.
	clientDeltaMatches(t, k, "renewed-delta", "snap-", "backup client pod delta after the renewal", da1, da2)

	// Back to the chart's renewDays, so that later upgrades keep the
	// certificate.
	k.Helm(t, "upgrade", podRelease, chart, "-n", podNS, "--reuse-values", "--set", "tls.generate.renewDays=30")
	if again := readChartTLS(t, k, "after renewDays=30"); !again.leaf.Equal(renewed.leaf) {
		t.Errorf("an upgrade with the certificate far from its end issued it again")
	}
}
