package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The messages of the statuses that the driver itself decides. Errors of
// the Source keep their own text, which names what was not found or what
// was wrong.
const (
	msgNoSnapshotID     = "snapshot_id is required"
	msgNoBaseID         = "base_snapshot_id is required"
	msgNoTargetID       = "target_snapshot_id is required"
	msgNegativeMax      = "max_results must not be negative, got %d"
	msgNegativeOffset   = "starting_offset must not be negative, got %d"
	msgOffsetBeyondSize = "starting_offset %d is beyond the volume's size of %d bytes"
	msgIDTooLong        = "%s is %d bytes long, beyond the CSI limit of %d bytes: %q"
	msgSecretsTooLarge  = "secrets are %d bytes long, beyond the CSI limit of %d bytes"
	msgStalled          = "the client took no page for %v, so the server ended the stream (--stall-timeout); " +
		"resume from the byte after the last tuple received"
	msgResumeBudget = "the stream's diff kept failing, and the server gave up resuming it after its --resume-budget of %v: " +
		"it tried for %v (%d re-opens in the last outage); resume from the byte after the last tuple received. Last error: %v"
	msgLineageChanged = "the snapshots' parents changed while the stream was being resumed (a parent flattened meanwhile?), " +
		"so what was sent may miss changes: ask again"
	msgSeamMismatch = "the stream's diff failed and was resumed, and the resumed diff has changes before offset %d that were not sent " +
		"(in %d+%d): what was sent misses changes: ask again"
	msgCapacityChanged = "the snapshot's size changed from %d to %d bytes between two opens of one stream; snapshots are immutable"
)

var (
	errBadExtent   = errors.New("snapshot source returned an invalid extent")
	errExtentOrder = errors.New("snapshot source returned extents out of order")
)

// toStatus turns any error of an RPC into its gRPC status. It is the one
// place where errors get their codes: the spec's codes for the spec's
// conditions, the context's code for a cancelled or expired call, and
// INTERNAL for the rest.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var (
		code    codes.Code
		stalled *stallError
	)
	switch {
	case errors.As(err, &stalled):
		// DEADLINE_EXCEEDED: the server's deadline for taking a page
		// expired; retryable, and a client that reads resumes.
		return status.Error(codes.DeadlineExceeded, stalled.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, fs.ErrNotExist):
		code = codes.NotFound
	case errors.Is(err, fs.ErrInvalid):
		code = codes.InvalidArgument
	case unauthenticated(err):
		code = codes.Unauthenticated
	case aborted(err):
		code = codes.Aborted
	case errors.Is(err, fs.ErrPermission):
		code = codes.PermissionDenied
	case errors.Is(err, errors.ErrUnsupported):
		code = codes.FailedPrecondition
	case errors.Is(err, os.ErrDeadlineExceeded), temporary(err):
		code = codes.Unavailable
	default:
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}

// aborted reports whether err says that another client changed a snapshot
// while the diff read it (see Source).
func aborted(err error) bool {
	var a interface{ Aborted() bool }
	return errors.As(err, &a) && a.Aborted()
}

// unauthenticated reports whether err says that the request's credentials
// were refused (see Source).
func unauthenticated(err error) bool {
	var u interface{ Unauthenticated() bool }
	return errors.As(err, &u) && u.Unauthenticated()
}
