package driver

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// GetMetadataAllocated streams the allocated extents of one snapshot.
func (d *Driver) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	if req.GetSnapshotId() == "" {
		return status.Error(codes.InvalidArgument, msgNoSnapshotID)
	}
	if err := checkIDs([2]string{"snapshot_id", req.GetSnapshotId()}); err != nil {
		return err
	}
	open := OpenRequest{Target: req.GetSnapshotId(), Secrets: req.GetSecrets()}
	return d.stream(stream.Context(), MethodAllocated, open, req.GetStartingOffset(), req.GetMaxResults(),
		func(capacity int64, page []*csi.BlockMetadata) error {
			return stream.Send(&csi.GetMetadataAllocatedResponse{
				BlockMetadataType:   d.opts.BlockMetadataType,
				VolumeCapacityBytes: capacity,
				BlockMetadata:       page,
			})
		})
}

// GetMetadataDelta streams the extents that changed between two snapshots
// of one volume.
func (d *Driver) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	switch {
	case req.GetBaseSnapshotId() == "":
		return status.Error(codes.InvalidArgument, msgNoBaseID)
	case req.GetTargetSnapshotId() == "":
		return status.Error(codes.InvalidArgument, msgNoTargetID)
	}
	if err := checkIDs([2]string{"base_snapshot_id", req.GetBaseSnapshotId()},
		[2]string{"target_snapshot_id", req.GetTargetSnapshotId()}); err != nil {
		return err
	}
	open := OpenRequest{Base: req.GetBaseSnapshotId(), Target: req.GetTargetSnapshotId(), Secrets: req.GetSecrets()}
	return d.stream(stream.Context(), MethodDelta, open, req.GetStartingOffset(), req.GetMaxResults(),
		func(capacity int64, page []*csi.BlockMetadata) error {
			return stream.Send(&csi.GetMetadataDeltaResponse{
				BlockMetadataType:   d.opts.BlockMetadataType,
				VolumeCapacityBytes: capacity,
				BlockMetadata:       page,
			})
		})
}

// A streamRun is one RPC's stream: its diff, re-opened after temporary
// errors (see resume.go), the pager and the sender.
type streamRun struct {
	d        *Driver
	method   string
	req      OpenRequest
	start    int64
	diff     Diff // nil after a failed re-open
	capacity int64
	lineage  string // the first diff's (Lineager); a re-open must match
	p        *pager
	snd      *sender
	addErr   error         // the pager's error: the client's side failed
	resumes  int           // diffs re-opened
	resuming time.Duration // spent re-opening, in all
	ref      Refinement    // what precise mode did in the diffs closed
	seam     seam          // the check of a resumed diff (seam.go)
}

// stream runs one diff and sends its pages; both RPCs end here. Every
// error leaves through toStatus.
func (d *Driver) stream(ctx context.Context, method string, req OpenRequest, start int64, maxResults int32,
	send func(capacity int64, page []*csi.BlockMetadata) error) (err error) {
	pageSize, err := checkStream(req, start, maxResults)
	if err != nil {
		return err
	}
	r := &streamRun{d: d, method: method, req: req, start: start}
	if err := r.open(ctx); err != nil {
		return toStatus(err)
	}
	defer func() {
		if r.diff == nil {
			return
		}
		if cerr := r.diff.Close(); cerr != nil && err == nil {
			err = toStatus(fmt.Errorf("close snapshot: %w", cerr))
		}
	}()
	r.capacity, r.lineage = r.diff.Capacity(), lineageOf(r.diff)
	if start > r.capacity {
		return status.Errorf(codes.OutOfRange, msgOffsetBeyondSize, start, r.capacity)
	}

	trace := klog.FromContext(ctx).V(5)
	r.snd = startSender(func(page []*csi.BlockMetadata) error {
		if trace.Enabled() {
			trace.Info("Sending page", "tuples", len(page), "first", page[0].ByteOffset)
		}
		return send(r.capacity, page)
	}, d.opts.StallTimeout)
	sent := false
	defer func() {
		if !sent {
			_ = r.snd.wait() // on every error path: no goroutine left behind
		}
	}()
	r.p = newPager(d.opts.BlockMetadataType, d.opts.FixedBlockSize, start, r.capacity, pageSize, r.snd.put)
	began := time.Now()
	var diffTime time.Duration
	defer func() { r.finished(ctx, err, time.Since(began), diffTime) }()
	if start == r.capacity {
		return nil
	}
	err = r.iterate(ctx)
	diffTime = time.Since(began)
	if err != nil {
		return toStatus(err)
	}
	// A diff that returned without error has delivered every extent, but
	// a cancel that came in just then must not end the stream with OK
	// unless the rest was sent.
	if err := r.p.finish(); err != nil {
		return toStatus(err)
	}
	sent = true
	if err := r.snd.wait(); err != nil {
		return toStatus(err)
	}
	return toStatus(ctx.Err())
}

// checkStream checks what both RPCs share and returns the page size.
func checkStream(req OpenRequest, start int64, maxResults int32) (int, error) {
	if maxResults < 0 {
		return 0, status.Errorf(codes.InvalidArgument, msgNegativeMax, maxResults)
	}
	if err := checkSecrets(req.Secrets); err != nil {
		return 0, err
	}
	if start < 0 {
		return 0, status.Errorf(codes.OutOfRange, msgNegativeOffset, start)
	}
	pageSize := int(maxResults)
	if pageSize == 0 {
		pageSize = defaultPage
	}
	return min(pageSize, maxPage), nil
}

// finished logs the stream's summary line and reports it to the observer.
func (r *streamRun) finished(ctx context.Context, err error, took, diffTime time.Duration) {
	p := r.p
	kv := []any{"code", status.Code(err), "duration", took,
		"capacity", r.capacity, "startingOffset", r.start, "pages", p.pages, "tuples", p.tuples, "bytes", p.bytes,
		"resumes", r.resumes}
	if r.resumes > 0 || r.resuming > 0 {
		kv = append(kv, "resuming", r.resuming)
	}
	ref := mergeRefinement(r.ref, refinementOf(r.diff))
	if ref.On {
		kv = append(kv, refinementLog(ref)...)
	}
	klog.FromContext(ctx).V(2).Info("Stream finished", append(kv, "err", err)...)
	if o := r.d.opts.Observer; o != nil {
		o.Streamed(r.method, p.tuples, p.bytes, diffTime)
		if ro, ok := o.(RefinementObserver); ok && ref.On {
			ro.Refined(r.method, ref)
		}
	}
}

// refinementLog returns the key/value pairs of a stream's log line that
// say what precise mode did.
func refinementLog(r Refinement) []any {
	kv := []any{"refinedObjects", r.Objects}
	if r.Candidates != "" {
		kv = append(kv, "candidates", r.Candidates)
	}
	if r.Checksummed > 0 {
		kv = append(kv, "checksummedQueries", r.Checksummed)
	}
	if r.ImageFallback != "" {
		kv = append(kv, "imageFallback", r.ImageFallback, "imageFallbackDetail", r.ImageFallbackDetail)
	}
	var n int64
	for _, c := range r.ObjectFallbacks {
		n += c
	}
	if n > 0 {
		kv = append(kv, "objectFallbacks", n, "objectFallbackReasons", r.ObjectFallbacks, "lastObjectFallback", r.LastObjectFallback)
	}
	return kv
}
