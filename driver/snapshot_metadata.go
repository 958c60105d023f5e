package driver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
