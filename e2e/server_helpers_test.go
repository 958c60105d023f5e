//go:build e2e

package e2e

// Helpers for the tests of the server binary (RSM_SERVER_BIN): run it as a
// subprocess, call its two RPCs with the raw CSI client, check the spec's
// stream invariants, and the references it is judged against: `rbd diff`
// and the bytes of the snapshots themselves.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
)

// The cluster IDs of csi-config.json (cluster.sh): the pool's default RADOS
// namespace, and namespace ns1.
const (
	clusterID   = "rsm-e2e"
	clusterIDNS = "rsm-e2e-ns1"
)

// span is a byte range [Offset, Offset+Length) of a volume: a tuple of a
// stream, an extent of `rbd diff`, or a range of bytes that differ.
type span = client.Extent

func spanEnd(s span) int64 { return s.Offset + s.Length }

// ------------------------------------------------------------- the server --

// rsmServer is one rbd-snapshot-metadata process and a connection to it.
type rsmServer struct {
	tb      testing.TB
	flags   []string
	sock    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been waited for
	waitErr error

	conn *grpc.ClientConn
	sm   csi.SnapshotMetadataClient
	id   csi.IdentityClient
	// hide lists strings (keys) that must appear neither in the server's
	// log nor in any status message.
	hide []string
	// terminated is set once the test sent SIGTERM itself.
	terminated bool
}

// startServer runs RSM_SERVER_BIN on a unix socket in a temporary folder
// with the cluster's csi-config.json and -v=2, plus extraFlags (later flags
// win), waits until it serves, and connects to it. When the test ends, it
// sends SIGTERM and checks that the server exits with 0, removes its socket
// and never logged a key; the log is printed when the test failed.
func startServer(t testing.TB, extraFlags ...string) *rsmServer {
	t.Helper()
	bin := clusterEnv(t, "RSM_SERVER_BIN")
	config := filepath.Join(clusterEnv(t, "RSM_CLUSTER_DIR"), "csi-config.json")
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	if len(sock) > 100 { // sun_path holds 108 bytes; long test names make long temp dirs
		short, err := os.MkdirTemp("", "rsm-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		sock = filepath.Join(short, "csi.sock")
	}
	s := &rsmServer{
		tb:      t,
		sock:    sock,
		logPath: filepath.Join(dir, "server.log"),
		exited:  make(chan struct{}),
		hide:    []string{clusterEnv(t, "CEPH_CSI_KEY"), clusterEnv(t, "CEPH_KEY")},
	}
	s.flags = append([]string{
		"--endpoint", "unix://" + sock,
		"--clusterconfig", config,
		"-v=2",
		// Every stream of a test is over when it stops the server.
		"--grace-period=5s",
	}, extraFlags...)
	logf, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(bin, s.flags...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		logf.Close()
		close(s.exited)
	}()
	t.Cleanup(s.stop)

	deadline := time.Now().Add(20 * time.Second)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		select {
		case <-s.exited:
			t.Fatalf("server %v exited before serving: %v", s.flags, s.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %v: no socket %s after 20 s", s.flags, sock)
		}
	}
	s.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("connect to %s: %v", sock, err)
	}
	s.sm = csi.NewSnapshotMetadataClient(s.conn)
	s.id = csi.NewIdentityClient(s.conn)
	// The socket file exists from bind(2), a moment before listen(2): a
	// connect in between is refused, so the first call waits for the
	// connection (10 s at most) rather than fail at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.id.Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Probe %s: %v", sock, err)
	}
	return s
}

// serverHasPrecision reports whether the server binary knows
// --precision=mode (its -help lists the modes).
func serverHasPrecision(t testing.TB, mode string) bool {
	t.Helper()
	out, _ := exec.Command(clusterEnv(t, "RSM_SERVER_BIN"), "-help").CombinedOutput()
	return strings.Contains(string(out), mode+":")
}

// pid is the server's process ID.
func (s *rsmServer) pid() int { return s.cmd.Process.Pid }

// running reports whether the server process is still there.
func (s *rsmServer) running() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// log returns what the server logged so far.
func (s *rsmServer) log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		s.tb.Errorf("read the server log: %v", err)
	}
	return string(b)
}

// sigterm sends SIGTERM to the server, as Kubernetes does to stop a pod.
func (s *rsmServer) sigterm(t testing.TB) {
	t.Helper()
	s.terminated = true
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM the server: %v", err)
	}
}

// wait waits up to timeout for the server to exit and returns how it
// exited; ok is false when it is still running.
func (s *rsmServer) wait(timeout time.Duration) (err error, ok bool) {
	select {
	case <-s.exited:
		return s.waitErr, true
	case <-time.After(timeout):
		return nil, false
	}
}

// stop is startServer's cleanup.
func (s *rsmServer) stop() {
	t := s.tb
	t.Helper()
	if s.conn != nil {
		s.conn.Close()
	}
	switch {
	case s.running() && !s.terminated:
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("SIGTERM the server: %v", err)
		}
	case !s.running() && !s.terminated:
		t.Errorf("server %v exited before the test ended: %v", s.flags, s.waitErr)
	}
	select {
	case <-s.exited:
		if s.waitErr != nil {
			t.Errorf("server %v: exit after SIGTERM: %v, want exit status 0", s.flags, s.waitErr)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("server %v: still running 20 s after SIGTERM; killing it", s.flags)
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	if _, err := os.Lstat(s.sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server left its socket %s behind (%v)", s.sock, err)
	}
	log := s.log()
	for _, h := range s.hide {
		if h != "" && strings.Contains(log, h) {
			t.Errorf("the server log %s contains a cephx key", s.logPath)
		}
	}
	if t.Failed() {
		t.Logf("server %v log:\n%s", s.flags, tail(log, 300))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines]\n", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "")
}

// csiSecrets are the request secrets of the Ceph-CSI-like user client.csi.
func csiSecrets(t testing.TB) map[string]string {
	t.Helper()
	return map[string]string{"userID": clusterEnv(t, "CEPH_CSI_USER"), "userKey": clusterEnv(t, "CEPH_CSI_KEY")}
}

// ---------------------------------------------------------- calling it --

// metaReq is a request of either RPC: GetMetadataAllocated when base is
// empty, else GetMetadataDelta.
type metaReq struct {
	base, target string
	start        int64
	max          int32
	secrets      map[string]string
}

func (r metaReq) String() string {
	if r.base == "" {
		return fmt.Sprintf("Allocated(%s, start %d, max %d)", r.target, r.start, r.max)
	}
	return fmt.Sprintf("Delta(%s, %s, start %d, max %d)", r.base, r.target, r.start, r.max)
}

// page is one response message.
type page struct {
	typ      csi.BlockMetadataType
	capacity int64
	tuples   []span
}

// metaStream is everything one call returned: its pages, and the error that
// ended it (nil for a stream that ended with OK).
type metaStream struct {
	pages []page
	err   error
}

// tuples returns the tuples of all pages, in order.
func (m metaStream) tuples() []span {
	var all []span
	for _, p := range m.pages {
		all = append(all, p.tuples...)
	}
	return all
}

// capacity returns the capacity of the first page, -1 without pages.
func (m metaStream) capacity() int64 {
	if len(m.pages) == 0 {
		return -1
	}
	return m.pages[0].capacity
}

// response is what the messages of both RPCs have in common.
type metaResponse interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}

// open starts the RPC of r; recv then returns its messages.
func (s *rsmServer) open(ctx context.Context, r metaReq) (recv func() (metaResponse, error), err error) {
	if r.base == "" {
		st, err := s.sm.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{
			SnapshotId: r.target, StartingOffset: r.start, MaxResults: r.max, Secrets: r.secrets})
		if err != nil {
			return nil, err
		}
		return func() (metaResponse, error) { return st.Recv() }, nil
	}
	st, err := s.sm.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{
		BaseSnapshotId: r.base, TargetSnapshotId: r.target, StartingOffset: r.start, MaxResults: r.max, Secrets: r.secrets})
	if err != nil {
		return nil, err
	}
	return func() (metaResponse, error) { return st.Recv() }, nil
}

func toPage(m metaResponse) page {
	p := page{typ: m.GetBlockMetadataType(), capacity: m.GetVolumeCapacityBytes()}
	for _, b := range m.GetBlockMetadata() {
		p.tuples = append(p.tuples, span{Offset: b.GetByteOffset(), Length: b.GetSizeBytes()})
	}
	return p
}

// call runs one RPC to its end and returns what it streamed.
func (s *rsmServer) call(ctx context.Context, r metaReq) metaStream {
	var m metaStream
	recv, err := s.open(ctx, r)
	if err != nil {
		m.err = err
		return m
	}
	for {
		resp, err := recv()
		if err == io.EOF {
			return m
		}
		if err != nil {
			m.err = err
			return m
		}
		m.pages = append(m.pages, toPage(resp))
	}
}

// get runs r, which must succeed, checks the stream's invariants, and
// returns it.
func (s *rsmServer) get(t testing.TB, r metaReq) metaStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if r.secrets == nil {
		r.secrets = csiSecrets(t)
	}
	m := s.call(ctx, r)
	if m.err != nil {
		t.Fatalf("%v: %v", r, m.err)
	}
	checkStream(t, r, m, s.blockType(), s.fixedSize())
	return m
}

// blockType is the type the server was started with.
func (s *rsmServer) blockType() csi.BlockMetadataType {
	for i, f := range s.flags {
		if f == "--block-metadata-type" && i+1 < len(s.flags) {
			return csi.BlockMetadataType(csi.BlockMetadataType_value[s.flags[i+1]])
		}
	}
	return csi.BlockMetadataType_VARIABLE_LENGTH
}

// fixedSize is the FIXED_LENGTH tuple size the server was started with.
func (s *rsmServer) fixedSize() int64 {
	size := int64(1 << 20) // the flag's default
	for i, f := range s.flags {
		if f == "--fixed-block-size" && i+1 < len(s.flags) {
			if _, err := fmt.Sscan(s.flags[i+1], &size); err != nil {
				s.tb.Fatalf("--fixed-block-size %q: %v", s.flags[i+1], err)
			}
		}
	}
	return size
}

// pageSize is the number of tuples in every page but the last, as the
// driver documents it (driver.go: defaultPage, maxPage): max_results, or
// 16384 when it is 0, and never more than 65536, so that a page stays far
// below gRPC's 4 MiB message limit.
func pageSize(maxResults int32) int {
	if maxResults == 0 {
		return 16384
	}
	return min(int(maxResults), 65536)
}

// checkStream checks a successful stream against the CSI spec, and against
// the pager's documented contract (marked "contract"):
//   - every page has the type the server was started with, and one capacity;
//   - pages hold at most max_results tuples, and at least one (contract);
//     only the last page is shorter than pageSize (contract);
//   - tuples are positive, strictly ascending and never overlap, across pages;
//   - the first tuple ends after starting_offset, and none starts at or after
//     the capacity;
//   - FIXED_LENGTH: every tuple is `fixed` bytes, aligned to it (contract);
//   - VARIABLE_LENGTH: tuples lie within [starting_offset, capacity) and
//     adjacent ones are merged (contract).
func checkStream(t testing.TB, r metaReq, m metaStream, typ csi.BlockMetadataType, fixed int64) {
	t.Helper()
	var prev *span
	for i, p := range m.pages {
		if p.typ != typ {
			t.Errorf("%v: page %d has type %v, want %v", r, i, p.typ, typ)
		}
		if p.capacity != m.pages[0].capacity {
			t.Errorf("%v: page %d has capacity %d, page 0 %d", r, i, p.capacity, m.pages[0].capacity)
		}
		if r.max > 0 && len(p.tuples) > int(r.max) {
			t.Errorf("%v: page %d has %d tuples, more than max_results", r, i, len(p.tuples))
		}
		if len(p.tuples) == 0 {
			t.Errorf("%v: page %d is empty (contract)", r, i)
		}
		if i < len(m.pages)-1 && len(p.tuples) != pageSize(r.max) {
			t.Errorf("%v: page %d of %d has %d tuples, want %d; only the last may be short (contract)", r, i, len(m.pages), len(p.tuples), pageSize(r.max))
		}
		for j := range p.tuples {
			b := p.tuples[j]
			where := fmt.Sprintf("%v: page %d tuple %d %+v", r, i, j, b)
			if b.Length <= 0 || b.Offset < 0 {
				t.Fatalf("%s: size_bytes must be positive, byte_offset not negative", where)
			}
			if prev == nil && spanEnd(b) <= r.start {
				t.Errorf("%s: the first tuple ends at or before starting_offset %d", where, r.start)
			}
			if prev != nil && b.Offset < spanEnd(*prev) {
				t.Fatalf("%s: overlaps or precedes the tuple before, %+v", where, *prev)
			}
			if b.Offset >= p.capacity {
				t.Errorf("%s: starts at or after the capacity %d", where, p.capacity)
			}
			switch typ {
			case csi.BlockMetadataType_FIXED_LENGTH:
				if b.Length != fixed || b.Offset%fixed != 0 {
					t.Errorf("%s: want a %d-byte aligned block (contract)", where, fixed)
				}
			case csi.BlockMetadataType_VARIABLE_LENGTH:
				if b.Offset < r.start || spanEnd(b) > p.capacity {
					t.Errorf("%s: outside [starting_offset %d, capacity %d) (contract)", where, r.start, p.capacity)
				}
				if prev != nil && b.Offset == spanEnd(*prev) {
					t.Errorf("%s: touches the tuple before, %+v, without being merged (contract)", where, *prev)
				}
			}
			prev = &p.tuples[j]
		}
	}
}

// --------------------------------------------------------- span algebra --

// merge returns the union of spans as sorted, non-touching spans.
func mergeSpans(in []span) []span {
	s := append([]span(nil), in...)
	sort.Slice(s, func(i, j int) bool { return s[i].Offset < s[j].Offset })
	out := []span{}
	for _, e := range s {
		if e.Length <= 0 {
			continue
		}
		if n := len(out); n > 0 && e.Offset <= spanEnd(out[n-1]) {
			out[n-1].Length = max(spanEnd(out[n-1]), spanEnd(e)) - out[n-1].Offset
			continue
		}
		out = append(out, e)
	}
	return out
}

// clip returns the parts of spans within [lo, hi).
func clipSpans(in []span, lo, hi int64) []span {
	out := []span{}
	for _, e := range in {
		o, n := max(e.Offset, lo), min(spanEnd(e), hi)
		if o < n {
			out = append(out, span{Offset: o, Length: n - o})
		}
	}
	return out
}

// blocks returns the aligned blocks of the given size that spans touch,
// ascending, each once.
func roundOut(in []span, size int64) []span {
	out := []span{}
	for _, e := range mergeSpans(in) {
		b := e.Offset - e.Offset%size
		if n := len(out); n > 0 && b < spanEnd(out[n-1]) {
			b = spanEnd(out[n-1])
		}
		for ; b < spanEnd(e); b += size {
			out = append(out, span{Offset: b, Length: size})
		}
	}
	return out
}

// uncovered returns the parts of want that no span of have covers; have
// must be sorted and non-overlapping.
func uncovered(want, have []span) []span {
	var out []span
	for _, w := range mergeSpans(want) {
		off := w.Offset
		i := sort.Search(len(have), func(i int) bool { return spanEnd(have[i]) > off })
		for ; off < spanEnd(w) && i < len(have); i++ {
			h := have[i]
			if h.Offset > off {
				out = append(out, span{Offset: off, Length: min(h.Offset, spanEnd(w)) - off})
			}
			off = max(off, spanEnd(h))
		}
		if off < spanEnd(w) {
			out = append(out, span{Offset: off, Length: spanEnd(w) - off})
		}
	}
	return mergeSpans(out)
}

func totalBytes(in []span) int64 {
	var n int64
	for _, e := range in {
		n += e.Length
	}
	return n
}

// ------------------------------------------------------------ rbd diff --

// volume is an RBD image of a test, in the default namespace or in ns1.
type rbdVolume struct {
	ioctx *rados.IOContext
	ns    string
	name  string
}

// spec is the image spec of the rbd CLI: pool[/namespace]/image.
func (v rbdVolume) spec() string {
	if v.ns == "" {
		return pool + "/" + v.name
	}
	return pool + "/" + v.ns + "/" + v.name
}

// ids returns the native snapshot IDs that name v@snap: in ns1, both the
// cluster ID whose config sets the namespace and the ID that names it.
func (v rbdVolume) ids(snap string) []string {
	if v.ns == "" {
		return []string{clusterID + "/" + pool + "/" + v.name + "@" + snap}
	}
	if v.ns != namespace {
		panic("no cluster ID has namespace " + v.ns)
	}
	return []string{
		clusterIDNS + "/" + pool + "/" + v.name + "@" + snap,
		clusterID + "/" + pool + "/" + v.ns + "/" + v.name + "@" + snap,
	}
}

// id is the first of ids.
func (v rbdVolume) id(snap string) string { return v.ids(snap)[0] }

// rbdDiffOf returns `rbd diff [--from-snap from] SPEC@to --format json
// [--whole-object]`: with from empty, every extent of the snapshot (a
// clone's parent data included).
func rbdDiffOf(t testing.TB, v rbdVolume, from, to string, wholeObject bool) []extent {
	t.Helper()
	args := []string{"diff", v.spec() + "@" + to, "--format", "json"}
	if from != "" {
		args = append(args, "--from-snap", from)
	}
	if wholeObject {
		args = append(args, "--whole-object")
	}
	var raw []struct {
		Offset uint64 `json:"offset"`
		Length uint64 `json:"length"`
		Exists string `json:"exists"`
	}
	out := rbdCLI(t, args...)
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("rbd %s: bad JSON %q: %v", strings.Join(args, " "), out, err)
	}
	got := make([]extent, 0, len(raw))
	for _, e := range raw {
		got = append(got, extent{e.Offset, e.Length, e.Exists == "true"})
	}
	return got
}

// wantFromRbdDiff is what the server must stream, given `rbd diff`'s
// extents: all of them for a delta (a discarded object, exists=false, is a
// change), only those with data for allocated; merged, as VARIABLE_LENGTH
// merges adjacent extents.
func wantFromRbdDiff(ext []extent, delta bool) []span {
	var s []span
	for _, e := range ext {
		if delta || e.Exists {
			s = append(s, span{Offset: int64(e.Offset), Length: int64(e.Length)})
		}
	}
	return mergeSpans(s)
}

// ------------------------------------------------------ the byte oracle --

// oracleBlock is the granularity at which the oracle reads and reports.
const oracleBlock = 4096

// snapReader reads one snapshot of a volume through librbd.
type snapReader struct {
	img  *rbd.Image
	size int64
}

func openSnap(t testing.TB, v rbdVolume, snap string) *snapReader {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(v.ioctx, v.name, snap)
	if err != nil {
		t.Fatalf("open %s@%s: %v", v.spec(), snap, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	size, err := img.GetSize()
	if err != nil {
		t.Fatalf("size of %s@%s: %v", v.spec(), snap, err)
	}
	return &snapReader{img: img, size: int64(size)}
}

// readAt fills buf from off; bytes past the snapshot's end read as zeros.
func (r *snapReader) readAt(t testing.TB, buf []byte, off int64) {
	t.Helper()
	clear(buf)
	if off >= r.size {
		return
	}
	n := min(int64(len(buf)), r.size-off)
	got, err := r.img.ReadAt(buf[:n], off)
	if err != nil && !(errors.Is(err, io.EOF) && int64(got) == n) {
		t.Fatalf("read %d+%d of %s: n=%d, %v", off, n, r.img.GetName(), got, err)
	}
	if int64(got) != n {
		t.Fatalf("read %d+%d of %s: short read of %d bytes", off, n, r.img.GetName(), got)
	}
}

// changedBytes is the byte-level truth: the ranges of [0, size of to) whose
// bytes differ between snapshots from and to of v, read through librbd (a
// snapshot ends in zeros past its size), or, with from empty, the ranges of
// to that are not zero. Each range is exact to the byte.
func changedBytes(t testing.TB, v rbdVolume, from, to string) []span {
	t.Helper()
	target := openSnap(t, v, to)
	var base *snapReader
	if from != "" {
		base = openSnap(t, v, from)
	}
	const chunk = 4 << 20
	a, b := make([]byte, chunk), make([]byte, chunk)
	var out []span
	add := func(off, n int64) {
		if k := len(out); k > 0 && spanEnd(out[k-1]) == off {
			out[k-1].Length += n
			return
		}
		out = append(out, span{Offset: off, Length: n})
	}
	for off := int64(0); off < target.size; off += chunk {
		n := min(int64(chunk), target.size-off)
		target.readAt(t, b[:n], off)
		if base != nil {
			base.readAt(t, a[:n], off)
		} else {
			clear(a[:n])
		}
		for blk := int64(0); blk < n; blk += oracleBlock {
			e := min(blk+oracleBlock, n)
			if bytes.Equal(a[blk:e], b[blk:e]) {
				continue
			}
			eachRun(a[blk:e], b[blk:e], off+blk, add)
		}
	}
	return out
}

// eachRun calls fn for each run of bytes where x and y (of one length)
// differ, at off plus the run's index: the byte oracle's one comparison.
func eachRun(x, y []byte, off int64, fn func(off, n int64)) {
	for i := 0; i < len(x); {
		if x[i] == y[i] {
			i++
			continue
		}
		j := i + 1
		for j < len(x) && x[j] != y[j] {
			j++
		}
		fn(off+int64(i), int64(j-i))
		i = j
	}
}

// oracleMisses returns the changed bytes (changedBytes) that tuples do not
// cover, rounded out to whole oracle blocks for the message.
func oracleMisses(changed, tuples []span) []span {
	return roundOut(uncovered(changed, mergeSpans(tuples)), oracleBlock)
}

// ---------------------------------------------------------- image setup --

// createVolume creates an image with the given features (and options) in
// namespace ns, removed when the test ends, and opens it for writing.
func createVolume(t testing.TB, conn *rados.Conn, ns, prefix string, size, features uint64, more ...func(*rbd.ImageOptions)) (rbdVolume, *rbd.Image) {
	t.Helper()
	ioctx := openIOContext(t, conn, pool, ns)
	name := uniqueName(t, prefix)
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := opts.SetUint64(rbd.ImageOptionFeatures, features); err != nil {
		t.Fatal(err)
	}
	for _, f := range more {
		f(opts)
	}
	if err := rbd.CreateImage(ioctx, name, size, opts); err != nil {
		t.Fatalf("create image %s (features %#x): %v", name, features, err)
	}
	removeImageOnCleanup(t, ioctx, name)
	img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open image %s: %v", name, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return rbdVolume{ioctx: ioctx, ns: ns, name: name}, img
}

// fill writes length bytes of non-zero data at off, different on each call.
func fillAt(t testing.TB, img *rbd.Image, off, length uint64) {
	t.Helper()
	seed := fillCount.Add(1)
	data := make([]byte, length)
	for i := range data {
		data[i] = byte(seed*31+uint64(i)*7) | 1
	}
	if n, err := img.WriteAt(data, int64(off)); err != nil || n != len(data) {
		t.Fatalf("write %d+%d to %s: n=%d, %v", off, length, img.GetName(), n, err)
	}
}

var fillCount atomic.Uint64

// zero writes length zero bytes at off (a write, not a discard).
func zeroAt(t testing.TB, img *rbd.Image, off, length uint64) {
	t.Helper()
	if n, err := img.WriteAt(make([]byte, length), int64(off)); err != nil || n != int(length) {
		t.Fatalf("write %d zeros at %d to %s: n=%d, %v", length, off, img.GetName(), n, err)
	}
}

func resizeImage(t testing.TB, img *rbd.Image, size uint64) {
	t.Helper()
	if err := img.Resize(size); err != nil {
		t.Fatalf("resize %s to %d: %v", img.GetName(), size, err)
	}
}

// diffSpans returns "" when got equals want, else a go-cmp diff (-want
// +got) of a window around the first difference, so that lists of a
// million tuples compare fast and fail readably.
func diffSpans(want, got []span) string {
	if slices.Equal(want, got) {
		return ""
	}
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	lo := max(i-3, 0)
	w, g := want[lo:min(len(want), i+20)], got[lo:min(len(got), i+20)]
	return fmt.Sprintf("%d tuples, want %d; first difference at #%d; #%d.. (-want +got):\n%s",
		len(got), len(want), i, lo, cmp.Diff(w, g, cmpopts.EquateEmpty()))
}
