//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// csiServer is the real server binary (RSM_SERVER_BIN), serving on a socket
// of its own with the cluster's csi-config.json.
type csiServer struct {
	cl      *client.Client
	secrets map[string]string

	cmd    *exec.Cmd        // the server, or a wrapper that runs it (the image's entrypoint)
	exited chan struct{}    // closed once cmd ended
	log    *csiLockedBuffer // its stdout and stderr
}

// csiLockedBuffer collects the server's log.
type csiLockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *csiLockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *csiLockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func csiStartServer(t *testing.T) *csiServer {
	t.Helper()
	bin := harness.ClusterEnv(t, "RSM_SERVER_BIN")
	cfg := harness.ClusterEnv(t, "RSM_CLUSTER_DIR") + "/csi-config.json"
	dir, err := os.MkdirTemp("", "rsm-csi-") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := dir + "/sm.sock"
	var log csiLockedBuffer
	cmd := exec.Command(bin, "--endpoint", "unix://"+sock, "--clusterconfig", cfg)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("server did not stop within 10 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("server log:\n%s", log.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("server exited before listening:\n%s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not listen on %s within 10 s:\n%s", sock, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &csiServer{
		cl: client.New(conn),
		secrets: map[string]string{
			"userID":  harness.ClusterEnv(t, "CEPH_CSI_USER"),
			"userKey": harness.ClusterEnv(t, "CEPH_CSI_KEY"),
		},
		cmd: cmd, exited: exited, log: &log,
	}
}

// csiAnswer is one whole stream: the capacity and every tuple.
type csiAnswer struct {
	capacity int64
	extents  []client.Extent
}

// query streams the allocated (base "") or changed blocks from start.
func (s *csiServer) query(t *testing.T, base, target string, start int64) (csiAnswer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var a csiAnswer
	_, err := s.cl.Stream(ctx, client.Request{Base: base, Target: target, StartingOffset: start, Secrets: s.secrets},
		func(p client.Page) error {
			a.capacity = p.Capacity
			a.extents = append(a.extents, p.Extents...)
			return nil
		})
	return a, err
}

func (s *csiServer) mustQuery(t *testing.T, base, target string, start int64) csiAnswer {
	t.Helper()
	a, err := s.query(t, base, target, start)
	if err != nil {
		t.Fatalf("query base=%q target=%q from %d: %v", base, target, start, err)
	}
	return a
}

// wantCode checks that a query fails with code, and its message names want.
func (s *csiServer) wantCode(t *testing.T, base, target string, code codes.Code, want string) {
	t.Helper()
	a, err := s.query(t, base, target, 0)
	if err == nil {
		t.Fatalf("query base=%q target=%q succeeded with %d extents; want %v", base, target, len(a.extents), code)
	}
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), want) {
		t.Fatalf("query base=%q target=%q: %v; want %v mentioning %q", base, target, err, code, want)
	}
}

// csiCovered reports whether [off, end) lies within the union of extents,
// which are sorted and do not overlap.
func csiCovered(extents []client.Extent, off, end int64) bool {
	i := sort.Search(len(extents), func(i int) bool { return extents[i].Offset+extents[i].Length > off })
	for ; i < len(extents) && off < end; i++ {
		e := extents[i]
		if e.Offset > off {
			return false
		}
		off = e.Offset + e.Length
	}
	return off >= end
}

// csiCheckOracle is the byte-level oracle: before and after are a volume's data
// as the user sees it (after the LUKS header), before nil for allocated
// blocks. Every 4 KiB block at or after start that differs (delta) or holds
// a non-zero byte (allocated) must be covered by the answer, from its first
// to its last such byte; the answer must have the volume's capacity, and
// lie within [start, capacity).
func csiCheckOracle(t *testing.T, what string, a csiAnswer, before, after []byte, start int64) {
	t.Helper()
	if a.capacity != int64(len(after)) {
		t.Errorf("%s: capacity %d, want %d", what, a.capacity, len(after))
	}
	var prevEnd int64
	for i, e := range a.extents {
		if e.Length <= 0 || e.Offset < start || e.Offset < prevEnd || e.Offset+e.Length > int64(len(after)) {
			t.Fatalf("%s: extent #%d %+v out of order or outside [%d, %d)", what, i, e, start, len(after))
		}
		prevEnd = e.Offset + e.Length
	}
	var zero [harness.CSIBlock]byte
	missed, blocks := 0, 0
	for off := start - start%harness.CSIBlock; off < int64(len(after)); off += harness.CSIBlock {
		end := min(off+harness.CSIBlock, int64(len(after)))
		blk := after[off:end]
		var ref []byte
		if before != nil {
			ref = before[off:end]
		} else {
			ref = zero[:end-off]
		}
		if bytes.Equal(blk, ref) {
			continue
		}
		first, last := off, end-1
		for first < end && after[first] == ref[first-off] {
			first++
		}
		for last > first && after[last] == ref[last-off] {
			last--
		}
		first = max(first, start)
		if first > last {
			continue
		}
		blocks++
		if !csiCovered(a.extents, first, last+1) {
			if missed < 5 {
				t.Errorf("%s: bytes [%d, %d] differ but are not reported", what, first, last)
			}
			missed++
		}
	}
	if missed > 0 {
		t.Fatalf("%s: %d of %d changed blocks not reported; answer: %v", what, missed, blocks, a.extents)
	}
	if blocks == 0 {
		t.Fatalf("%s: the oracle found no data at all: a fixture is broken", what)
	}
	if len(a.extents) <= 8 {
		t.Logf("%s: %v cover all %d blocks with data or changes", what, a.extents, blocks)
	} else {
		t.Logf("%s: %d extents cover all %d blocks with data or changes", what, len(a.extents), blocks)
	}
}

// csiCheckTouched bounds a delta from above: every extent must lie in RADOS
// objects that the writes (image offsets) touched.
func csiCheckTouched(t *testing.T, what string, a csiAnswer, header uint64, writes [][2]uint64) {
	t.Helper()
	touched := map[uint64]bool{}
	for _, w := range writes {
		for o := w[0] / harness.ObjSize; o <= (w[0]+w[1]-1)/harness.ObjSize; o++ {
			touched[o] = true
		}
	}
	for _, e := range a.extents {
		raw := header + uint64(e.Offset)
		for o := raw / harness.ObjSize; o <= (raw+uint64(e.Length)-1)/harness.ObjSize; o++ {
			if !touched[o] {
				t.Fatalf("%s: extent %+v is in object %d, which no write touched", what, e, o)
			}
		}
	}
}

// TestCSISnapshotHandles runs the server against snapshots laid out exactly
// as Ceph-CSI makes them, in the default RADOS namespace (cluster ID
// rsm-e2e) and in namespace ns1 (rsm-e2e-ns1), and checks every answer
// against the data read back from the cluster.
func TestCSISnapshotHandles(t *testing.T) {
	srv := csiStartServer(t)
	conn := harness.ConnectAdmin(t)
	for _, cc := range []struct{ id, ns string }{{"rsm-e2e", ""}, {"rsm-e2e-ns1", harness.Namespace}} {
		t.Run(cc.id, func(t *testing.T) {
			t.Parallel()
			k := harness.NewCSICluster(t, conn, cc.id, cc.ns)
			t.Run("plain", func(t *testing.T) { csiTestPlain(t, srv, k) })
			t.Run("clone", func(t *testing.T) { csiTestClone(t, srv, k) })
			t.Run("flattened", func(t *testing.T) { csiTestFlattened(t, srv, k) })
			// Ceph-CSI 3.15+ records the header size; older ones do not.
			t.Run("encrypted", func(t *testing.T) {
				csiTestEncrypted(t, srv, k, &harness.CSILuks{Header: harness.CSILuksHeader, Meta: cc.ns == ""})
			})
			// A header of another size, recorded nowhere: only the LUKS2
			// header itself tells.
			t.Run("encrypted-8MiB-header", func(t *testing.T) { csiTestEncrypted(t, srv, k, &harness.CSILuks{Header: 8 * harness.MiB}) })
			t.Run("errors", func(t *testing.T) { csiTestErrors(t, srv, k) })
		})
	}
}

const csiVolSize = 32 * harness.MiB // 8 objects

// csiTestPlain: a volume with two snapshots and writes between them, by
// handle, and mixed with native IDs of the same image.
func csiTestPlain(t *testing.T, srv *csiServer, k *harness.CSICluster) {
	v := k.CreateVolume(t, csiVolSize, nil)
	for _, w := range [][2]uint64{{0, 4096}, {5*harness.MiB + 12288, 8192}, {9 * harness.MiB, 64 << 10}, {12 * harness.MiB, harness.ObjSize}, {20*harness.MiB + 7, 100}, {csiVolSize - 4096, 4096}} {
		v.Write(t, w[0], w[1])
	}
	n1 := v.NativeSnap(t, "n1")
	s1 := v.Snapshot(t)
	v.Write(t, 4096, 8192)                        // overwrite, and grow
	v.Write(t, 9*harness.MiB+1000, 50)            // small, unaligned
	v.Write(t, 16*harness.MiB-2048, 4096)         // across an object boundary
	v.Discard(t, 12*harness.MiB, harness.ObjSize) // a whole object discarded
	v.Write(t, 28*harness.MiB, 4096)              // a new object
	s2 := v.Snapshot(t)
	n2 := v.NativeSnap(t, "n2")
	v.Write(t, 24*harness.MiB, 4096) // the head moves on: no answer may see it
	d1, d2 := s1.Data(t), s2.Data(t)
	between := v.Writes[s1.Mark:s2.Mark]

	csiCheckOracle(t, "allocated s1", srv.mustQuery(t, "", s1.Handle(), 0), nil, d1, 0)
	csiCheckOracle(t, "allocated s2", srv.mustQuery(t, "", s2.Handle(), 0), nil, d2, 0)
	delta := srv.mustQuery(t, s1.Handle(), s2.Handle(), 0)
	csiCheckOracle(t, "delta s1..s2", delta, d1, d2, 0)
	csiCheckTouched(t, "delta s1..s2", delta, 0, between)
	from := srv.mustQuery(t, s1.Handle(), s2.Handle(), int64(9*harness.MiB+512))
	csiCheckOracle(t, "delta s1..s2 from 9 MiB+512", from, d1, d2, int64(9*harness.MiB+512))

	// Native IDs and handles of the same image mix.
	mixed := srv.mustQuery(t, n1, s2.Handle(), 0)
	csiCheckOracle(t, "delta native n1..handle s2", mixed, d1, d2, 0)
	csiCheckTouched(t, "delta native n1..handle s2", mixed, 0, between)
	mixed = srv.mustQuery(t, s1.Handle(), n2, 0)
	csiCheckOracle(t, "delta handle s1..native n2", mixed, d1, d2, 0)

	srv.wantCode(t, s2.Handle(), s1.Handle(), codes.InvalidArgument, "not older")
	srv.wantCode(t, n2, s1.Handle(), codes.InvalidArgument, "not older")

	// Snapshots of different volumes.
	w := k.CreateVolume(t, csiVolSize, nil)
	w.Write(t, 0, 4096)
	nw := w.NativeSnap(t, "nw")
	ws := w.Snapshot(t)
	srv.wantCode(t, s1.Handle(), ws.Handle(), codes.InvalidArgument, "different volumes")
	srv.wantCode(t, nw, s2.Handle(), codes.InvalidArgument, "different volumes")
}

// csiTestClone: a volume restored from a snapshot is itself a clone (of
// csi-snap-<uuid>@csi-snap-<uuid>, itself a clone of a trash snapshot);
// its snapshots' allocated blocks include the whole parent chain.
func csiTestClone(t *testing.T, srv *csiServer, k *harness.CSICluster) {
	a := k.CreateVolume(t, csiVolSize, nil)
	for _, w := range [][2]uint64{{0, 8192}, {6 * harness.MiB, 64 << 10}, {13*harness.MiB + 3, 5000}, {31 * harness.MiB, harness.MiB}} {
		a.Write(t, w[0], w[1])
	}
	sa := a.Snapshot(t)
	a.Write(t, 2*harness.MiB, 4096) // after the snapshot: not in the restored volume

	r := sa.Restore(t)
	r.Write(t, 1*harness.MiB, 4096)
	r.Write(t, 6*harness.MiB+4096, 4096) // inside data inherited from a
	t1 := r.Snapshot(t)
	r.Write(t, 1*harness.MiB+8192, 4096)
	r.Write(t, 13*harness.MiB, 4096) // overwrites inherited data
	r.Discard(t, 31*harness.MiB, harness.MiB)
	r.Write(t, 20*harness.MiB, 12288)
	t2 := r.Snapshot(t)
	d1, d2 := t1.Data(t), t2.Data(t)

	csiCheckOracle(t, "allocated t1 (with parent chain)", srv.mustQuery(t, "", t1.Handle(), 0), nil, d1, 0)
	csiCheckOracle(t, "allocated t2 (with parent chain)", srv.mustQuery(t, "", t2.Handle(), 0), nil, d2, 0)
	delta := srv.mustQuery(t, t1.Handle(), t2.Handle(), 0)
	csiCheckOracle(t, "delta t1..t2", delta, d1, d2, 0)
	csiCheckTouched(t, "delta t1..t2", delta, 0, r.Writes[t1.Mark:t2.Mark])

	// The restored volume and its source are different volumes.
	srv.wantCode(t, sa.Handle(), t2.Handle(), codes.InvalidArgument, "different volumes")
}

// csiTestFlattened: once Ceph-CSI flattened a snapshot's clone, the
// snapshot has no common history with its volume: deltas need a full
// backup, allocated blocks still work, from the clone itself.
func csiTestFlattened(t *testing.T, srv *csiServer, k *harness.CSICluster) {
	v := k.CreateVolume(t, csiVolSize, nil)
	v.Write(t, 0, 4096)
	v.Write(t, 7*harness.MiB, 2*harness.MiB)
	s1 := v.Snapshot(t)
	v.Write(t, 3*harness.MiB, 4096)
	v.Write(t, 30*harness.MiB+100, 200)
	s2 := v.Snapshot(t)
	d2 := s2.Data(t)
	s2.Flatten(t)
	v.Write(t, 17*harness.MiB, 4096)
	s3 := v.Snapshot(t)

	// The flattened clone's own snapshot still holds what s2 captured.
	clone := k.OpenImage(t, s2.Clone)
	if got := harness.CSIReadSnap(t, k.IOCtx, s2.Clone, harness.CSISnapID(t, clone, s2.Clone)); !bytes.Equal(got, d2) {
		t.Fatalf("flattened %s@%s differs from what the snapshot captured", s2.Clone, s2.Clone)
	}

	csiCheckOracle(t, "allocated flattened s2", srv.mustQuery(t, "", s2.Handle(), 0), nil, d2, 0)
	srv.wantCode(t, s1.Handle(), s2.Handle(), codes.FailedPrecondition, "full backup")
	srv.wantCode(t, s2.Handle(), s3.Handle(), codes.FailedPrecondition, "full backup")
	// The others are untouched.
	csiCheckOracle(t, "delta s1..s3 past a flattened s2", srv.mustQuery(t, s1.Handle(), s3.Handle(), 0), s1.Data(t), s3.Data(t), 0)
}

// csiTestEncrypted: a LUKS2-encrypted volume is reported as its user sees
// it, after the LUKS header; changes inside the header (a key rotation)
// are not reported.
func csiTestEncrypted(t *testing.T, srv *csiServer, k *harness.CSICluster, luks *harness.CSILuks) {
	v := k.CreateVolume(t, csiVolSize, luks)
	for _, w := range [][2]uint64{{0, 4096}, {3 * harness.MiB, 64 << 10}, {20*harness.MiB + 5, 3}, {csiVolSize - 4096, 4096}} {
		v.Write(t, w[0], w[1])
	}
	e1 := v.Snapshot(t)
	v.Write(t, 8192, 4096)
	v.Write(t, 10*harness.MiB, harness.ObjSize)
	v.WriteRaw(t, 5*harness.MiB, 4096) // the keyslots area changes: not user data
	v.Discard(t, 20*harness.MiB, harness.ObjSize)
	e2 := v.Snapshot(t)
	d1, d2 := v.User(e1.Data(t)), v.User(e2.Data(t))

	alloc := srv.mustQuery(t, "", e1.Handle(), 0)
	csiCheckOracle(t, "allocated e1", alloc, nil, d1, 0)
	if len(alloc.extents) == 0 || alloc.extents[0].Offset != 0 {
		t.Errorf("allocated e1: the write at user offset 0 is not the first extent: %v", alloc.extents)
	}
	csiCheckOracle(t, "allocated e2", srv.mustQuery(t, "", e2.Handle(), 0), nil, d2, 0)
	delta := srv.mustQuery(t, e1.Handle(), e2.Handle(), 0)
	csiCheckOracle(t, "delta e1..e2", delta, d1, d2, 0)
	csiCheckTouched(t, "delta e1..e2", delta, v.Header, v.Writes[e1.Mark:e2.Mark])
	from := srv.mustQuery(t, e1.Handle(), e2.Handle(), int64(10*harness.MiB+4096))
	csiCheckOracle(t, "delta e1..e2 from 10 MiB+4 KiB", from, d1, d2, int64(10*harness.MiB+4096))
	if end := srv.mustQuery(t, "", e2.Handle(), int64(len(d2))); len(end.extents) != 0 {
		t.Errorf("allocated e2 from its capacity: %v, want none", end.extents)
	}
}

// csiTestErrors: handles that name no snapshot.
func csiTestErrors(t *testing.T, srv *csiServer, k *harness.CSICluster) {
	v := k.CreateVolume(t, 8*harness.MiB, nil)
	v.Write(t, 0, 4096)
	s := v.Snapshot(t)
	srv.wantCode(t, "", v.Handle(), codes.NotFound, "names a volume")
	srv.wantCode(t, s.Handle(), v.Handle(), codes.NotFound, "names a volume")
	srv.wantCode(t, "", k.Handle(harness.CSIUUID(t)), codes.NotFound, "no Ceph-CSI snapshot")
	srv.wantCode(t, "", fmt.Sprintf("0001-%04x-%s-%016x-%s", len(k.ID), k.ID, int64(0x7fff0000), s.UUID), codes.NotFound, "pool ID")
	srv.wantCode(t, "", "0001-0007-no-such-0000000000000001-"+s.UUID, codes.NotFound, "no-such")
	h := s.Handle()
	srv.wantCode(t, "", h[:len(h)-1]+"g", codes.InvalidArgument, "uuid")
	srv.wantCode(t, "", "0001-0099-"+k.ID+fmt.Sprintf("-%016x-%s", k.PoolID, s.UUID), codes.InvalidArgument, "length")
}
