// Package driver serves the CSI SnapshotMetadata and Identity services on
// top of a Source of snapshot diffs.
//
// Each RPC opens a diff of its Source and iterates it from the request's
// starting_offset to the end of the volume, streaming the extents as they
// arrive, in pages of at most max_results tuples (see pager). One diff runs
// at a time, but an RPC may open several, one after another: a diff that
// fails with an error that goes away by itself is closed, opened again and
// iterated from where the stream stopped, and a first open that fails so
// is retried, all within Options.ResumeBudget (see resume.go). A sender
// goroutine sends the pages, so that encoding overlaps the diff; when the
// client does not take them, the diff waits: memory stays at most three
// pages, whatever the size of the volume. A stream ends with OK only when
// every extent has been sent; a cancelled call, a failed send or a diff
// error that is not resumed stops the diff at once and ends the stream
// with an error. A client that takes no page for Options.StallTimeout gets
// DEADLINE_EXCEEDED, and its diff is stopped and closed.
//
// The package needs no cgo: Ceph is behind the Source interface, and the
// tests use a fake.
package driver

import (
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/container-storage-interface/spec/lib/go/csi"
)

// Page sizes, in tuples. An encoded tuple takes at most 24 bytes, so a page
// of maxPage tuples stays far below gRPC's 4 MiB default message limit,
// whatever max_results asks for.
const (
	defaultPage = 16384
	maxPage     = 65536
)

// Options configure a Driver.
type Options struct {
	// Name is the CSI driver name that Identity reports; it must equal the
	// driver of the VolumeSnapshotContents (rbd.csi.ceph.com).
	Name string
	// Version is the vendor version that Identity reports.
	Version string
	// BlockMetadataType is the style of every stream: FIXED_LENGTH or
	// VARIABLE_LENGTH.
	BlockMetadataType csi.BlockMetadataType
	// FixedBlockSize is the size of a FIXED_LENGTH tuple, in bytes.
	FixedBlockSize int64
	// Ready tells whether the driver can serve; Probe reports it. Nil means
	// always ready.
	Ready func() error
	// Observer, when set, is told what each stream sent.
	Observer Observer
	// StallTimeout ends a stream with DEADLINE_EXCEEDED when its client
	// takes no page for that long, releasing the diff. 0: no limit.
	StallTimeout time.Duration
	// ResumeBudget is how long, in all, one stream may spend re-opening
	// its diff after errors that go away by themselves (see Source), in
	// backoffs and re-opens, before it ends with UNAVAILABLE; a request's
	// first open is retried within it too (see Source). 0: such an
	// error ends the stream at once, with UNAVAILABLE.
	ResumeBudget time.Duration
	// NewBackOff makes the backoff between the re-opens of one stream.
	// Default: exponential, 1 s doubling to at most 10 s, each wait
	// randomized by ±50%.
	NewBackOff func() backoff.BackOff
}

// Observer receives the figures of each finished stream, for metrics.
type Observer interface {
	// Streamed reports the tuples and bytes that one stream of method sent
	// and how long its diff ran.
	Streamed(method string, tuples int, bytes int64, diff time.Duration)
}

// RefinementObserver is an Observer that also records what precise mode
// did in each stream (see Refinement). The driver calls it when its
// Observer implements it and the Diff reports a refinement.
type RefinementObserver interface {
	Refined(method string, r Refinement)
}

// ResumeObserver is an Observer that also records each resume of a
// stream: the short reason of the error that caused it, how long it took
// from the failure to the re-opened diff (or to the stream's end), and
// whether the stream went on.
type ResumeObserver interface {
	Resumed(method, reason string, took time.Duration, ok bool)
}

// The method names that Observer is given.
const (
	MethodAllocated = "GetMetadataAllocated"
	MethodDelta     = "GetMetadataDelta"
)

// Driver implements csi.IdentityServer and csi.SnapshotMetadataServer.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedSnapshotMetadataServer

	src  Source
	opts Options
}

// New returns a Driver that serves the snapshots of src.
func New(src Source, opts Options) (*Driver, error) {
	switch opts.BlockMetadataType {
	case csi.BlockMetadataType_VARIABLE_LENGTH:
	case csi.BlockMetadataType_FIXED_LENGTH:
		if opts.FixedBlockSize <= 0 {
			return nil, fmt.Errorf("fixed block size must be positive, got %d", opts.FixedBlockSize)
		}
	default:
		return nil, fmt.Errorf("unsupported block metadata type %v", opts.BlockMetadataType)
	}
	if opts.Name == "" {
		return nil, fmt.Errorf("driver name is required")
	}
	return &Driver{src: src, opts: opts}, nil
}
