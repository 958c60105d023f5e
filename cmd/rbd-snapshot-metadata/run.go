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
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/metrics"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbddriver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/server"
)

// defaultMaxStreams is --max-streams' default. A stream holds at most three
// pages (73 bytes a tuple, BenchmarkPager in driver/: about 3.4 MiB at the
// default page size of 16384 tuples, 13.7 MiB at the largest, 65536), an
// image, and in precise mode up to 32 objects refined at once, each in a
// librados call (preciseWindow and preciseWalkWindow in rbd/precise; a
// walk's delta, walkBatch*walkDeltaWindow list_snaps): 32 streams
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
	f, err := parseFlags(args)
	if err != nil {
		return 2
	}
	if f.showVersion {
		fmt.Println(version)
		return 0
	}
	typ, srcOpts, ok := f.modes()
	if !ok {
		return 2
	}
	logger := klog.Background()
	if err := rbd.ReportCrashes(); err != nil {
		logger.Error(err, "A crash of librados or librbd will not show its stack")
	}
	if limit, ok := goMemoryLimit(os.Getenv); ok {
		debug.SetMemoryLimit(limit)
		logger.Info("Go memory limit from the container's", "goMemoryLimit", limit, "memoryLimit", os.Getenv(memoryLimitEnv))
	}
	src := rbd.NewSource(srcOpts)
	defer src.Close()
	m := metrics.New(func() float64 { return float64(src.Stats().Conns) })
	drv, err := driver.New(rbddriver.New(src), driver.Options{
		Name:              f.driverName,
		Version:           version,
		BlockMetadataType: typ,
		FixedBlockSize:    f.blockSize,
		Ready:             func() error { return checkConfig(f.configPath) },
		Observer:          m,
		StallTimeout:      f.stall,
		ResumeBudget:      f.resume,
	})
	if err != nil {
		logger.Error(err, "Invalid configuration")
		return 2
	}
	logger.Info("Starting", "version", version, "driver", f.driverName, "clusterConfig", f.configPath,
		"blockMetadataType", f.blockType, "fixedBlockSize", f.blockSize, "precision", f.precision,
		"trustObjectMap", f.trustOM, "preciseWalk", f.walk, "maxStreams", f.maxStreams, "stallTimeout", f.stall, "resumeBudget", f.resume)

	ctx, stop := signal.NotifyContext(klog.NewContext(context.Background(), logger), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := server.Run(ctx, server.Config{
		Endpoint: f.endpoint, Services: drv, GracePeriod: f.grace, Metrics: m, MetricsAddress: f.metricsAddr,
		MaxStreams: f.maxStreams,
	}); err != nil {
		logger.Error(err, "Server failed")
		return 1
	}
	return 0
}

// flags is the command line, as given.
type flags struct {
	endpoint, driverName, configPath, metricsAddr string
	blockType                                     string // checked by modes
	blockSize                                     int64
	precision, walk                               string // checked by modes
	trustOM                                       bool
	mountTO, opTO, idleTO, maxAge                 time.Duration // Ceph's
	grace, stall, resume                          time.Duration // the streams'
	maxStreams                                    int
	showVersion                                   bool
}

// parseFlags defines the server's flags (and klog's) and parses args.
func parseFlags(args []string) (*flags, error) {
	fs := flag.NewFlagSet("rbd-snapshot-metadata", flag.ContinueOnError)
	f := &flags{}
	fs.StringVar(&f.endpoint, "endpoint", "unix:///csi/csi-snapshot-metadata.sock", "gRPC endpoint: unix:///path or tcp://host:port")
	fs.StringVar(&f.driverName, "drivername", "rbd.csi.ceph.com", "CSI driver name; must equal the VolumeSnapshotContents' driver")
	fs.StringVar(&f.configPath, "clusterconfig", "/etc/ceph-csi-config/config.json", "Ceph-CSI cluster config (clusterID → monitors, radosNamespace)")
	fs.StringVar(&f.blockType, "block-metadata-type", "VARIABLE_LENGTH", "VARIABLE_LENGTH or FIXED_LENGTH")
	fs.Int64Var(&f.blockSize, "fixed-block-size", 1<<20, "tuple size in bytes for FIXED_LENGTH")
	fs.StringVar(&f.precision, "precision", "precise", "precise: the bytes that changed (object map, then RADOS queries per changed object); exact: librbd's per-extent diff; object: whole RADOS objects (fast with fast-diff)")
	fs.StringVar(&f.walk, "precise-walk", "auto", "how precise mode finds the objects of an image without a usable object map (no fast-diff): list (RADOS object listing of the pool's namespace: costs the pool's object count), probe (list_snaps of every object number, many in flight: costs the image's size), auto (list unless the pool holds over 16 objects per object of the image), librbd (librbd's own walk, one object at a time); see docs/performance.md#without-an-object-map")
	fs.BoolVar(&f.trustOM, "trust-object-map", false, "precise deltas take candidates from the object map's dirty bits: faster, but misses changes after rbd snap rollback and on copy-on-read clones (see docs/precision.md#candidates-and-why-not-the-object-maps-dirty-bits)")
	fs.DurationVar(&f.mountTO, "ceph-connect-timeout", rbd.DefaultMountTimeout, "how long connecting to the monitors may take (librados client_mount_timeout)")
	fs.DurationVar(&f.opTO, "ceph-op-timeout", rbd.DefaultOpTimeout, "librados monitor and OSD operation timeout")
	fs.DurationVar(&f.idleTO, "ceph-conn-idle", rbd.DefaultIdleTimeout, "how long an unused cluster connection stays cached")
	fs.DurationVar(&f.maxAge, "ceph-conn-max-age", rbd.DefaultMaxConnAge, "how long a cluster connection serves new requests, however busy: the bound on how long a revoked cephx key keeps working")
	fs.DurationVar(&f.grace, "grace-period", 30*time.Second, "on SIGTERM, how long running streams may finish")
	fs.IntVar(&f.maxStreams, "max-streams", defaultMaxStreams, "how many GetMetadataAllocated/GetMetadataDelta streams are served at once; more are refused with ABORTED (0: no limit)")
	fs.DurationVar(&f.stall, "stall-timeout", 5*time.Minute, "a stream whose client takes no page for this long ends with DEADLINE_EXCEEDED, releasing its image and thread (0: never)")
	fs.DurationVar(&f.resume, "resume-budget", defaultResumeBudget, "how long in all a stream may spend re-opening its diff after errors that go away by themselves (an OSD or monitor that did not answer in time, a reset connection), backing off, before it ends with UNAVAILABLE; the stream then goes on from where it stopped; a request's first open is retried so too, unless the monitors gave no session (0: such errors end the stream at once)")
	fs.StringVar(&f.metricsAddr, "metrics-address", "", "host:port to serve Prometheus /metrics on (empty: off)")
	fs.BoolVar(&f.showVersion, "version", false, "print the version and exit")
	klog.InitFlags(fs)
	return f, fs.Parse(args)
}

// modes checks the flags that name a mode (tuple type, precision, walk)
// and returns the tuple type and the rbd.Source's options. When one is
// wrong it says so on stderr and returns false.
func (f *flags) modes() (csi.BlockMetadataType, rbd.Options, bool) {
	typ, ok := csi.BlockMetadataType_value[f.blockType]
	if !ok || typ == int32(csi.BlockMetadataType_UNKNOWN) {
		fmt.Fprintf(os.Stderr, "--block-metadata-type: want VARIABLE_LENGTH or FIXED_LENGTH, got %q\n", f.blockType)
		return 0, rbd.Options{}, false
	}
	var wholeObject, precise bool
	switch f.precision {
	case "precise":
		precise = true
	case "exact":
	case "object":
		wholeObject = true
	default:
		fmt.Fprintf(os.Stderr, "--precision: want precise, exact or object, got %q\n", f.precision)
		return 0, rbd.Options{}, false
	}
	walkMode := f.walk
	switch walkMode {
	case "auto":
		walkMode = rbd.WalkAuto
	case rbd.WalkList, rbd.WalkProbe, rbd.WalkLibrbd:
	default:
		fmt.Fprintf(os.Stderr, "--precise-walk: want auto, list, probe or librbd, got %q\n", f.walk)
		return 0, rbd.Options{}, false
	}
	return csi.BlockMetadataType(typ), rbd.Options{
		ConfigPath:     f.configPath,
		MountTimeout:   f.mountTO,
		OpTimeout:      f.opTO,
		IdleTimeout:    f.idleTO,
		MaxConnAge:     f.maxAge,
		WholeObject:    wholeObject,
		Precise:        precise,
		TrustObjectMap: f.trustOM,
		Walk:           walkMode,
	}, true
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
	_ driver.SeamObserver       = (*metrics.Metrics)(nil)
)
