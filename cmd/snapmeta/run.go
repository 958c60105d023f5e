package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client/conformance"
)

const usage = `usage:
  snapmeta [flags] allocated SNAPSHOT_ID
  snapmeta [flags] delta BASE_SNAPSHOT_ID TARGET_SNAPSHOT_ID
  snapmeta [flags] check [BASE_SNAPSHOT_ID] SNAPSHOT_ID
      checks the server against the CSI spec's stream rules (any
      SnapshotMetadata server); --missing names a snapshot that does not exist
  snapmeta [flags] health
      exits 0 when the server's gRPC health service says SERVING (the
      pod's liveness probe)

flags:
`

// run is snapmeta: it parses the command line, connects, and does what
// the command asks. It returns the process's exit code.
func run(args []string, stdout, stderr io.Writer) int {
	o, exit, ok := parseArgs(args, stderr)
	if !ok {
		return exit
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	conn, err := grpc.NewClient(o.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(stderr, "snapmeta: %v\n", err)
		return 1
	}
	defer conn.Close()
	switch o.command {
	case "health":
		return health(ctx, conn, stdout, stderr)
	case "check":
		return check(ctx, conn, o, stdout, stderr)
	}
	return list(ctx, conn, o, stdout, stderr)
}

// options is what the command line asks for.
type options struct {
	command  string // allocated, delta, check or health
	req      client.Request
	endpoint string
	format   string
	progress bool
	timeout  time.Duration
	missing  string
}

// parseArgs reads the flags, the command and its snapshot IDs, and the
// Ceph credentials. When it fails it has said why on stderr, and returns
// the exit code (2 for bad usage).
func parseArgs(args []string, stderr io.Writer) (o options, exit int, ok bool) {
	fs := flag.NewFlagSet("snapmeta", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var (
		user    = fs.String("user", os.Getenv("SNAPMETA_USER"), "Ceph user ID (Ceph-CSI's userID secret)")
		keyFile = fs.String("keyfile", "", "file holding the Ceph key (Ceph-CSI's userKey secret); default: $SNAPMETA_KEY")
		start   = fs.Int64("starting-offset", 0, "first byte of interest")
		maxRes  = fs.Int("max-results", 0, "tuples per page (0: the server's choice)")
	)
	fs.StringVar(&o.endpoint, "endpoint", "unix:///csi/csi-snapshot-metadata.sock", "the server's socket")
	fs.StringVar(&o.format, "format", "table", "table or json (like rbd diff --format json)")
	fs.BoolVar(&o.progress, "progress", false, "report progress on stderr every second")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (0: never)")
	fs.StringVar(&o.missing, "missing", "", "check: a well-formed ID of a snapshot that does not exist, for the NOT_FOUND check")
	if err := fs.Parse(args); err != nil {
		return o, 2, false
	}
	o.req = client.Request{StartingOffset: *start, MaxResults: int32(*maxRes)}
	switch a := fs.Args(); {
	case len(a) == 1 && a[0] == "health":
	case len(a) == 2 && (a[0] == "allocated" || a[0] == "check"):
		o.req.Target = a[1]
	case len(a) == 3 && (a[0] == "delta" || a[0] == "check"):
		o.req.Base, o.req.Target = a[1], a[2]
	default:
		fs.Usage()
		return o, 2, false
	}
	o.command = fs.Arg(0)
	if o.format != "table" && o.format != "json" {
		fmt.Fprintf(stderr, "snapmeta: --format: want table or json, got %q\n", o.format)
		return o, 2, false
	}
	key := os.Getenv("SNAPMETA_KEY")
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			fmt.Fprintf(stderr, "snapmeta: %v\n", err)
			return o, 1, false
		}
		key = strings.TrimSpace(string(b))
	}
	if *user != "" || key != "" {
		o.req.Secrets = map[string]string{"userID": *user, "userKey": key}
	}
	return o, 0, true
}

// check runs the conformance checks against the server and prints their
// report; it fails when one failed.
func check(ctx context.Context, conn *grpc.ClientConn, o options, stdout, stderr io.Writer) int {
	rep, err := conformance.Run(ctx, conn, conformance.Target{Base: o.req.Base, Snapshot: o.req.Target, Missing: o.missing, Secrets: o.req.Secrets})
	fmt.Fprint(stdout, rep)
	if err != nil {
		fmt.Fprintf(stderr, "snapmeta: %v\n", err)
		return 1
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

// list streams the allocated or changed blocks, prints them as they come,
// and ends with a summary; on an error, it says where to resume.
func list(ctx context.Context, conn *grpc.ClientConn, o options, stdout, stderr io.Writer) int {
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	w := newWriter(o.format, out)
	var capacity, next atomic.Int64
	if o.progress {
		done := make(chan struct{})
		defer close(done)
		go report(stderr, &next, &capacity, done)
	}
	began := time.Now()
	p, err := client.New(conn).Stream(ctx, o.req, func(pg client.Page) error {
		capacity.Store(pg.Capacity)
		w.typ, w.capacity = pg.Type.String(), pg.Capacity
		for _, e := range pg.Extents {
			if err := w.extent(e); err != nil {
				return err
			}
		}
		next.Store(pg.Extents[len(pg.Extents)-1].Offset + pg.Extents[len(pg.Extents)-1].Length)
		return nil
	})
	if ferr := w.finish(); err == nil {
		err = ferr
	}
	summary := fmt.Sprintf("%d extents, %s (%d bytes) of a %s volume, %s, %d retries, %v",
		p.Extents, human(p.Bytes), p.Bytes, human(w.capacity), w.typ, p.Retries, time.Since(began).Round(time.Millisecond))
	if err != nil {
		out.Flush()
		fmt.Fprintf(stderr, "snapmeta: %v\nsnapmeta: stopped at byte %d after %s; resume with --starting-offset %d\n", err, p.Next, summary, p.Next)
		return 1
	}
	if o.format == "table" {
		fmt.Fprintf(out, "total: %s\n", summary)
	} else {
		fmt.Fprintf(stderr, "total: %s\n", summary)
	}
	return 0
}

// writer prints extents as a table or as a JSON array, as they come.
type writer struct {
	json     bool
	out      *bufio.Writer
	n        int
	typ      string
	capacity int64
}

func newWriter(format string, out *bufio.Writer) *writer {
	w := &writer{json: format == "json", out: out, typ: "no tuples"}
	if w.json {
		out.WriteString("[")
	} else {
		fmt.Fprintf(out, "%-20s %-20s\n", "OFFSET", "LENGTH")
	}
	return w
}

func (w *writer) extent(e client.Extent) error {
	if w.json {
		if w.n > 0 {
			w.out.WriteString(",")
		}
		b, _ := json.Marshal(e)
		_, err := w.out.Write(b)
		w.n++
		return err
	}
	w.n++
	_, err := fmt.Fprintf(w.out, "%-20d %-20d\n", e.Offset, e.Length)
	return err
}

func (w *writer) finish() error {
	if w.json {
		_, err := w.out.WriteString("]\n")
		return err
	}
	return nil
}

// report prints how far the stream got, every second, until done.
func report(stderr io.Writer, next, capacity *atomic.Int64, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			c, n := capacity.Load(), next.Load()
			if c > 0 {
				fmt.Fprintf(stderr, "progress: %s of %s (%.1f%%)\n", human(n), human(c), 100*float64(n)/float64(c))
			}
		}
	}
}

// human prints a byte count with a binary unit.
func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
