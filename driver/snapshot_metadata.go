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

// stream runs one diff and sends its pages; both RPCs end here. Every
// error leaves through toStatus.
func (d *Driver) stream(ctx context.Context, method string, req OpenRequest, start int64, maxResults int32,
	send func(capacity int64, page []*csi.BlockMetadata) error) (err error) {
	if maxResults < 0 {
		return status.Errorf(codes.InvalidArgument, msgNegativeMax, maxResults)
	}
	if err := checkSecrets(req.Secrets); err != nil {
		return err
	}
	if start < 0 {
		return status.Errorf(codes.OutOfRange, msgNegativeOffset, start)
	}
	pageSize := int(maxResults)
	if pageSize == 0 {
		pageSize = defaultPage
	}
	pageSize = min(pageSize, maxPage)

	diff, err := d.src.Open(ctx, req)
	if err != nil {
		return toStatus(err)
	}
	defer func() {
		if cerr := diff.Close(); cerr != nil && err == nil {
			err = toStatus(fmt.Errorf("close snapshot: %w", cerr))
		}
	}()
	capacity := diff.Capacity()
	if start > capacity {
		return status.Errorf(codes.OutOfRange, msgOffsetBeyondSize, start, capacity)
	}

	logger := klog.FromContext(ctx)
	trace := logger.V(5)
	snd := startSender(func(page []*csi.BlockMetadata) error {
		if trace.Enabled() {
			trace.Info("Sending page", "tuples", len(page), "first", page[0].ByteOffset)
		}
		return send(capacity, page)
	}, d.opts.StallTimeout)
	sent := false
	defer func() {
		if !sent {
			_ = snd.wait() // on every error path: no goroutine left behind
		}
	}()
	p := newPager(d.opts.BlockMetadataType, d.opts.FixedBlockSize, start, capacity, pageSize, snd.put)
	began := time.Now()
	var diffTime time.Duration
	defer func() {
		kv := []any{"code", status.Code(err), "duration", time.Since(began),
			"capacity", capacity, "startingOffset", start, "pages", p.pages, "tuples", p.tuples, "bytes", p.bytes}
		var ref Refinement
		if r, ok := diff.(Refiner); ok {
			ref = r.Refinement()
		}
		if ref.On {
			kv = append(kv, refinementLog(ref)...)
		}
		logger.V(2).Info("Stream finished", append(kv, "err", err)...)
		if d.opts.Observer != nil {
			d.opts.Observer.Streamed(method, p.tuples, p.bytes, diffTime)
			if ro, ok := d.opts.Observer.(RefinementObserver); ok && ref.On {
				ro.Refined(method, ref)
			}
		}
	}()
	if start == capacity {
		return nil
	}
	err = diff.Iterate(ctx, start, p.add)
	diffTime = time.Since(began)
	if err != nil {
		return toStatus(err)
	}
	// A diff that returned without error has delivered every extent, but
	// a cancel that came in just then must not end the stream with OK
	// unless the rest was sent.
	if err := p.finish(); err != nil {
		return toStatus(err)
	}
	sent = true
	if err := snd.wait(); err != nil {
		return toStatus(err)
	}
	return toStatus(ctx.Err())
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
