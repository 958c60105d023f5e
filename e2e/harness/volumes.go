//go:build e2e

package harness

// Volumes made for the server's tests: an image with snapshots and the
// IDs the server accepts for them, filled quickly with recognizable data.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

// RbdVolume is an RBD image of a test, in the default namespace or in ns1.
type RbdVolume struct {
	IOCtx *rados.IOContext
	ns    string
	Name  string
}

// Spec is the image spec of the rbd CLI: pool[/namespace]/image.
func (v RbdVolume) Spec() string {
	if v.ns == "" {
		return Pool + "/" + v.Name
	}
	return Pool + "/" + v.ns + "/" + v.Name
}

// IDs returns the native snapshot IDs that name v@snap: in ns1, both the
// cluster ID whose config sets the namespace and the ID that names it.
func (v RbdVolume) IDs(snap string) []string {
	if v.ns == "" {
		return []string{ClusterID + "/" + Pool + "/" + v.Name + "@" + snap}
	}
	if v.ns != Namespace {
		panic("no cluster ID has namespace " + v.ns)
	}
	return []string{
		ClusterIDNS + "/" + Pool + "/" + v.Name + "@" + snap,
		ClusterID + "/" + Pool + "/" + v.ns + "/" + v.Name + "@" + snap,
	}
}

// ID is the first of IDs.
func (v RbdVolume) ID(snap string) string { return v.IDs(snap)[0] }

// CreateVolume creates an image with the given features (and options) in
// namespace ns, removed when the test ends, and opens it for writing.
func CreateVolume(t testing.TB, conn *rados.Conn, ns, prefix string, size, features uint64, more ...func(*rbd.ImageOptions)) (RbdVolume, *rbd.Image) {
	t.Helper()
	ioctx := OpenIOContext(t, conn, Pool, ns)
	name := UniqueName(t, prefix)
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
	RemoveImageOnCleanup(t, ioctx, name)
	img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open image %s: %v", name, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return RbdVolume{IOCtx: ioctx, ns: ns, Name: name}, img
}

// fill writes length bytes of non-zero data at off, different on each call.
func FillAt(t testing.TB, img *rbd.Image, off, length uint64) {
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
func ZeroAt(t testing.TB, img *rbd.Image, off, length uint64) {
	t.Helper()
	if n, err := img.WriteAt(make([]byte, length), int64(off)); err != nil || n != int(length) {
		t.Fatalf("write %d zeros at %d to %s: n=%d, %v", length, off, img.GetName(), n, err)
	}
}

// ResizeImage resizes img to size bytes.
func ResizeImage(t testing.TB, img *rbd.Image, size uint64) {
	t.Helper()
	if err := img.Resize(size); err != nil {
		t.Fatalf("resize %s to %d: %v", img.GetName(), size, err)
	}
}

// ImportDiff writes records to the image with `rbd import-diff -`: one
// process, librbd's own write concurrency, far faster than synchronous
// go-ceph writes. Each record is written as one write of len(data) bytes.
func ImportDiff(t testing.TB, v RbdVolume, offsets func(yield func(off uint64) bool), data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rbd", "import-diff", "--no-progress", "--rbd-concurrent-management-ops", "32", "-", v.Spec())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("rbd import-diff: %v", err)
	}
	w := bufio.NewWriterSize(in, 1<<20)
	var hdr [17]byte
	werr := func() error {
		if _, err := io.WriteString(w, "rbd diff v1\n"); err != nil {
			return err
		}
		for off := range offsets {
			hdr[0] = 'w'
			binary.LittleEndian.PutUint64(hdr[1:], off)
			binary.LittleEndian.PutUint64(hdr[9:], uint64(len(data)))
			w.Write(hdr[:])
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
		w.WriteByte('e')
		return w.Flush()
	}()
	in.Close()
	if err := cmd.Wait(); err != nil || werr != nil {
		t.Fatalf("rbd import-diff - %s: %v (writing: %v)\n%s", v.Spec(), err, werr, stderr.Bytes())
	}
}

// SharedManyWrites is ManyWrites(t, n) made once per test binary and
// shared by the tests that ask for the same n: for tests that only read
// the volume (no write, no snapshot removed). Six fault and shutdown
// tests read a 16k-write volume, which took 6-10 s each to make on a
// loaded machine (issue 28). It is removed when the suite ends (EndSuite).
// The spans are the caller's own copy.
func SharedManyWrites(t testing.TB, n int) (RbdVolume, []Span) {
	t.Helper()
	type made struct {
		v    RbdVolume
		want []Span
	}
	m := shared(t, fmt.Sprintf("ManyWrites(%d)", n), func(tb testing.TB) made {
		v, want := ManyWrites(tb, n)
		return made{v, want}
	})
	return m.v, slices.Clone(m.want)
}

// ManyWrites builds a volume (Ceph-CSI's features) whose Delta from s1 to
// s2 is exactly n separate 512-byte writes, 256 per 4 MiB object, 16 KiB
// apart. Every object exists at s1 with its full size (one byte at its
// end), so that librbd's diff is exact: the writes and nothing else.
func ManyWrites(t testing.TB, n int) (RbdVolume, []Span) {
	t.Helper()
	const (
		per    = 256
		stride = ObjSize / per
		size   = 512
	)
	objects := uint64((n + per - 1) / per)
	conn := ConnectAdmin(t)
	v, img := CreateVolume(t, conn, "", "writes", objects*ObjSize, ImageFeatures)
	img.Close() // rbd import-diff takes the exclusive lock
	snap := func(name string) {
		RbdCLI(t, "snap", "create", "--no-progress", v.Spec()+"@"+name)
	}
	t0 := time.Now()
	ImportDiff(t, v, func(yield func(uint64) bool) {
		for o := uint64(0); o < objects; o++ {
			if !yield(o*ObjSize + ObjSize - 1) {
				return
			}
		}
	}, []byte{0xff})
	snap("s1")
	t1 := time.Now()
	data := bytes.Repeat([]byte{0x5a}, size)
	ImportDiff(t, v, func(yield func(uint64) bool) {
		// Object by object in the inner loop, so that concurrent writes
		// go to different objects.
		for k := uint64(0); k < uint64(n); k++ {
			if !yield(k%objects*ObjSize + k/objects*stride) {
				return
			}
		}
	}, data)
	snap("s2")
	d := time.Since(t1)
	t.Logf("volume %s: %d objects created in %v; %d writes of %d bytes in %v (%.0f writes/s)",
		v.Spec(), objects, t1.Sub(t0).Round(time.Millisecond), n, size, d.Round(time.Millisecond), float64(n)/d.Seconds())
	want := make([]Span, 0, n)
	for o := uint64(0); o < objects; o++ {
		for k := o; k < uint64(n); k += objects {
			want = append(want, Span{Offset: int64(o*ObjSize + k/objects*stride), Length: size})
		}
	}
	return v, want
}
