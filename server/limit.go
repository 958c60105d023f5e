package server

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// msgTooManyStreams is the status of a stream refused by the limit. The
// code is ABORTED: retryable, as the CSI spec's review suggested for a
// server at its limit, and the sidecar passes it to its client unchanged.
const msgTooManyStreams = "the server is already serving its limit of %d streams (--max-streams): " +
	"nothing was read; retry later, with backoff"

// streamLimit bounds the SnapshotMetadata streams served at once. A stream
// beyond the limit is refused at once, before the driver does any cluster
// work; it never waits for a slot, so that a burst costs nothing but the
// refusals.
type streamLimit struct {
	max   int
	slots chan struct{}
}

// newStreamLimit returns a limit of max streams; max <= 0 is no limit.
func newStreamLimit(max int) *streamLimit {
	if max <= 0 {
		return nil
	}
	return &streamLimit{max: max, slots: make(chan struct{}, max)}
}

// limited tells whether a method counts against the limit: the
// SnapshotMetadata RPCs, not Identity or health.
func limited(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/csi.v1.SnapshotMetadata/")
}

// acquire takes a slot, or returns the ABORTED status when none is free.
// The caller releases a slot it took.
func (l *streamLimit) acquire() error {
	if l == nil {
		return nil
	}
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
		return status.Errorf(codes.Aborted, msgTooManyStreams, l.max)
	}
}

func (l *streamLimit) release() {
	if l != nil {
		<-l.slots
	}
}
