// backup-client: a backup application's view of a snapshot's blocks, for
// the node e2e tests. It runs in a pod under its own ServiceAccount and
// asks through external-snapshot-metadata's iterator (pkg/iterator), the
// client library a backup tool such as Velero's block data mover calls,
// with MaxResults 0: the CSI driver picks the page size.
//
// Output, on stdout, one JSON object a line: each BlockMetadata tuple in
// the order received,
//
//	{"offset":N,"size":N}
//
// then, once the stream ended without error,
//
//	{"done":true,"tuples":N,"type":"FIXED_LENGTH|VARIABLE_LENGTH","volumeCapacityBytes":N}
//
// (type "" and volumeCapacityBytes 0 if the stream had no record). On a
// failure it writes the error on stderr, no done line, and exits 1; a bad
// command line exits 2. A test reads `kubectl logs` and compares the
// tuples with its byte oracle.
//
// With -streams N (N > 1) it runs N such calls at once, as a backup tool
// that reads several volumes does, and writes no tuples: a line a record,
//
//	{"stream":I,"record":N,"tuples":N}
//
// and at each stream's end {"stream":I,"done":true,"tuples":N} or
// {"stream":I,"error":"..."}; it exits 1 if any stream failed. With a long
// -record-delay these are stalled readers, which hold a stream each.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kubernetes-csi/external-snapshot-metadata/pkg/iterator"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	var (
		snapshot   = flag.String("snapshot", "", "VolumeSnapshot to list (required)")
		prev       = flag.String("prev-snapshot", "", "earlier VolumeSnapshot of the same volume: list the blocks changed since it (GetMetadataDelta); empty: the allocated blocks (GetMetadataAllocated)")
		namespace  = flag.String("namespace", "", "namespace of the VolumeSnapshots (required)")
		sa         = flag.String("service-account", "", "ServiceAccount the security token is made for, NAME (in -namespace) or NAMESPACE/NAME; empty: the caller's own (the pod's)")
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig file; empty: the in-cluster config of the pod")
		maxResults = flag.Int("max-results", 0, "tuples per record; 0, as Velero asks: the CSI driver's choice")
		delay      = flag.Duration("record-delay", 0, "how long to spend on each record before taking the next: a consumer that reads each page's data (the lifecycle tests)")
		streams    = flag.Int("streams", 1, "calls at once; above 1, a line a record instead of the tuples")
	)
	flag.Parse()
	if *snapshot == "" || *namespace == "" || *streams < 1 || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "backup-client: -snapshot and -namespace are required, -streams at least 1, and no arguments")
		flag.Usage()
		os.Exit(2)
	}
	args := iterator.Args{
		Namespace:        *namespace,
		SnapshotName:     *snapshot,
		PrevSnapshotName: *prev,
		MaxResults:       int32(*maxResults),
	}
	if *sa != "" {
		args.SANamespace, args.SAName = *namespace, *sa
		if ns, name, ok := strings.Cut(*sa, "/"); ok {
			args.SANamespace, args.SAName = ns, name
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := bufio.NewWriter(os.Stdout)
	err := run(ctx, *kubeconfig, args, out, *delay, *streams)
	if ferr := out.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("writing stdout: %w", ferr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "backup-client:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig string, args iterator.Args, w *bufio.Writer, delay time.Duration, streams int) error {
	var (
		config *rest.Config
		err    error
	)
	if kubeconfig == "" {
		config, err = rest.InClusterConfig()
	} else {
		config, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	if args.Clients, err = iterator.BuildClients(config); err != nil {
		return err
	}
	if streams == 1 {
		args.Emitter = &emitter{ctx: ctx, w: w, delay: delay}
		return iterator.GetSnapshotMetadata(ctx, args)
	}
	var (
		mu     sync.Mutex // w's
		wg     sync.WaitGroup
		failed = make([]error, streams)
	)
	line := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", a...)
		w.Flush()
	}
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := args
			e := &emitter{ctx: ctx, delay: delay, stream: i, line: line}
			a.Emitter = e
			if failed[i] = iterator.GetSnapshotMetadata(ctx, a); failed[i] != nil {
				line("{\"stream\":%d,\"error\":%q}", i, failed[i].Error())
				return
			}
			line("{\"stream\":%d,\"done\":true,\"tuples\":%d}", i, e.tuples)
		}()
	}
	wg.Wait()
	for i, err := range failed {
		if err != nil {
			return fmt.Errorf("stream %d of %d: %w", i, streams, err)
		}
	}
	return nil
}

// emitter writes the tuples as they come and the done line at the end. A
// stream whose records disagree on the type or the volume's size is an
// error: the spec has every response of a stream carry the same.
type emitter struct {
	ctx      context.Context
	w        *bufio.Writer                 // the tuples; nil with line
	line     func(format string, a ...any) // -streams: a line a record
	stream   int
	delay    time.Duration // per record, after it is written out
	tuples   int64
	typ      string
	capacity int64
	records  int
}

func (e *emitter) SnapshotMetadataIteratorRecord(n int, m iterator.IteratorMetadata) error {
	typ := m.BlockMetadataType.String()
	if e.records > 0 && (typ != e.typ || m.VolumeCapacityBytes != e.capacity) {
		return fmt.Errorf("record %d: type %s, volume capacity %d bytes; earlier records: %s, %d bytes",
			n, typ, m.VolumeCapacityBytes, e.typ, e.capacity)
	}
	e.records++
	e.typ, e.capacity = typ, m.VolumeCapacityBytes
	for _, b := range m.BlockMetadata {
		if b == nil {
			return fmt.Errorf("record %d: a nil BlockMetadata", n)
		}
		e.tuples++
		if e.w == nil {
			continue
		}
		if _, err := fmt.Fprintf(e.w, "{\"offset\":%d,\"size\":%d}\n", b.GetByteOffset(), b.GetSizeBytes()); err != nil {
			return fmt.Errorf("writing stdout: %w", err)
		}
	}
	if e.line != nil {
		e.line("{\"stream\":%d,\"record\":%d,\"tuples\":%d}", e.stream, e.records, e.tuples)
	}
	if e.delay > 0 {
		// Each record is in the log before the next is taken, so that a
		// test sees how far the stream got.
		if e.w != nil {
			if err := e.w.Flush(); err != nil {
				return fmt.Errorf("writing stdout: %w", err)
			}
		}
		select {
		case <-time.After(e.delay):
		case <-e.ctx.Done():
			return e.ctx.Err()
		}
	}
	return nil
}

func (e *emitter) SnapshotMetadataIteratorDone(int) error {
	if e.w == nil {
		return nil
	}
	_, err := fmt.Fprintf(e.w, "{\"done\":true,\"tuples\":%d,\"type\":%q,\"volumeCapacityBytes\":%d}\n",
		e.tuples, e.typ, e.capacity)
	return err
}
