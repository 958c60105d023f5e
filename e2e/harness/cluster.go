//go:build e2e

package harness

// The test cluster: its environment, connections, images and snapshots,
// the rbd and ceph command line tools, and extra clusters a test starts
// for itself.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

// KiB is a kibibyte, in the uint64 of librbd offsets.
const KiB = uint64(1) << 10

// The cluster that cluster.sh starts: the test pool, its RADOS namespace
// (csi-config.json's second cluster ID, ClusterIDNS), and the images the
// tests make by default: 256 MiB of 4 MiB objects with Ceph-CSI's features
// (ImageFeatures: fast-diff, so with an object map).
const (
	Pool      = "rbd"
	Namespace = "ns1"
	MiB       = uint64(1) << 20
	ImageSize = 256 * MiB
	ObjSize   = 4 * MiB // librbd's default object size (order 22)

	ImageFeatures = rbd.FeatureLayering | rbd.FeatureExclusiveLock |
		rbd.FeatureObjectMap | rbd.FeatureFastDiff | rbd.FeatureDeepFlatten
)

// Extent is one changed range, as reported by DiffIterate or `rbd diff`.
type Extent struct {
	Offset uint64
	Length uint64
	Exists bool
}

// String prints the extent as [offset+length exists=...].
func (e Extent) String() string {
	return fmt.Sprintf("[%d+%d exists=%t]", e.Offset, e.Length, e.Exists)
}

// ClusterEnv returns the environment variable set by cluster.sh's env file,
// failing the test when it is missing: an e2e run without a cluster is an error.
func ClusterEnv(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: start a cluster with e2e/cluster.sh and export its env file, or use e2e/run-e2e.sh", name)
	}
	return v
}

// Connect opens a RADOS connection to the test cluster as user with key,
// without a config file.
func Connect(t testing.TB, user, key string) *rados.Conn {
	t.Helper()
	return ConnectTo(t, ClusterEnv(t, "CEPH_MON_HOST"), user, key)
}

// ConnectTo opens a RADOS connection to the monitors of monHost as user
// with key, without a config file, with more librados options.
func ConnectTo(t testing.TB, monHost, user, key string, more ...[2]string) *rados.Conn {
	t.Helper()
	conn, err := rados.NewConnWithUser(user)
	if err != nil {
		t.Fatalf("rados.NewConnWithUser(%q): %v", user, err)
	}
	for _, o := range append([][2]string{
		{"mon_host", monHost},
		{"key", key},
		{"keyring", "/dev/null"},
		// The defaults (300 s, none) make an unreachable mon hang the test.
		{"client_mount_timeout", "10"},
		{"rados_mon_op_timeout", "30"},
		{"rados_osd_op_timeout", "30"},
	}, more...) {
		if err := conn.SetConfigOption(o[0], o[1]); err != nil {
			t.Fatalf("SetConfigOption(%s): %v", o[0], err)
		}
	}
	if err := conn.Connect(); err != nil {
		t.Fatalf("connecting to %s as client.%s: %v", monHost, user, err)
	}
	t.Cleanup(conn.Shutdown)
	return conn
}

// ConnectAdmin connects as CEPH_USER (client.admin).
func ConnectAdmin(t testing.TB) *rados.Conn {
	t.Helper()
	ClusterEnv(t, "CEPH_MON_HOST")
	return Connect(t, ClusterEnv(t, "CEPH_USER"), ClusterEnv(t, "CEPH_KEY"))
}

// OpenIOContext opens pool, in RADOS namespace ns ("" for the default),
// and closes it when the test ends.
func OpenIOContext(t testing.TB, conn *rados.Conn, pool, ns string) *rados.IOContext {
	t.Helper()
	ioctx, err := conn.OpenIOContext(pool)
	if err != nil {
		t.Fatalf("OpenIOContext(%q): %v", pool, err)
	}
	ioctx.SetNamespace(ns)
	t.Cleanup(ioctx.Destroy)
	return ioctx
}

// UniqueName returns prefix plus a random suffix, so that runs sharing a
// cluster do not collide.
func UniqueName(t testing.TB, prefix string) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// ImageOptions returns the image features Ceph-CSI uses and, for clones,
// clone format 2 (librbd rejects that option when creating an image).
func ImageOptions(t testing.TB, clone bool) *rbd.ImageOptions {
	t.Helper()
	opts := rbd.NewRbdImageOptions()
	t.Cleanup(opts.Destroy)
	if err := opts.SetUint64(rbd.ImageOptionFeatures, ImageFeatures); err != nil {
		t.Fatal(err)
	}
	// Format 2 clones let their parent snapshot move to the trash.
	if clone {
		if err := opts.SetUint64(rbd.ImageOptionCloneFormat, 2); err != nil {
			t.Fatal(err)
		}
	}
	return opts
}

// RemoveImageOnCleanup removes the image, and its user snapshots, when the
// test ends. Cleanups run last-in first-out, so clones go before parents.
func RemoveImageOnCleanup(t testing.TB, ioctx *rados.IOContext, name string) {
	t.Helper()
	t.Cleanup(func() {
		img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
		if err != nil && !errors.Is(err, rbd.ErrNotFound) {
			// A client that was connected across an OSD's stall (the fault
			// tests stop one) may time out opening images for minutes
			// after it, while a fresh client is served (seen at the end of
			// CI's suite, for the volume the fault tests share): once more
			// with a fresh connection.
			t.Logf("cleanup: open %s: %v; again with a fresh connection", name, err)
			pool, perr := ioctx.GetPoolName()
			ns, nerr := ioctx.GetNamespace()
			if perr == nil && nerr == nil {
				ioctx = OpenIOContext(t, ConnectAdmin(t), pool, ns)
				img, err = rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
			}
		}
		if errors.Is(err, rbd.ErrNotFound) {
			return
		}
		if err != nil {
			t.Errorf("cleanup: open %s: %v", name, err)
			return
		}
		snaps, err := img.GetSnapshotNames()
		if err != nil {
			t.Errorf("cleanup: list snapshots of %s: %v", name, err)
		}
		for _, s := range snaps {
			if err := img.GetSnapshot(s.Name).Remove(); err != nil {
				t.Errorf("cleanup: remove %s@%s: %v", name, s.Name, err)
			}
		}
		if err := img.Close(); err != nil {
			t.Errorf("cleanup: close %s: %v", name, err)
		}
		if err := rbd.RemoveImage(ioctx, name); err != nil {
			t.Errorf("cleanup: remove %s: %v", name, err)
			for _, args := range [][]string{{"snap", "ls", "--all", Pool + "/" + name}, {"trash", "ls", "--all", Pool}, {"ls", "-l", Pool}} {
				out, _ := RbdTry(t, args...)
				t.Logf("rbd %s:\n%s", strings.Join(args, " "), out)
			}
		}
	})
}

// CreateImage creates an image with the features Ceph-CSI uses and opens it.
func CreateImage(t testing.TB, ioctx *rados.IOContext, name string, size uint64) *rbd.Image {
	t.Helper()
	if err := rbd.CreateImage(ioctx, name, size, ImageOptions(t, false)); err != nil {
		t.Fatalf("create image %s: %v", name, err)
	}
	RemoveImageOnCleanup(t, ioctx, name)
	img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open image %s: %v", name, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return img
}

// WriteAt writes length bytes at off to img, a byte that depends on
// off's 4 KiB block (never 0, so that a write is never a hole).
func WriteAt(t testing.TB, img *rbd.Image, off, length uint64) {
	t.Helper()
	data := bytes.Repeat([]byte{byte(off>>12) | 1}, int(length))
	if n, err := img.WriteAt(data, int64(off)); err != nil || n != len(data) {
		t.Fatalf("write %d+%d to %s: n=%d, %v", off, length, img.GetName(), n, err)
	}
}

// Discard discards length bytes at off of img.
func Discard(t testing.TB, img *rbd.Image, off, length uint64) {
	t.Helper()
	if _, err := img.Discard(off, length); err != nil {
		t.Fatalf("discard %d+%d on %s: %v", off, length, img.GetName(), err)
	}
}

// Snapshot takes the user snapshot name of img and returns its ID.
func Snapshot(t testing.TB, img *rbd.Image, name string) uint64 {
	t.Helper()
	if _, err := img.CreateSnapshot(name); err != nil {
		t.Fatalf("snapshot %s@%s: %v", img.GetName(), name, err)
	}
	id, err := img.GetSnapID(name)
	if err != nil {
		t.Fatalf("snapshot ID of %s@%s: %v", img.GetName(), name, err)
	}
	return id
}

// RbdCLI runs the rbd command line tool (inside the rootfs; CEPH_CONF points
// at the cluster's config) and returns its standard output.
func RbdCLI(t testing.TB, args ...string) []byte {
	t.Helper()
	return RbdCLIEnv(t, nil, args...)
}

// RbdCLIEnv is RbdCLI with env ("NAME=value") added to the test's
// environment, for a test that runs in parallel with others (t.Setenv
// refuses those).
func RbdCLIEnv(t testing.TB, env []string, args ...string) []byte {
	t.Helper()
	ClusterEnv(t, "CEPH_CONF")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rbd", args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("rbd %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// ExtraCluster is a second throwaway cluster, started by a test with
// cluster.sh's inside part (the test runs inside the rootfs).
type ExtraCluster struct {
	Dir string
	Env map[string]string // its env file: CEPH_MON_HOST, CEPH_KEY, ...
}

// StartExtraCluster starts a cluster on ip, with the monitor on ports v2
// and v1 and the OSDs on base+10..base+99, and stops it when the test ends.
// env adds settings of cluster.sh's inside part (RSM_CEPH_OSDS=3, ...).
func StartExtraCluster(t testing.TB, ip string, base, v2, v1 int, env ...string) *ExtraCluster {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "rsm-extra.")
	if err != nil {
		t.Fatal(err)
	}
	c := &ExtraCluster{Dir: dir}
	for _, d := range []string{"run", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c.stop(t)
		os.RemoveAll(dir)
	})
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script, err := filepath.Abs("cluster.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", script, "__start-inside", dir, strconv.Itoa(base))
	// In /, as cluster.sh runs it: reef's osd_class_dir is relative, and an
	// OSD started elsewhere answers every class method with EOPNOTSUPP.
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "RSM_CEPH_ADDR="+ip,
		"RSM_CEPH_MON_V2="+strconv.Itoa(v2), "RSM_CEPH_MON_V1="+strconv.Itoa(v1), "RSM_CEPH_NAMESPACE=none")
	cmd.Env = append(cmd.Env, env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log", "start.log"))
		t.Fatalf("start a cluster on %s: %v\n%s\n%s", ip, err, out, Tail(string(log), 30))
	}
	raw, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	c.Env = map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			c.Env[k] = v
		}
	}
	t.Logf("started a cluster on %s (mon %s) in %v", ip, c.Env["CEPH_MON_HOST"], time.Since(t0).Round(time.Millisecond))
	return c
}

// stop stops the cluster's daemons: SIGTERM, the OSD first, then SIGKILL
// what is left after 10 s.
func (c *ExtraCluster) stop(t testing.TB) {
	for _, glob := range []string{"ceph-osd.*.pid", "*.pid"} {
		files, _ := filepath.Glob(filepath.Join(c.Dir, "run", glob))
		var pids []int
		for _, f := range files {
			b, _ := os.ReadFile(f)
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			if err == nil && strings.HasPrefix(string(comm), "ceph-") && syscall.Kill(pid, syscall.SIGTERM) == nil {
				pids = append(pids, pid)
			}
		}
		for _, pid := range pids {
			for i := 0; ; i++ {
				st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				if err != nil || strings.Contains(string(st), ") Z ") {
					break
				}
				if i == 200 {
					t.Logf("SIGKILL pid %d after 10 s", pid)
					syscall.Kill(pid, syscall.SIGKILL)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// CephAuth runs the ceph CLI as admin and returns its output, trimmed.
func CephAuth(t testing.TB, args ...string) string {
	t.Helper()
	conf := ClusterEnv(t, "CEPH_CONF")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ceph", append([]string{"--conf", conf}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ceph %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// RbdTry runs the rbd command line tool and returns its combined output
// and error, for commands that may fail.
func RbdTry(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	ClusterEnv(t, "CEPH_CONF")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, "rbd", args...).CombinedOutput()
}
