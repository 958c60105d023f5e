//go:build e2e

package e2e

// Precise mode on images whose data lives in an erasure-coded data pool
// (Ceph-CSI's dataPool StorageClass parameter): the header in the
// replicated pool rbd, the data objects in an EC pool, k=2 m=1 over 3 OSDs
// with failure domain osd and allow_ec_overwrites. The main test cluster
// has one OSD, so this test starts its own (15-25 s), and runs 3 seeds
// by default to keep the suite's time: 35-180 s in all with 4, as seeds and
// the machine's load vary.
//
//	./dev.sh e2e -run TestPreciseOracleECDataPool -v
//	RSM_E2E_SEEDS=40 ./dev.sh e2e -run TestPreciseOracleECDataPool
//	RSM_E2E_EC_COST=1 ./dev.sh e2e -run TestPreciseOracleECDataPool/cost -v

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/oracle"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// ecPool is the EC data pool of startECCluster's cluster.
const ecPool = "rbd-ec"

// startECCluster starts a cluster of 3 OSDs with the EC data pool ecPool
// on 127.0.0.1, its ports in 17500..18499 (with-cluster.sh's clusters use
// 16500..17499).
func startECCluster(t *testing.T) *harness.ExtraCluster {
	t.Helper()
	free := func(p int) bool {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
	for b := 17500; b < 18500; b += 100 {
		if free(b) && free(b+1) && free(b+10) {
			return harness.StartExtraCluster(t, "127.0.0.1", b, b, b+1, "RSM_CEPH_OSDS=3", "RSM_CEPH_EC_POOL="+ecPool, "RSM_CEPH_NAMESPACE=ns1")
		}
	}
	t.Fatal("no free port block on 127.0.0.1 among 17500..18400")
	return nil
}

// TestPreciseOracleECDataPool runs the random histories of
// TestPreciseOracle on images (and clones) with an EC data pool: every
// mode against the byte oracle, 0 missed bytes, and precise mode refining
// every object without a fallback, from checksums since the EC pool
// refuses mapext. Every other seed runs in RBD namespace ns1, whose data
// objects share that namespace in the data pool. With RSM_E2E_EC_COST set, subtest cost runs
// TestPreciseCost's images there too (about a minute more).
func TestPreciseOracleECDataPool(t *testing.T) {
	c := startECCluster(t)
	conn := harness.ConnectTo(t, c.Env["CEPH_MON_HOST"], c.Env["CEPH_USER"], c.Env["CEPH_KEY"])
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, "")
	nsIoctx := harness.OpenIOContext(t, conn, harness.Pool, harness.Namespace)
	srcs := oracle.SourcesIn(t, c.Dir)
	secrets := map[string]string{rsm.SecretUserID: c.Env["CEPH_USER"], rsm.SecretUserKey: c.Env["CEPH_KEY"]}
	tot := oracle.NewTotals()
	t.Run("cost", func(t *testing.T) {
		if os.Getenv("RSM_E2E_EC_COST") == "" {
			t.Skip("set RSM_E2E_EC_COST=1 to measure")
		}
		w := oracle.NewWorkload(t, ioctx, 7)
		w.DataPool, w.Secrets = ecPool, secrets
		oracle.Cost(t, w, srcs)
	})
	t.Run("reported", func(t *testing.T) {
		// The server binary names the checksum queries in the stream's
		// -v=2 line and in /metrics, and falls back nowhere.
		addr := harness.FreeTCPAddr(t)
		srv := harness.StartServer(t, "--clusterconfig", c.Dir+"/csi-config.json", "--metrics-address="+addr)
		srv.Hide = append(srv.Hide, c.Env["CEPH_KEY"], c.Env["CEPH_CSI_KEY"])
		name := harness.UniqueName(t, "precise-ec")
		p := oracle.NewCostImage(t, ioctx, name, 64*harness.MiB, ecPool)
		harness.WriteAt(t, p.Img, 5*harness.MiB, 64*oracle.KiB)
		harness.Snapshot(t, p.Img, "s1")
		harness.WriteAt(t, p.Img, 20*harness.MiB, 4*oracle.KiB)
		harness.Snapshot(t, p.Img, "s2")
		id := func(snap string) string { return "rsm-e2e/" + harness.Pool + "/" + p.Name + "@" + snap }
		m := srv.Get(t, harness.MetaReq{Base: id("s1"), Target: id("s2"), Secrets: secrets})
		if m.Err != nil {
			t.Fatal(m.Err)
		}
		var got []harness.Span
		for _, pg := range m.Pages {
			got = append(got, pg.Tuples...)
		}
		if want := []harness.Span{{Offset: 20 * int64(harness.MiB), Length: 4 * oracle.KiB}}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Delta: %v, want %v", got, want)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srv.Log(), `"Stream finished"`) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if log := srv.Log(); !strings.Contains(log, `checksummedQueries=`) || strings.Contains(log, `objectFallbacks=`) {
			t.Errorf("the -v=2 log lacks checksummedQueries or has fallbacks:\n%s", harness.Tail(log, 20))
		}
		body := harness.Scrape(t, addr)
		if v, ok := harness.MetricValue(body, `rbd_snapshot_metadata_precise_checksum_queries_total{method="GetMetadataDelta"}`); !ok || v < 1 {
			t.Errorf("/metrics: checksum queries %v (present %v), want at least 1", v, ok)
		}
		if strings.Contains(body, `rbd_snapshot_metadata_precise_fallbacks_total{`) {
			t.Errorf("/metrics: precise fallbacks:\n%s", body)
		}
	})
	t.Run("kinds", func(t *testing.T) {
		// The volume kinds whose data can sit in a data pool, for the
		// table of docs/precision.md, "Volume kinds".
		kinds := []preciseKind{
			{name: "EC data pool"},
			{name: "EC data pool, restored from a snapshot", chain: true, mid: harness.CSISnapFeatures},
		}
		testPreciseVolumeKinds(t, conn, srcs, kinds, func(w *oracle.Workload) { w.DataPool, w.Secrets = ecPool, secrets })
	})
	// After the seeds, which run two at a time (oracle.Parallel).
	t.Cleanup(func() {
		if tot.Checksummed == 0 {
			t.Errorf("precise mode refined no object from checksums: did the EC pool answer mapext?")
		}
		t.Log("\n" + tot.Table())
	})
	for i, seed := range oracle.SeedsOr(t, 3) {
		io, ns, cid := ioctx, "", "rsm-e2e"
		if i%2 == 1 {
			io, ns, cid = nsIoctx, harness.Namespace, harness.ClusterIDNS
		}
		t.Run(fmt.Sprintf("seed=%d%s", seed, map[bool]string{true: ",ns=" + ns}[ns != ""]), func(t *testing.T) {
			oracle.Parallel(t)
			w := oracle.NewWorkload(t, io, seed)
			w.DataPool, w.Secrets, w.ClusterID = ecPool, secrets, cid
			w.Run()
			for _, p := range w.Images {
				if f, err := p.Img.GetFeatures(); err != nil || f&rbd.FeatureDataPool == 0 {
					t.Fatalf("%s: features %#x, %v: want a data pool", p.Name, f, err)
				}
			}
			mine := oracle.NewTotals()
			w.Check(srcs, mine)
			tot.Add(mine)
			if t.Failed() {
				t.Logf("replay with RSM_E2E_SEED=%d; history:\n%s", seed, strings.Join(w.Log, "\n"))
			}
		})
	}
}
