//go:build e2e

package e2e

// TestK8sCSIOperator runs the real ceph-csi-operator (v1.0.4, its manager
// built by e2e/k8s/k8s.sh csi-operator) against the real kube-apiserver, once
// installed from its own all-in-one manifest with the objects of its quick
// start, once as Rook v1.20's quick start installs it (Rook's crds, common,
// csi-operator and operator manifests, and the CephConnection and
// ClientProfile Rook's operator writes), and once more from its quick start
// with our Helm chart instead of kustomize. Then it follows deploy/README.md's
// route for that installer as written (the shell blocks under the route's
// bullet, or under "## Our Helm chart" with its placeholders filled, run
// with bash; helm is the real one), makes the operator reconcile the Driver (a change
// to the Driver, then an operator restart), and checks statically what the
// operator wrote, since no kubelet runs a pod here:
//
//   - every container of every Deployment and DaemonSet the operator manages
//     and of ours mounts only volumes of its pod, and every Secret,
//     ConfigMap and ServiceAccount the pod refers to exists;
//   - a csi-snapshot-metadata sidecar (the one the operator injects into
//     <driver>-ctrlplugin, ours) finds its TLS files in a mounted Secret at
//     the paths its arguments name, and its --csi-address is a socket in a
//     volume it shares with a container that serves SnapshotMetadata there;
//   - the SnapshotMetadataService named after the driver leads, through our
//     Service, to a sidecar in front of OUR server, and its caCert verifies
//     that sidecar's certificate for the CR's host;
//   - the cluster config our server reads holds the monitors of the
//     operator's CephConnection.
//
// The Helm route then upgrades our release (helm upgrade --reuse-values,
// replicas and a memory limit changed), lets the operator reconcile again
// and checks it all again, and that the CR's caCert, our TLS Secret and the
// Driver's volumes stayed as they were.
//
// Before deploy/README.md gave the Driver its tls-key volume, the operator
// injected a sidecar without TLS files (it exits at start: the controller
// pods never become Ready); this test failed on that recipe.

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness/kube"
)

// csiOperatorBin is e2e/k8s/k8s.sh csi-operator's folder: manager,
// csi-operator/install.yaml, rook/*.yaml.
func csiOperatorBin(t *testing.T) string {
	t.Helper()
	return kube.BuildDir(t, "RSM_CSI_OPERATOR", "csi-operator", "manager", "csi-operator/install.yaml", "rook/operator.yaml", "rook/csi-operator.yaml")
}

// opRoute is one way a user has the operator: its manifests, what the user
// (or Rook's operator) creates, and which route of deploy/README.md to follow.
type opRoute struct {
	name        string
	manifests   []string // kubectl create -f, in this order
	ns          string   // the operator's (and the Driver's) namespace
	driver      string
	manager     string // the operator's Deployment (run here as a process instead)
	others      []string
	objects     string // what the user (or Rook) creates after the install
	clusterID   string // the ClientProfile's name
	monitors    []string
	readmeRoute string // the bullet of deploy/README.md: "- **<this>**", or a section: "## <this>"
	// fill: the README's placeholders and what a user puts there.
	fill map[string]string
	// helmUpgrade: values of a helm upgrade (--reuse-values) of our
	// release after the first check; then a reconcile and the check again.
	helmUpgrade []string
	// reapply: the manifest holding the Driver, applied again with kubectl
	// apply -f as an upgrade does; our volume must survive it.
	reapply string
}

func TestK8sCSIOperator(t *testing.T) {
	bin := csiOperatorBin(t)
	mons := []string{"192.0.2.10:6789", "192.0.2.11:6789"}
	routes := []opRoute{{
		// ceph-csi-operator's docs/quick-start.md: install.yaml, then the
		// RBD Driver, a CephConnection and a ClientProfile.
		name:      "ceph-csi-operator",
		manifests: []string{filepath.Join(bin, "csi-operator/install.yaml")},
		ns:        "ceph-csi-operator-system",
		driver:    "rbd.csi.ceph.com",
		manager:   "ceph-csi-operator-controller-manager",
		objects: `apiVersion: csi.ceph.io/v1
kind: Driver
metadata: {name: rbd.csi.ceph.com, namespace: ceph-csi-operator-system}
---
apiVersion: csi.ceph.io/v1
kind: CephConnection
metadata: {name: ceph-connection, namespace: ceph-csi-operator-system}
spec:
  monitors: [` + strings.Join(mons, ", ") + `]
---
apiVersion: csi.ceph.io/v1
kind: ClientProfile
metadata: {name: storage, namespace: ceph-csi-operator-system}
spec:
  cephConnectionRef: {name: ceph-connection}
  cephFs: {subVolumeGroup: csi}
`,
		clusterID:   "storage",
		monitors:    mons,
		readmeRoute: "ceph-csi-operator",
	}, {
		// Rook v1.20's quick start (kubectl create -f crds.yaml -f
		// common.yaml -f csi-operator.yaml -f operator.yaml): operator.yaml
		// holds the Driver CRs, the OperatorConfig and the image set. Rook's
		// operator then writes, for the CephCluster in rook-ceph, the
		// CephConnection and the default ClientProfile named after the
		// cluster's namespace (pkg/operator/ceph/csi/ceph_connection.go,
		// config.go), and the CSI secrets those name.
		name: "rook",
		manifests: []string{filepath.Join(bin, "rook/crds.yaml"), filepath.Join(bin, "rook/common.yaml"),
			filepath.Join(bin, "rook/csi-operator.yaml"), filepath.Join(bin, "rook/operator.yaml")},
		ns:      "rook-ceph",
		driver:  "rook-ceph.rbd.csi.ceph.com",
		manager: "ceph-csi-controller-manager",
		others:  []string{"rook-ceph-operator"},
		objects: `apiVersion: csi.ceph.io/v1
kind: CephConnection
metadata: {name: rook-ceph, namespace: rook-ceph}
spec:
  monitors: [` + strings.Join(mons, ", ") + `]
---
apiVersion: csi.ceph.io/v1
kind: ClientProfile
metadata: {name: rook-ceph, namespace: rook-ceph}
spec:
  cephConnectionRef: {name: rook-ceph}
  cephFs:
    cephCsiSecrets:
      controllerPublishSecret: {name: rook-csi-cephfs-provisioner, namespace: rook-ceph}
  rbd:
    cephCsiSecrets:
      controllerPublishSecret: {name: rook-csi-rbd-provisioner, namespace: rook-ceph}
---
apiVersion: v1
kind: Secret
metadata: {name: rook-csi-rbd-provisioner, namespace: rook-ceph}
stringData: {userID: csi-rbd-provisioner, userKey: AQDBWEdpAAAAABAAn7LrKEzaVYxsfp2YFI3QGQ==}
---
apiVersion: v1
kind: Secret
metadata: {name: rook-csi-rbd-node, namespace: rook-ceph}
stringData: {userID: csi-rbd-node, userKey: AQDBWEdpAAAAABAAn7LrKEzaVYxsfp2YFI3QGQ==}
`,
		clusterID:   "rook-ceph",
		monitors:    mons,
		readmeRoute: "Rook",
		reapply:     filepath.Join(bin, "rook/operator.yaml"),
	}}
	// The quick start again, with our chart instead of kustomize: deploy/README.md's
	// "Our Helm chart" block (helm install into the operator's namespace, the
	// Driver patch), then a helm upgrade with a changed value.
	helmRoute := routes[0]
	helmRoute.name = "ceph-csi-operator with our Helm chart"
	helmRoute.readmeRoute = "## Our Helm chart"
	helmRoute.fill = map[string]string{"<registry>/rbd-snapshot-metadata": chartImage, "<tag>": "v0.1.0"}
	helmRoute.helmUpgrade = []string{"replicas=3", "server.resources.limits.memory=768Mi"}
	routes = append(routes, helmRoute)
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) { testOperatorRoute(t, bin, r) })
	}
}

// testOperatorRoute follows route r from the operator's install to
// deploy/README.md's commands, and checks what the operator wrote, after a
// reconcile and after each upgrade the route has.
func testOperatorRoute(t *testing.T, bin string, r opRoute) {
	t0 := time.Now()
	k := kube.StartControlPlane(t)
	rr := &opRouteRun{k: k, r: r, bin: bin, tmp: t.TempDir()}

	// The operator's install, as its docs say; its manager runs here as a
	// process with the Deployment's arguments, environment and
	// ServiceAccount (so the manifest's RBAC is what it gets).
	rr.createManifests(t)
	rr.startManager(t)
	rr.createObjects(t)

	// deploy/README.md's route, as written.
	rr.followReadme(t)

	// The Driver's next reconcile: a change to it, then an operator restart.
	rr.reconcileAndCheck(t)
	rr.upgrades(t)
	t.Logf("%s: %.1fs", r.name, time.Since(t0).Seconds())
}

// opRouteRun is what testOperatorRoute's steps share: the control plane,
// the route, e2e/k8s/k8s.sh csi-operator's folder, a temporary folder, the
// operator's manager, its Driver's ctrlplugin and the repository's root.
type opRouteRun struct {
	k    *kube.Env
	r    opRoute
	bin  string
	tmp  string
	op   *csiOperator
	ctrl string
	root string
}

// createManifests: kubectl create -f of the route's manifests.
func (rr *opRouteRun) createManifests(t *testing.T) {
	// One file at a time, each file's CRDs established before the next
	// one's objects (Rook's operator.yaml holds Driver CRs).
	for _, m := range rr.r.manifests {
		rr.k.Kubectl(t, "create", "-f", m)
		rr.k.Kubectl(t, "wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
	}
}

// startManager: the operator's manager as a process, with its
// Deployment's arguments, environment and ServiceAccount; the
// Deployments themselves deleted.
func (rr *opRouteRun) startManager(t *testing.T) {
	k, r := rr.k, rr.r
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					ServiceAccountName string
					Containers         []struct {
						Name string
						Args []string
						Env  []struct{ Name, Value string }
					}
				}
			}
		}
	}
	k.GetJSON(t, &dep, "-n", r.ns, "deployment", r.manager)
	// No kube-controller-manager here: these Deployments never get pods.
	// Delete them so that nothing but the operator's own objects is left
	// to check.
	k.Kubectl(t, append([]string{"-n", r.ns, "delete", "deployment", r.manager}, r.others...)...)
	ps := dep.Spec.Template.Spec
	i := slices.IndexFunc(ps.Containers, func(c struct {
		Name string
		Args []string
		Env  []struct{ Name, Value string }
	}) bool {
		return c.Name == "manager"
	})
	if i < 0 {
		t.Fatalf("no manager container in %s", r.manager)
	}
	mc := ps.Containers[i]
	env := []string{"OPERATOR_NAMESPACE=" + r.ns, "KUBECONFIG=" + k.TokenKubeconfig(t, r.ns, ps.ServiceAccountName)}
	for _, e := range mc.Env {
		if e.Name != "OPERATOR_NAMESPACE" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	// Its arguments but --leader-elect: out of a pod, controller-runtime
	// finds no namespace for the lease and the manager exits; one manager
	// runs here at a time. Ports: the harness's, not the pod's.
	margs := slices.DeleteFunc(slices.Clone(mc.Args), func(a string) bool { return a == "--leader-elect" })
	margs = append(margs, "--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", k.Ports.Health))
	t.Logf("manager %v, env %v", margs, env[:1])
	rr.op = startOperator(t, k, rr.bin, margs, env)
}

// createObjects: the user's (or Rook's) objects; the operator then writes
// the Driver's ctrlplugin and nodeplugin and a ceph-csi-config naming the
// monitors.
func (rr *opRouteRun) createObjects(t *testing.T) {
	k, r := rr.k, rr.r
	k.Kubectl(t, "create", "-f", writeTmp(t, rr.tmp, "objects.yaml", r.objects))
	rr.ctrl = r.driver + "-ctrlplugin"
	harness.WaitFor(t, "the operator's "+rr.ctrl+" and nodeplugin", 3*time.Minute, func() bool {
		_, e1 := k.KubectlQuiet("-n", r.ns, "get", "deployment", rr.ctrl)
		_, e2 := k.KubectlQuiet("-n", r.ns, "get", "daemonset", r.driver+"-nodeplugin")
		out, e3 := k.KubectlQuiet("-n", r.ns, "get", "configmap", "ceph-csi-config", "-o", "jsonpath={.data.config\\.json}")
		return e1 == nil && e2 == nil && e3 == nil && strings.Contains(out, r.monitors[0])
	})
}

// followReadme runs the commands of the route's part of
// deploy/README.md, its placeholders filled, from the repository's root.
func (rr *opRouteRun) followReadme(t *testing.T) {
	k, r := rr.k, rr.r
	rr.root = filepath.Dir(deployTree(t))
	if r.helmUpgrade != nil {
		// helm built (RSM_HELM_BIN), or a failure that says why.
		k.Helm(t, "version", "--short")
	}
	for _, cmd := range readmeCommands(t, "../deploy/README.md", r.readmeRoute) {
		for p, v := range r.fill {
			cmd = strings.ReplaceAll(cmd, p, v)
		}
		if regexp.MustCompile(`<[a-z][^>]*>`).MatchString(cmd) {
			t.Fatalf("deploy/README.md's command has a placeholder the test does not fill: %s", cmd)
		}
		sh(t, k, rr.root, cmd)
	}
}

// reconcileAndCheck: a change to the Driver, then an operator restart,
// and once it is reconciled, what the operator wrote (checkOperatorWrote).
func (rr *opRouteRun) reconcileAndCheck(t *testing.T) {
	r := rr.r
	rr.op.touch(t, r)
	rr.op = rr.op.restart(t)
	rr.op.waitReconciled(t, r.driver, 0)
	rr.op.quiet(t, r.driver)

	report := checkOperatorWrote(t, rr.k, r)
	t.Logf("%s: what the operator wrote into %s:\n%s", r.name, rr.ctrl, report)
}

// upgrades: the route's upgrades, if it has any (the installer's manifest
// applied again, a helm upgrade of our release), each checked after.
func (rr *opRouteRun) upgrades(t *testing.T) {
	k, r := rr.k, rr.r
	if r.reapply != "" {
		// An upgrade of the installer's manifest, client-side as its docs
		// do, over the Driver our recipe patched; then a reconcile.
		k.Kubectl(t, "apply", "-f", r.reapply)
		rr.op.touch(t, r)
		checkOperatorWrote(t, k, r)
	}
	if r.helmUpgrade != nil {
		checkHelmUpgrade(t, k, r, rr.op, filepath.Join(rr.root, "deploy/helm/rbd-snapshot-metadata"))
	}
}

// checkHelmUpgrade upgrades our release with changed values (--reuse-values,
// as deploy/README.md upgrades), makes the operator reconcile the Driver
// (a change, then a restart), and checks again: the operator's ctrlplugin
// and nodeplugin and our objects whole, the upgrade's values in our
// Deployment, the CR's caCert and our sidecar's Secret kept.
func checkHelmUpgrade(t *testing.T, k *kube.Env, r opRoute, op *csiOperator, chart string) {
	t.Helper()
	type state struct {
		caCert, tlsRV, driverVols string
	}
	read := func() state {
		var s state
		var err error
		s.caCert, err = k.KubectlQuiet("get", "snapshotmetadataservice", r.driver, "-o", "jsonpath={.spec.caCert}")
		if err != nil {
			t.Fatalf("SnapshotMetadataService %s: %v: %s", r.driver, err, s.caCert)
		}
		s.tlsRV, err = k.KubectlQuiet("-n", r.ns, "get", "secret", "csi-rbdplugin-snapshot-metadata-tls", "-o", "jsonpath={.metadata.resourceVersion}")
		if err != nil {
			t.Fatalf("Secret csi-rbdplugin-snapshot-metadata-tls: %v: %s", err, s.tlsRV)
		}
		s.driverVols, _ = k.KubectlQuiet("-n", r.ns, "get", "driver", r.driver, "-o", "jsonpath={.spec.controllerPlugin.volumes}")
		return s
	}
	before := read()
	k.Helm(t, append([]string{"upgrade", "rbd-snapshot-metadata", chart, "-n", r.ns, "--reuse-values"}, chartSet(r.helmUpgrade...)...)...)
	if st := k.Helm(t, "status", "rbd-snapshot-metadata", "-n", r.ns, "-o", "json"); !strings.Contains(st, `"version":2`) || !strings.Contains(st, `"status":"deployed"`) {
		t.Errorf("after helm upgrade, the release is not revision 2, deployed: %.300s", st)
	}
	op.touch(t, r)
	op = op.restart(t)
	op.waitReconciled(t, r.driver, 0)
	op.quiet(t, r.driver)
	report := checkOperatorWrote(t, k, r)
	t.Logf("%s: after helm upgrade %v and a reconcile:\n%s", r.name, r.helmUpgrade, report)

	after := read()
	if after != before {
		t.Errorf("helm upgrade changed what the operator's sidecar and backup clients rely on:\nbefore %+v\nafter  %+v", before, after)
	}
	var d struct {
		Spec struct {
			Replicas int
			Template struct {
				Spec struct{ Containers []opContainerRes }
			}
		}
	}
	k.GetJSON(t, &d, "-n", r.ns, "deployment", "rbd-snapshot-metadata")
	want := map[string]string{}
	for _, v := range r.helmUpgrade {
		kv := strings.SplitN(v, "=", 2)
		want[kv[0]] = kv[1]
	}
	if w, ok := want["replicas"]; ok && strconv.Itoa(d.Spec.Replicas) != w {
		t.Errorf("our Deployment has %d replicas after helm upgrade --set replicas=%s", d.Spec.Replicas, w)
	}
	if w, ok := want["server.resources.limits.memory"]; ok {
		got := ""
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == "rbd-snapshot-metadata" {
				got = c.Resources.Limits["memory"]
			}
		}
		if got != w {
			t.Errorf("our server's memory limit is %q after helm upgrade --set server.resources.limits.memory=%s", got, w)
		}
	}
}

type opContainerRes struct {
	Name      string
	Resources struct{ Limits map[string]string }
}

// ------------------------------------------------------------ the manager --

type csiOperator struct {
	k    *kube.Env
	p    *kube.Proc
	bin  string
	args []string
	env  []string
	runs int
}

func startOperator(t *testing.T, k *kube.Env, bin string, args, env []string) *csiOperator {
	t.Helper()
	o := &csiOperator{k: k, bin: bin, args: args, env: env}
	o.start(t)
	return o
}

func (o *csiOperator) name() string { return fmt.Sprintf("ceph-csi-operator-%d", o.runs) }

func (o *csiOperator) start(t *testing.T) {
	t.Helper()
	o.runs++
	// kube.Proc runs bin with the test's environment; the operator's comes
	// from its Deployment.
	old := map[string]*string{}
	for _, e := range o.env {
		kv := strings.SplitN(e, "=", 2)
		if v, ok := os.LookupEnv(kv[0]); ok {
			old[kv[0]] = &v
		} else {
			old[kv[0]] = nil
		}
		os.Setenv(kv[0], kv[1])
	}
	o.p = o.k.StartProcess(t, o.name(), filepath.Join(o.bin, "manager"), o.args...)
	for k, v := range old {
		if v == nil {
			os.Unsetenv(k)
		} else {
			os.Setenv(k, *v)
		}
	}
}

// touch changes the Driver (an annotation) and waits for the reconcile it
// causes.
func (o *csiOperator) touch(t *testing.T, r opRoute) {
	t.Helper()
	n := o.quiet(t, r.driver)
	o.k.Kubectl(t, "-n", r.ns, "annotate", "--overwrite", "driver", r.driver, "rsm-e2e/touched="+strconv.FormatInt(time.Now().UnixNano(), 10))
	o.waitReconciled(t, r.driver, n)
	o.quiet(t, r.driver)
}

// reconciles counts the manager's successful reconciles of the Driver
// (its log line names the Driver).
func (o *csiOperator) reconciles(driver string) int {
	re := regexp.MustCompile(`CSI Driver reconciliation completed successfully.*"name": "` + regexp.QuoteMeta(driver) + `"`)
	return len(re.FindAllStringIndex(o.k.Log(o.name()), -1))
}

// quiet waits until the manager has not finished a reconcile of the Driver
// for 2 s (one in flight would count as the next), and returns the count.
func (o *csiOperator) quiet(t *testing.T, driver string) int {
	t.Helper()
	n, since := o.reconciles(driver), time.Now()
	harness.WaitFor(t, o.name()+": no reconcile of "+driver+" for 2 s", time.Minute, func() bool {
		if m := o.reconciles(driver); m != n {
			n, since = m, time.Now()
		}
		return time.Since(since) > 2*time.Second
	})
	return n
}

// waitReconciled waits for one more successful reconcile of the Driver
// than n.
func (o *csiOperator) waitReconciled(t *testing.T, driver string, n int) {
	t.Helper()
	harness.WaitFor(t, o.name()+": a reconcile of "+driver, 2*time.Minute, func() bool {
		if !o.p.Running() {
			t.Fatalf("%s exited: %v\n%s", o.name(), o.p.Err, harness.Tail(o.k.Log(o.name()), 30))
		}
		return o.reconciles(driver) > n
	})
}

// restart stops the manager (SIGTERM) and starts it again; it reconciles
// every Driver at start.
func (o *csiOperator) restart(t *testing.T) *csiOperator {
	t.Helper()
	o.p.MayExit = true
	_ = o.p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-o.p.Exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s still running 30 s after SIGTERM", o.name())
	}
	o.start(t)
	return o
}

// ---------------------------------------------------------- the README --

// readmeCommands: the shell blocks of deploy/README.md's bullet "- **route**"
// (up to the next bullet or section), or of its section "## Name" (up to
// the next heading), one command per element; a line ending in | or \
// continues.
func readmeCommands(t *testing.T, readme, route string) []string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	section := strings.HasPrefix(route, "## ")
	start := slices.IndexFunc(lines, func(l string) bool {
		if section {
			return strings.TrimSpace(l) == route
		}
		return strings.HasPrefix(l, "- **"+route+"**")
	})
	if start < 0 {
		t.Fatalf("%s has no bullet - **%s** (or section)", readme, route)
	}
	var cmds []string
	in := false
	cur := ""
	for _, l := range lines[start+1:] {
		s := strings.TrimSpace(l)
		if !in && ((!section && strings.HasPrefix(l, "- **")) || strings.HasPrefix(l, "#")) {
			break
		}
		if strings.HasPrefix(s, "```") {
			in = !in && s == "```sh"
			continue
		}
		if !in || s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		cur += s
		if strings.HasSuffix(s, "|") || strings.HasSuffix(s, `\`) {
			cur = strings.TrimSuffix(cur, `\`) + " "
			continue
		}
		cmds = append(cmds, cur)
		cur = ""
	}
	if len(cmds) == 0 {
		t.Fatalf("%s: no sh block under %s", readme, route)
	}
	return cmds
}

// sh runs one of the README's commands in dir (the checkout: deploy/ is
// there) with bash, kubectl (and helm, if built) on PATH as admin.
func sh(t *testing.T, k *kube.Env, dir, cmd string) {
	t.Helper()
	c := exec.Command("bash", "-euo", "pipefail", "-c", cmd)
	c.Dir = dir
	path := k.Bin + ":" + os.Getenv("PATH")
	if hb := os.Getenv("RSM_HELM_BIN"); hb != "" {
		path = hb + ":" + path
	}
	home := filepath.Join(k.Dir, "helm-home")
	c.Env = append(os.Environ(), "PATH="+path, "KUBECONFIG="+k.AdminKubeconfig(t), "HELM_CACHE_HOME="+home+"/cache",
		"HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := c.CombinedOutput()
	t.Logf("$ %s\n%s", cmd, strings.TrimRight(string(out), "\n"))
	if err != nil {
		t.Fatalf("deploy/README.md's command failed: %s: %v", cmd, err)
	}
}

func writeTmp(t *testing.T, dir, name, s string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	kube.WriteFile(t, p, s)
	return p
}

// ------------------------------------------------------------ the check --

type opVolume struct {
	Name   string `json:"name"`
	Secret *struct {
		SecretName string                       `json:"secretName"`
		Items      []struct{ Key, Path string } `json:"items"`
		Optional   *bool                        `json:"optional"`
	} `json:"secret"`
	ConfigMap *struct {
		Name     string                       `json:"name"`
		Items    []struct{ Key, Path string } `json:"items"`
		Optional *bool                        `json:"optional"`
	} `json:"configMap"`
	Projected *struct {
		Sources []struct {
			Secret *struct {
				Name     string `json:"name"`
				Optional *bool  `json:"optional"`
			} `json:"secret"`
			ConfigMap *struct {
				Name     string `json:"name"`
				Optional *bool  `json:"optional"`
			} `json:"configMap"`
		} `json:"sources"`
	} `json:"projected"`
}

type opMount struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	SubPath   string `json:"subPath"`
}

type opContainer struct {
	Name         string    `json:"name"`
	Image        string    `json:"image"`
	Args         []string  `json:"args"`
	VolumeMounts []opMount `json:"volumeMounts"`
	Ports        []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	Env []struct {
		Name      string `json:"name"`
		ValueFrom *struct {
			SecretKeyRef    *struct{ Name, Key string } `json:"secretKeyRef"`
			ConfigMapKeyRef *struct{ Name, Key string } `json:"configMapKeyRef"`
		} `json:"valueFrom"`
	} `json:"env"`
}

type opWorkload struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name            string                        `json:"name"`
		OwnerReferences []struct{ Kind, Name string } `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				ServiceAccountName string        `json:"serviceAccountName"`
				Containers         []opContainer `json:"containers"`
				InitContainers     []opContainer `json:"initContainers"`
				Volumes            []opVolume    `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

func argValue(args []string, flag string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

// mountFor: the container's mount that holds file p, and p inside it.
func mountFor(c opContainer, p string) (opMount, string, bool) {
	best, rel, ok := opMount{}, "", false
	for _, m := range c.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if r, found := strings.CutPrefix(p, mp+"/"); found && len(mp) >= len(strings.TrimSuffix(best.MountPath, "/")) {
			best, rel, ok = m, r, true
		}
	}
	return best, rel, ok
}

func socketPath(addr string) string { return strings.TrimPrefix(addr, "unix://") }

// checkOperatorWrote checks every Deployment and DaemonSet in the route's
// namespace (the operator's, and ours) and the SnapshotMetadataService; it
// returns the injected sidecar's args and mounts for the log.
func checkOperatorWrote(t *testing.T, k *kube.Env, r opRoute) string {
	t.Helper()
	ns := readOpNamespace(t, k, r.ns)
	var report strings.Builder
	managed := 0
	for _, w := range ns.workloads {
		owned := slices.ContainsFunc(w.Metadata.OwnerReferences, func(o struct{ Kind, Name string }) bool {
			return o.Kind == "Driver" && o.Name == r.driver
		})
		if owned {
			managed++
		}
		ns.checkWorkload(t, w, &report)
	}
	if managed < 2 {
		t.Errorf("the operator manages %d Deployments/DaemonSets for %s, want its ctrlplugin and nodeplugin", managed, r.driver)
	}
	checkSMSReachesUs(t, k, r, ns, &report)
	checkClusterConfigRead(t, r, ns, &report)
	return report.String()
}

// opNamespace is what a route's namespace holds: its Deployments and
// DaemonSets, and the Secrets, ConfigMaps (name to data) and
// ServiceAccounts they may refer to.
type opNamespace struct {
	workloads []opWorkload
	secrets   map[string]map[string]string
	cms       map[string]map[string]string
	sas       map[string]bool
}

// readOpNamespace reads namespace ns's workloads and what they refer to.
func readOpNamespace(t *testing.T, k *kube.Env, ns string) opNamespace {
	t.Helper()
	var list struct{ Items []opWorkload }
	k.GetJSON(t, &list, "-n", ns, "deployments,daemonsets")
	o := opNamespace{workloads: list.Items, secrets: map[string]map[string]string{},
		cms: map[string]map[string]string{}, sas: map[string]bool{}}
	var sl struct {
		Items []struct {
			Metadata struct{ Name string }
			Data     map[string]string
		}
	}
	k.GetJSON(t, &sl, "-n", ns, "secrets")
	for _, s := range sl.Items {
		o.secrets[s.Metadata.Name] = s.Data
	}
	var cl struct {
		Items []struct {
			Metadata struct{ Name string }
			Data     map[string]string
		}
	}
	k.GetJSON(t, &cl, "-n", ns, "configmaps")
	for _, c := range cl.Items {
		o.cms[c.Metadata.Name] = c.Data
	}
	var sal struct {
		Items []struct{ Metadata struct{ Name string } }
	}
	k.GetJSON(t, &sal, "-n", ns, "serviceaccounts")
	for _, s := range sal.Items {
		o.sas[s.Metadata.Name] = true
	}
	return o
}

// checkWorkload: everything workload w refers to exists (its
// ServiceAccount, its volumes' Secrets and ConfigMaps, its containers'
// volumes and env references), and each snapshot-metadata sidecar in it
// can start and reaches a server; the sidecars go in the report.
func (o opNamespace) checkWorkload(t *testing.T, w opWorkload, report *strings.Builder) {
	t.Helper()
	what := w.Kind + " " + w.Metadata.Name
	ps := w.Spec.Template.Spec
	vols := map[string]opVolume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	if sa := ps.ServiceAccountName; sa != "" && !o.sas[sa] {
		t.Errorf("%s: ServiceAccount %s does not exist", what, sa)
	}
	for _, v := range ps.Volumes {
		o.checkVolume(t, what, v)
	}
	for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
		for _, m := range c.VolumeMounts {
			if _, ok := vols[m.Name]; !ok {
				t.Errorf("%s: container %s mounts %s at %s: the pod has no such volume", what, c.Name, m.Name, m.MountPath)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				if _, ok := o.secrets[r.Name][r.Key]; !ok {
					t.Errorf("%s: container %s env %s: Secret %s key %s does not exist", what, c.Name, e.Name, r.Name, r.Key)
				}
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				if _, ok := o.cms[r.Name][r.Key]; !ok {
					t.Errorf("%s: container %s env %s: ConfigMap %s key %s does not exist", what, c.Name, e.Name, r.Name, r.Key)
				}
			}
		}
		if strings.Contains(c.Image, "csi-snapshot-metadata") {
			o.checkSidecar(t, what, c, ps.Containers, vols, report)
		}
	}
}

// checkVolume: the Secrets and ConfigMaps of volume v exist, unless
// optional.
func (o opNamespace) checkVolume(t *testing.T, what string, v opVolume) {
	t.Helper()
	switch {
	case v.Secret != nil:
		if _, ok := o.secrets[v.Secret.SecretName]; !ok && !ptrTrue(v.Secret.Optional) {
			t.Errorf("%s: volume %s: Secret %s does not exist", what, v.Name, v.Secret.SecretName)
		}
	case v.ConfigMap != nil:
		if _, ok := o.cms[v.ConfigMap.Name]; !ok && !ptrTrue(v.ConfigMap.Optional) {
			t.Errorf("%s: volume %s: ConfigMap %s does not exist", what, v.Name, v.ConfigMap.Name)
		}
	case v.Projected != nil:
		for _, s := range v.Projected.Sources {
			if s.Secret != nil && !ptrTrue(s.Secret.Optional) {
				if _, ok := o.secrets[s.Secret.Name]; !ok {
					t.Errorf("%s: volume %s: Secret %s does not exist", what, v.Name, s.Secret.Name)
				}
			}
			if s.ConfigMap != nil && !ptrTrue(s.ConfigMap.Optional) {
				if _, ok := o.cms[s.ConfigMap.Name]; !ok {
					t.Errorf("%s: volume %s: ConfigMap %s does not exist", what, v.Name, s.ConfigMap.Name)
				}
			}
		}
	}
}

// checkSidecar: snapshot-metadata sidecar c (of a pod with containers cs
// and volumes vols) has its certificate and key from a Secret that holds
// them, and a server on its --csi-address; it goes in the report.
func (o opNamespace) checkSidecar(t *testing.T, what string, c opContainer, cs []opContainer, vols map[string]opVolume, report *strings.Builder) {
	t.Helper()
	fmt.Fprintf(report, "  %s, container %s (%s)\n    args:", what, c.Name, c.Image)
	for _, a := range c.Args {
		fmt.Fprintf(report, " %s", a)
	}
	report.WriteString("\n    volumeMounts:")
	for _, m := range c.VolumeMounts {
		src := "?"
		if v, ok := vols[m.Name]; ok {
			src = volumeSource(v)
		}
		fmt.Fprintf(report, " %s→%s (%s)", m.Name, m.MountPath, src)
	}
	report.WriteString("\n")
	for _, f := range []string{"--tls-cert", "--tls-key"} {
		p, ok := argValue(c.Args, f)
		if !ok {
			t.Errorf("%s: sidecar %s has no %s", what, c.Name, f)
			continue
		}
		m, rel, ok := mountFor(c, p)
		if !ok {
			t.Errorf("%s: sidecar %s: %s=%s, but nothing is mounted there: the sidecar exits at start and the pod never becomes Ready", what, c.Name, f, p)
			continue
		}
		v := vols[m.Name]
		if v.Secret == nil {
			t.Errorf("%s: sidecar %s: %s=%s is in volume %s, not a Secret", what, c.Name, f, p, m.Name)
			continue
		}
		key := rel
		for _, it := range v.Secret.Items {
			if it.Path == rel {
				key = it.Key
			}
		}
		if _, ok := o.secrets[v.Secret.SecretName][key]; !ok {
			t.Errorf("%s: sidecar %s: %s=%s: Secret %s has no key %s", what, c.Name, f, p, v.Secret.SecretName, key)
		}
	}
	addr, ok := argValue(c.Args, "--csi-address")
	if !ok {
		t.Errorf("%s: sidecar %s has no --csi-address", what, c.Name)
		return
	}
	sock := socketPath(addr)
	m, _, ok := mountFor(c, sock)
	if !ok {
		t.Errorf("%s: sidecar %s: --csi-address=%s is in no mounted volume", what, c.Name, addr)
		return
	}
	server := snapshotMetadataServer(cs, m.Name, sock)
	if server == "" {
		t.Errorf("%s: sidecar %s: no container serves SnapshotMetadata on %s (volume %s)", what, c.Name, sock, m.Name)
	}
	fmt.Fprintf(report, "    %s is served by %s\n", sock, server)
}

// checkSMSReachesUs: the SnapshotMetadataService, named after the driver,
// leads through its Service to a sidecar in front of OUR server, whose
// certificate its caCert verifies.
func checkSMSReachesUs(t *testing.T, k *kube.Env, r opRoute, ns opNamespace, report *strings.Builder) {
	t.Helper()
	var sms struct {
		Spec struct{ Address, CACert, Audience string }
	}
	k.GetJSON(t, &sms, "snapshotmetadataservice", r.driver)
	hostPort := strings.SplitN(sms.Spec.Address, ":", 2)
	host := hostPort[0]
	svcNS := strings.SplitN(host+".", ".", 3)
	var svc struct {
		Spec struct {
			Selector map[string]string
			Ports    []struct {
				Port       int
				TargetPort any
			}
		}
	}
	if len(hostPort) != 2 || svcNS[1] == "" {
		t.Fatalf("SnapshotMetadataService %s: address %q is not <service>.<namespace>:<port>", r.driver, sms.Spec.Address)
	}
	k.GetJSON(t, &svc, "-n", svcNS[1], "service", svcNS[0])
	port, _ := strconv.Atoi(hostPort[1])
	var target any
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			target = p.TargetPort
		}
	}
	if target == nil {
		t.Fatalf("Service %s has no port %d", host, port)
	}
	var reached []string
	for _, w := range ns.workloads {
		pod := w.Spec.Template
		if svcNS[1] != r.ns || len(svc.Spec.Selector) == 0 || !selects(svc.Spec.Selector, pod.Metadata.Labels) {
			continue
		}
		for _, c := range pod.Spec.Containers {
			if !strings.Contains(c.Image, "csi-snapshot-metadata") || !servesPort(c, target) {
				continue
			}
			sock := socketPath(must1(argValue(c.Args, "--csi-address")))
			m, _, _ := mountFor(c, sock)
			server := snapshotMetadataServer(pod.Spec.Containers, m.Name, sock)
			reached = append(reached, fmt.Sprintf("%s %s: sidecar %s in front of %s", w.Kind, w.Metadata.Name, c.Name, server))
			if !strings.HasPrefix(server, "rbd-snapshot-metadata") {
				t.Errorf("SnapshotMetadataService %s reaches %s %s's sidecar in front of %q, not our server", r.driver, w.Kind, w.Metadata.Name, server)
			}
			ns.checkSidecarCert(t, r.driver, host, svcNS[0]+"."+svcNS[1], sms.Spec.CACert, c, pod.Spec.Volumes)
		}
	}
	if len(reached) == 0 {
		t.Errorf("SnapshotMetadataService %s (%s) reaches no snapshot-metadata sidecar", r.driver, sms.Spec.Address)
	}
	fmt.Fprintf(report, "  SnapshotMetadataService %s → %s → %s\n", r.driver, sms.Spec.Address, strings.Join(reached, "; "))
}

// checkSidecarCert: caCert (the CR's) verifies sidecar c's certificate,
// from a Secret volume of its pod, for svcHost (the Service's
// name.namespace; host is the CR's, for the message).
func (o opNamespace) checkSidecarCert(t *testing.T, driver, host, svcHost, caCert string, c opContainer, vols []opVolume) {
	t.Helper()
	cert, _ := argValue(c.Args, "--tls-cert")
	cm, rel, _ := mountFor(c, cert)
	var sec opVolume
	for _, v := range vols {
		if v.Name == cm.Name {
			sec = v
		}
	}
	if sec.Secret == nil {
		t.Errorf("our sidecar's certificate is not from a Secret")
		return
	}
	if err := verifyCert(caCert, o.secrets[sec.Secret.SecretName][rel], svcHost); err != nil {
		t.Errorf("SnapshotMetadataService %s: caCert does not verify the sidecar's certificate (Secret %s) for %s: %v",
			driver, sec.Secret.SecretName, host, err)
	}
}

// checkClusterConfigRead: the cluster config our server reads holds the
// operator's monitors for the route's clusterID.
func checkClusterConfigRead(t *testing.T, r opRoute, ns opNamespace, report *strings.Builder) {
	t.Helper()
	for _, w := range ns.workloads {
		for _, c := range w.Spec.Template.Spec.Containers {
			cfg, ok := argValue(c.Args, "--clusterconfig")
			if !ok || !strings.HasPrefix(c.Name, "rbd-snapshot-metadata") {
				continue
			}
			m, rel, ok := mountFor(c, cfg)
			var v opVolume
			for _, x := range w.Spec.Template.Spec.Volumes {
				if x.Name == m.Name {
					v = x
				}
			}
			if !ok || v.ConfigMap == nil {
				t.Errorf("%s: --clusterconfig=%s is not in a ConfigMap volume", w.Metadata.Name, cfg)
				continue
			}
			key := rel
			for _, it := range v.ConfigMap.Items {
				if it.Path == rel {
					key = it.Key
				}
			}
			var entries []struct {
				ClusterID string   `json:"clusterID"`
				Monitors  []string `json:"monitors"`
			}
			raw := ns.cms[v.ConfigMap.Name][key]
			if err := json.Unmarshal([]byte(raw), &entries); err != nil {
				t.Errorf("ConfigMap %s key %s: %v: %q", v.ConfigMap.Name, key, err, raw)
			}
			i := slices.IndexFunc(entries, func(e struct {
				ClusterID string   `json:"clusterID"`
				Monitors  []string `json:"monitors"`
			}) bool {
				return e.ClusterID == r.clusterID
			})
			if i < 0 || !sameSet(entries[i].Monitors, r.monitors) {
				t.Errorf("our server reads ConfigMap %s key %s: %s; want clusterID %s with the CephConnection's monitors %v",
					v.ConfigMap.Name, key, raw, r.clusterID, r.monitors)
			} else {
				fmt.Fprintf(report, "  our server reads ConfigMap %s key %s: clusterID %s, monitors %v\n", v.ConfigMap.Name, key, r.clusterID, entries[i].Monitors)
			}
		}
	}
}

func must1(s string, _ bool) string { return s }

func ptrTrue(b *bool) bool { return b != nil && *b }

func volumeSource(v opVolume) string {
	switch {
	case v.Secret != nil:
		return "Secret " + v.Secret.SecretName
	case v.ConfigMap != nil:
		return "ConfigMap " + v.ConfigMap.Name
	case v.Projected != nil:
		return "projected"
	}
	return "emptyDir/hostPath"
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func servesPort(c opContainer, target any) bool {
	for _, p := range c.Ports {
		switch tp := target.(type) {
		case float64:
			if p.ContainerPort == int(tp) {
				return true
			}
		case string:
			if p.Name == tp {
				return true
			}
		}
	}
	return false
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// cephCSIFirstSnapshotMetadata is the first Ceph-CSI release whose RBD
// controller serves SnapshotMetadata (ceph-csi PR #5347, merged 2025-05-30,
// after v3.14): the release ceph-csi-operator v1.0.4 and Rook v1.20.6 pin,
// v3.17.0, is later.
const cephCSIFirstSnapshotMetadata = "v3.15.0"

// snapshotMetadataServer names the container of the pod that serves
// SnapshotMetadata on sock in volume vol: ours (--endpoint), or Ceph-CSI's
// RBD controller (--endpoint, --type=rbd, --controllerserver=true) from a
// release that has it. "" if none.
func snapshotMetadataServer(cs []opContainer, vol, sock string) string {
	for _, c := range cs {
		ep, ok := argValue(c.Args, "--endpoint")
		if !ok || socketPath(ep) != sock {
			continue
		}
		m, _, ok := mountFor(c, sock)
		if !ok || m.Name != vol {
			continue
		}
		if strings.Contains(c.Image, "rbd-snapshot-metadata") {
			return "rbd-snapshot-metadata (ours, container " + c.Name + ")"
		}
		typ, _ := argValue(c.Args, "--type")
		cs, _ := argValue(c.Args, "--controllerserver")
		if i := strings.LastIndex(c.Image, ":"); i > 0 && strings.Contains(c.Image, "cephcsi/cephcsi") && typ == "rbd" && cs == "true" {
			if v := c.Image[i+1:]; semverAtLeast(v, cephCSIFirstSnapshotMetadata) {
				return "Ceph-CSI " + v + "'s own SnapshotMetadata (container " + c.Name + ")"
			}
		}
	}
	return ""
}

func semverAtLeast(v, min string) bool {
	parse := func(s string) []int {
		var out []int
		for _, p := range strings.SplitN(strings.TrimPrefix(strings.SplitN(s, "-", 2)[0], "v"), ".", 3) {
			n, err := strconv.Atoi(p)
			if err != nil {
				return nil
			}
			out = append(out, n)
		}
		return out
	}
	a, b := parse(v), parse(min)
	if len(a) != 3 || len(b) != 3 {
		return false
	}
	return slices.Compare(a, b) >= 0
}

// verifyCert: the base64 CA bundle (the CR's caCert) verifies the base64
// PEM certificate (a Secret's tls.crt) for host.
func verifyCert(caB64, certB64, host string) error {
	ca, err := base64.StdEncoding.DecodeString(caB64)
	if err != nil {
		return fmt.Errorf("caCert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("caCert holds no PEM certificate")
	}
	crt, err := base64.StdEncoding.DecodeString(certB64)
	if err != nil {
		return fmt.Errorf("tls.crt: %w", err)
	}
	blk, _ := pem.Decode(crt)
	if blk == nil {
		return fmt.Errorf("tls.crt is not PEM")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return err
	}
	_, err = c.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
	return err
}
