package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/rbddriver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/metrics"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/server"
)

// defaultMaxStreams is --max-streams' default. A stream holds at most three
// pages (about 2 MiB at the default page size, 14 MiB at the largest), an
// image, and in precise mode up to 32 objects refined at once, each in a
// librados call (rbd's preciseWindow and preciseWalkWindow; a walk's
// delta, walkBatch*walkDeltaWindow list_snaps): 32 streams
// stay within a few hundred MiB in a provisioner pod, while backup tools
// read a few volumes at a time.
const defaultMaxStreams = 32

// defaultResumeBudget is --resume-budget's default. The sidecar ends every
// stream after its --max-streaming-duration-min (10 min by default), and
// a large volume's stream takes minutes of that by itself. Two minutes of
// resuming, after the op timeout that detects the fault (30 s), cover an
// OSD restart (back within seconds), and on a cluster with replicas an
// OSD that stays down: the monitors mark it down after the heartbeat grace
// (20 s) and its PGs peer on the other replicas within seconds more; a
// monitor election takes seconds. Longer outages (a whole cluster down)
// end the stream with UNAVAILABLE while the sidecar's cap still leaves a
// retry possible.
const defaultResumeBudget = 2 * time.Minute

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// run parses the flags, wires rbd, driver and server together, and serves
// until SIGTERM or SIGINT. It returns the process's exit code.
func run(args []string) int {
	fs := flag.NewFlagSet("rbd-snapshot-metadata", flag.ContinueOnError)
	var (
		endpoint    = fs.String("endpoint", "unix:///csi/csi-snapshot-metadata.sock", "gRPC endpoint: unix:///path or tcp://host:port")
		driverName  = fs.String("drivername", "rbd.csi.ceph.com", "CSI driver name; must equal the VolumeSnapshotContents' driver")
		configPath  = fs.String("clusterconfig", "/etc/ceph-csi-config/config.json", "Ceph-CSI cluster config (clusterID → monitors, radosNamespace)")
		blockType   = fs.String("block-metadata-type", "VARIABLE_LENGTH", "VARIABLE_LENGTH or FIXED_LENGTH")
		blockSize   = fs.Int64("fixed-block-size", 1<<20, "tuple size in bytes for FIXED_LENGTH")
		precision   = fs.String("precision", "precise", "precise: the bytes that changed (object map, then RADOS queries per changed object); exact: librbd's per-extent diff; object: whole RADOS objects (fast with fast-diff)")
		walk        = fs.String("precise-walk", "auto", "how precise mode finds the objects of an image without a usable object map (no fast-diff): list (RADOS object listing of the pool's namespace: costs the pool's object count), probe (list_snaps of every object number, many in flight: costs the image's size), auto (list unless the pool holds over 16 objects per object of the image), librbd (librbd's own walk, one object at a time); see README, Performance")
		trustOM     = fs.Bool("trust-object-map", false, "precise deltas take candidates from the object map's dirty bits: faster, but misses changes after rbd snap rollback and on copy-on-read clones (see README, Precision)")
		mountTO     = fs.Duration("ceph-connect-timeout", rbd.DefaultMountTimeout, "how long connecting to the monitors may take (librados client_mount_timeout)")
		opTO        = fs.Duration("ceph-op-timeout", rbd.DefaultOpTimeout, "librados monitor and OSD operation timeout")
		idleTO      = fs.Duration("ceph-conn-idle", rbd.DefaultIdleTimeout, "how long an unused cluster connection stays cached")
		maxAge      = fs.Duration("ceph-conn-max-age", rbd.DefaultMaxConnAge, "how long a cluster connection serves new requests, however busy: the bound on how long a revoked cephx key keeps working")
		grace       = fs.Duration("grace-period", 30*time.Second, "on SIGTERM, how long running streams may finish")
		maxStreams  = fs.Int("max-streams", defaultMaxStreams, "how many GetMetadataAllocated/GetMetadataDelta streams are served at once; more are refused with ABORTED (0: no limit)")
		stall       = fs.Duration("stall-timeout", 5*time.Minute, "a stream whose client takes no page for this long ends with DEADLINE_EXCEEDED, releasing its image and thread (0: never)")
		resume      = fs.Duration("resume-budget", defaultResumeBudget, "how long in all a stream may spend re-opening its diff after errors that go away by themselves (an OSD or monitor that did not answer in time, a reset connection), backing off, before it ends with UNAVAILABLE; the stream then goes on from where it stopped (0: such errors end the stream at once)")
		metricsAddr = fs.String("metrics-address", "", "host:port to serve Prometheus /metrics on (empty: off)")
		showVersion = fs.Bool("version", false, "print the version and exit")
	)
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Println(version)
		return 0
	}
	typ, ok := csi.BlockMetadataType_value[*blockType]
	if !ok || typ == int32(csi.BlockMetadataType_UNKNOWN) {
		fmt.Fprintf(os.Stderr, "--block-metadata-type: want VARIABLE_LENGTH or FIXED_LENGTH, got %q\n", *blockType)
		return 2
	}
	var wholeObject, precise bool
	switch *precision {
	case "precise":
		precise = true
	case "exact":
	case "object":
		wholeObject = true
	default:
		fmt.Fprintf(os.Stderr, "--precision: want precise, exact or object, got %q\n", *precision)
		return 2
	}
	walkMode := *walk
	switch walkMode {
	case "auto":
		walkMode = rbd.WalkAuto
	case rbd.WalkList, rbd.WalkProbe, rbd.WalkLibrbd:
	default:
		fmt.Fprintf(os.Stderr, "--precise-walk: want auto, list, probe or librbd, got %q\n", *walk)
		return 2
	}

	logger := klog.Background()
	if limit, ok := goMemoryLimit(os.Getenv); ok {
		debug.SetMemoryLimit(limit)
		logger.Info("Go memory limit from the container's", "goMemoryLimit", limit, "memoryLimit", os.Getenv(memoryLimitEnv))
	}
	src := rbd.NewSource(rbd.Options{
		ConfigPath:     *configPath,
		MountTimeout:   *mountTO,
		OpTimeout:      *opTO,
		IdleTimeout:    *idleTO,
		MaxConnAge:     *maxAge,
		WholeObject:    wholeObject,
		Precise:        precise,
		TrustObjectMap: *trustOM,
		Walk:           walkMode,
	})
	defer src.Close()
	m := metrics.New(func() float64 { return float64(src.Stats().Conns) })
	drv, err := driver.New(rbddriver.New(src), driver.Options{
		Name:              *driverName,
		Version:           version,
		BlockMetadataType: csi.BlockMetadataType(typ),
		FixedBlockSize:    *blockSize,
		Ready:             func() error { return checkConfig(*configPath) },
		Observer:          m,
		StallTimeout:      *stall,
		ResumeBudget:      *resume,
	})
	if err != nil {
		logger.Error(err, "Invalid configuration")
		return 2
	}
	logger.Info("Starting", "version", version, "driver", *driverName, "clusterConfig", *configPath,
		"blockMetadataType", *blockType, "fixedBlockSize", *blockSize, "precision", *precision,
		"trustObjectMap", *trustOM, "preciseWalk", *walk, "maxStreams", *maxStreams, "stallTimeout", *stall, "resumeBudget", *resume)

	ctx, stop := signal.NotifyContext(klog.NewContext(context.Background(), logger), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := server.Run(ctx, server.Config{
		Endpoint: *endpoint, Services: drv, GracePeriod: *grace, Metrics: m, MetricsAddress: *metricsAddr,
		MaxStreams: *maxStreams,
	}); err != nil {
		logger.Error(err, "Server failed")
		return 1
	}
	return 0
}

// memoryLimitEnv names the environment variable that holds the
// container's memory limit in bytes (the manifests set it from the
// downward API's limits.memory).
const memoryLimitEnv = "MEMORY_LIMIT_BYTES"

// goMemoryLimit returns the Go memory limit derived from the container's:
// 3/4 of it, since librados' heap, threads and the binary are outside Go's
// accounting (about 55 MiB idle, more with many connections). Without the
// variable, or when GOMEMLIMIT is set (it wins), none.
func goMemoryLimit(getenv func(string) string) (int64, bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(getenv(memoryLimitEnv)), 10, 64)
	if err != nil || n <= 0 || n == math.MaxInt64 {
		return 0, false // unset, or no limit
	}
	return n / 4 * 3, true
}

// checkConfig is the server's readiness: the cluster config can be read and
// parsed. Without it no snapshot ID can be resolved.
func checkConfig(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_, err = rbd.ParseConfig(b)
	return err
}

// The driver finds these by type assertion on its Observer, so losing one
// would silently drop metrics. They are asserted here, where both packages
// are imported: metrics knows no driver (it takes report.Refinement).
var (
	_ driver.RefinementObserver = (*metrics.Metrics)(nil)
	_ driver.ResumeObserver     = (*metrics.Metrics)(nil)
)
