// Package conformance checks any CSI SnapshotMetadata server against the
// spec's rules for its streams, on snapshots that the caller names.
//
// Run reads the same allocated or delta stream many ways (several
// max_results, several starting offsets, cut and resumed after each tuple)
// and sends requests that must fail, and reports every violation of:
//
//   - ascending, non-overlapping tuples, within and across pages;
//   - one block_metadata_type and one volume_capacity_bytes per stream;
//   - FIXED_LENGTH tuples of one size;
//   - pages of at most max_results tuples, none empty;
//   - a first tuple that ends after starting_offset;
//   - the same data whatever max_results and however the stream is resumed;
//   - the spec's error codes for bad input.
//
// It reads the snapshots only through the server, so it needs no access to
// the storage behind it.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Target names what to check.
type Target struct {
	// Base is the older snapshot of a delta; empty checks allocated.
	Base string
	// Snapshot is the target snapshot.
	Snapshot string
	// Missing, when set, is a well-formed snapshot ID that does not
	// exist, for the NOT_FOUND check.
	Missing string
	// Secrets go with every request.
	Secrets map[string]string
	// MaxResumes caps the resumed streams of the resume check, which makes
	// one request per tuple. Default 200.
	MaxResumes int
}

// Result is one check's outcome.
type Result struct {
	Check      string
	Violations []string
}

// OK tells whether the check passed.
func (r Result) OK() bool { return len(r.Violations) == 0 }

// Report is the outcome of Run.
type Report struct {
	Results []Result
	// Type, Capacity, Tuples and Bytes describe the reference stream.
	Type     csi.BlockMetadataType
	Capacity int64
	Tuples   int
	Bytes    int64
}

// OK tells whether every check passed.
func (r Report) OK() bool {
	for _, c := range r.Results {
		if !c.OK() {
			return false
		}
	}
	return true
}

// String prints one line per check, and the violations under it.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "reference stream: %v, capacity %d, %d tuples, %d bytes\n", r.Type, r.Capacity, r.Tuples, r.Bytes)
	for _, c := range r.Results {
		if c.OK() {
			fmt.Fprintf(&b, "PASS  %s\n", c.Check)
			continue
		}
		fmt.Fprintf(&b, "FAIL  %s\n", c.Check)
		for _, v := range c.Violations {
			fmt.Fprintf(&b, "      - %s\n", v)
		}
	}
	return b.String()
}

// tuple is one BlockMetadata.
type tuple struct{ off, size int64 }

func (t tuple) end() int64 { return t.off + t.size }

// stream is one RPC as the client saw it.
type stream struct {
	pages    [][]tuple
	types    []csi.BlockMetadataType
	capacity []int64
	err      error
}

func (s stream) tuples() []tuple {
	var all []tuple
	for _, p := range s.pages {
		all = append(all, p...)
	}
	return all
}

// checker runs requests against one server for one Target.
type checker struct {
	c   csi.SnapshotMetadataClient
	t   Target
	rep *Report
}

// Run checks the server on conn with the snapshots of t. An error means
// the checks could not run at all (the reference stream failed); the
// violations are in the Report.
func Run(ctx context.Context, conn grpc.ClientConnInterface, t Target) (Report, error) {
	if t.MaxResumes <= 0 {
		t.MaxResumes = 200
	}
	k := &checker{c: csi.NewSnapshotMetadataClient(conn), t: t, rep: &Report{}}
	ref := k.read(ctx, 0, 0)
	if ref.err != nil {
		return *k.rep, fmt.Errorf("the reference stream failed: %w", ref.err)
	}
	all := ref.tuples()
	k.rep.Tuples = len(all)
	for _, x := range all {
		k.rep.Bytes += x.size
	}
	if len(ref.types) > 0 {
		k.rep.Type, k.rep.Capacity = ref.types[0], ref.capacity[0]
	} else {
		c, err := k.capacity(ctx)
		if err != nil {
			return *k.rep, err
		}
		k.rep.Capacity = c
	}
	k.invariants(ctx, all)
	k.offsets(ctx, all)
	k.resume(ctx, all)
	k.errors(ctx)
	return *k.rep, nil
}

// capacity learns the volume's size when the reference stream was empty:
// a stream from offset 0 has no message to tell it, so ask for the
// allocated blocks of the target, which name it unless they are empty too.
func (k *checker) capacity(ctx context.Context) (int64, error) {
	s := k.rpc(ctx, "", k.t.Snapshot, 0, 1)
	if s.err != nil || len(s.capacity) == 0 {
		return 0, fmt.Errorf("cannot learn the volume's capacity: the snapshot has no allocated blocks (%v)", s.err)
	}
	return s.capacity[0], nil
}

func (k *checker) add(check string, violations []string) {
	k.rep.Results = append(k.rep.Results, Result{Check: check, Violations: violations})
}

// read runs the Target's RPC from start with max results.
func (k *checker) read(ctx context.Context, start int64, max int32) stream {
	return k.rpc(ctx, k.t.Base, k.t.Snapshot, start, max)
}

func (k *checker) rpc(ctx context.Context, base, target string, start int64, max int32) stream {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type response interface {
		GetBlockMetadataType() csi.BlockMetadataType
		GetVolumeCapacityBytes() int64
		GetBlockMetadata() []*csi.BlockMetadata
	}
	var recv func() (response, error)
	if base == "" {
		s, err := k.c.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: target, StartingOffset: start, MaxResults: max, Secrets: k.t.Secrets})
		if err != nil {
			return stream{err: err}
		}
		recv = func() (response, error) { return s.Recv() }
	} else {
		s, err := k.c.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: start, MaxResults: max, Secrets: k.t.Secrets})
		if err != nil {
			return stream{err: err}
		}
		recv = func() (response, error) { return s.Recv() }
	}
	var s stream
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return s
		}
		if err != nil {
			s.err = err
			return s
		}
		var page []tuple
		for _, b := range m.GetBlockMetadata() {
			page = append(page, tuple{b.GetByteOffset(), b.GetSizeBytes()})
		}
		s.pages = append(s.pages, page)
		s.types = append(s.types, m.GetBlockMetadataType())
		s.capacity = append(s.capacity, m.GetVolumeCapacityBytes())
	}
}

// violations checks one stream read from start with max results.
func (k *checker) violations(s stream, start int64, max int32) []string {
	var v []string
	if s.err != nil {
		return []string{fmt.Sprintf("the stream failed: %v", s.err)}
	}
	var prev *tuple
	var size int64
	for i, page := range s.pages {
		if len(page) == 0 {
			v = append(v, fmt.Sprintf("page %d is empty", i))
		}
		if max > 0 && len(page) > int(max) {
			v = append(v, fmt.Sprintf("page %d has %d tuples, more than max_results %d", i, len(page), max))
		}
		if s.types[i] != s.types[0] || s.capacity[i] != s.capacity[0] {
			v = append(v, fmt.Sprintf("page %d: type %v and capacity %d, but page 0 had %v and %d", i, s.types[i], s.capacity[i], s.types[0], s.capacity[0]))
		}
		if s.types[i] != csi.BlockMetadataType_FIXED_LENGTH && s.types[i] != csi.BlockMetadataType_VARIABLE_LENGTH {
			v = append(v, fmt.Sprintf("page %d: block_metadata_type %v", i, s.types[i]))
		}
		if s.capacity[i] != k.rep.Capacity {
			v = append(v, fmt.Sprintf("page %d: capacity %d, but the reference stream's is %d", i, s.capacity[i], k.rep.Capacity))
		}
		for _, t := range page {
			switch {
			case t.size <= 0 || t.off < 0:
				v = append(v, fmt.Sprintf("page %d: tuple %d+%d is empty or negative", i, t.off, t.size))
			case prev == nil && t.end() <= start:
				v = append(v, fmt.Sprintf("the first tuple %d+%d ends before starting_offset %d", t.off, t.size, start))
			case prev != nil && t.off < prev.end():
				v = append(v, fmt.Sprintf("page %d: tuple %d+%d overlaps or precedes %d+%d", i, t.off, t.size, prev.off, prev.size))
			}
			if t.off >= s.capacity[i] {
				v = append(v, fmt.Sprintf("page %d: tuple %d+%d starts beyond the capacity %d", i, t.off, t.size, s.capacity[i]))
			}
			if s.types[i] == csi.BlockMetadataType_FIXED_LENGTH {
				if size == 0 {
					size = t.size
				} else if t.size != size {
					v = append(v, fmt.Sprintf("page %d: FIXED_LENGTH tuple %d+%d, but earlier tuples had size %d", i, t.off, t.size, size))
				}
			}
			t := t
			prev = &t
		}
	}
	return v
}

// invariants reads the stream with several max_results and checks each,
// and that they all describe the same data.
func (k *checker) invariants(ctx context.Context, ref []tuple) {
	for _, max := range []int32{0, 1, 3, 1000} {
		s := k.read(ctx, 0, max)
		v := k.violations(s, 0, max)
		if s.err == nil {
			v = append(v, same(k.rep.Type, ref, s.tuples(), fmt.Sprintf("max_results %d", max))...)
		}
		k.add(fmt.Sprintf("stream invariants with max_results %d", max), v)
	}
}

// offsets reads from several starting offsets: each stream must hold the
// reference's data from that offset on, and the edges must give the
// spec's answers.
func (k *checker) offsets(ctx context.Context, ref []tuple) {
	c := k.rep.Capacity
	starts := []int64{1, c / 2, c - 1}
	if len(ref) > 0 {
		starts = append(starts, ref[0].off+ref[0].size/2, ref[len(ref)-1].off+1)
	}
	for _, start := range starts {
		if start <= 0 || start >= c {
			continue
		}
		s := k.read(ctx, start, 0)
		v := k.violations(s, start, 0)
		if s.err == nil {
			want, got := from(k.rep.Type, ref, start), from(k.rep.Type, s.tuples(), start)
			// A FIXED_LENGTH block that holds start may hold data only
			// before it: a server that knows so may leave the block out.
			if len(want) > 0 && want[0].off < start && (len(got) == 0 || got[0] != want[0]) {
				want = want[1:]
			}
			v = append(v, same(k.rep.Type, want, got, fmt.Sprintf("starting_offset %d", start))...)
		}
		k.add(fmt.Sprintf("starting_offset %d", start), v)
	}
	s := k.read(ctx, c, 0)
	var v []string
	if s.err != nil {
		v = append(v, fmt.Sprintf("starting_offset == capacity (%d) failed: %v; the spec allows it, and the stream is empty", c, s.err))
	} else if n := len(s.tuples()); n > 0 {
		v = append(v, fmt.Sprintf("starting_offset == capacity (%d) gave %d tuples", c, n))
	}
	k.add("starting_offset == capacity gives an empty stream", v)
	k.wantCode(ctx, "starting_offset beyond the capacity", codes.OutOfRange, k.t.Base, k.t.Snapshot, c+1, 0)
	k.wantCode(ctx, "negative starting_offset", codes.OutOfRange, k.t.Base, k.t.Snapshot, -1, 0)
}

// resume cuts the stream after every tuple and goes on from the next byte,
// as a client does after a broken stream; the tuples received must add up
// to the reference stream.
func (k *checker) resume(ctx context.Context, ref []tuple) {
	var got []tuple
	var v []string
	next := int64(0)
	for i := 0; ; i++ {
		if i == k.t.MaxResumes {
			v = append(v, fmt.Sprintf("gave up after %d resumed streams (MaxResumes); checked the first %d tuples", i, len(got)))
			ref = nil
			break
		}
		s := k.read(ctx, next, 1)
		if s.err != nil {
			v = append(v, fmt.Sprintf("resumed stream from %d failed: %v", next, s.err))
			break
		}
		all := s.tuples()
		if len(all) == 0 {
			break
		}
		t := all[0]
		if t.end() <= next {
			v = append(v, fmt.Sprintf("resumed stream from %d starts with tuple %d+%d, which ends before it", next, t.off, t.size))
			break
		}
		got = append(got, t)
		next = t.end()
	}
	if ref != nil {
		v = append(v, same(k.rep.Type, ref, got, "the stream resumed after every tuple")...)
	}
	k.add("resumed after every tuple equals the uninterrupted stream", v)
}

// errors sends requests the spec wants refused.
func (k *checker) errors(ctx context.Context) {
	k.wantCode(ctx, "negative max_results", codes.InvalidArgument, k.t.Base, k.t.Snapshot, 0, -1)
	if k.t.Base == "" {
		k.wantCode(ctx, "empty snapshot_id", codes.InvalidArgument, "", "", 0, 0)
	} else {
		k.wantCodeDelta(ctx, "empty base_snapshot_id", codes.InvalidArgument, "", k.t.Snapshot)
		k.wantCodeDelta(ctx, "empty target_snapshot_id", codes.InvalidArgument, k.t.Base, "")
	}
	if k.t.Missing != "" {
		k.wantCode(ctx, "unknown snapshot", codes.NotFound, "", k.t.Missing, 0, 0)
		if k.t.Base != "" {
			k.wantCodeDelta(ctx, "unknown base snapshot", codes.NotFound, k.t.Missing, k.t.Snapshot)
		}
	}
}

func (k *checker) wantCode(ctx context.Context, check string, want codes.Code, base, target string, start int64, max int32) {
	s := k.rpc(ctx, base, target, start, max)
	k.add(fmt.Sprintf("%s is %v", check, want), codeViolation(s, want))
}

func (k *checker) wantCodeDelta(ctx context.Context, check string, want codes.Code, base, target string) {
	var s stream
	st, err := k.c.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, Secrets: k.t.Secrets})
	if err == nil {
		for {
			if _, err = st.Recv(); err != nil {
				break
			}
		}
		if !errors.Is(err, io.EOF) {
			s.err = err
		}
	} else {
		s.err = err
	}
	k.add(fmt.Sprintf("%s is %v", check, want), codeViolation(s, want))
}

func codeViolation(s stream, want codes.Code) []string {
	if got := status.Code(s.err); got != want {
		return []string{fmt.Sprintf("got %v (%v), want %v", got, s.err, want)}
	}
	if status.Convert(s.err).Message() == "" {
		return []string{"the status has no message to help the user"}
	}
	return nil
}

// from keeps what a stream from start must hold: the tuples that end after
// it, VARIABLE_LENGTH ones clipped to it.
func from(typ csi.BlockMetadataType, ts []tuple, start int64) []tuple {
	var out []tuple
	for _, t := range ts {
		if t.end() <= start {
			continue
		}
		if t.off < start && typ == csi.BlockMetadataType_VARIABLE_LENGTH {
			t = tuple{start, t.end() - start}
		}
		out = append(out, t)
	}
	return out
}

// same compares two streams' data: FIXED_LENGTH tuple by tuple;
// VARIABLE_LENGTH by the bytes covered, as servers may split or merge
// adjacent extents differently.
func same(typ csi.BlockMetadataType, want, got []tuple, what string) []string {
	if typ == csi.BlockMetadataType_VARIABLE_LENGTH {
		want, got = merged(want), merged(got)
	}
	for i := 0; i < len(want) || i < len(got); i++ {
		switch {
		case i >= len(got):
			return []string{fmt.Sprintf("%s: missing %d+%d and %d more ranges of the reference", what, want[i].off, want[i].size, len(want)-i-1)}
		case i >= len(want):
			return []string{fmt.Sprintf("%s: extra %d+%d and %d more ranges not in the reference", what, got[i].off, got[i].size, len(got)-i-1)}
		case want[i] != got[i]:
			return []string{fmt.Sprintf("%s: range %d is %d+%d, the reference has %d+%d", what, i, got[i].off, got[i].size, want[i].off, want[i].size)}
		}
	}
	return nil
}

// merged joins adjacent or overlapping tuples.
func merged(ts []tuple) []tuple {
	var out []tuple
	for _, t := range ts {
		if n := len(out); n > 0 && t.off <= out[n-1].end() {
			out[n-1].size = max(out[n-1].end(), t.end()) - out[n-1].off
			continue
		}
		out = append(out, t)
	}
	return out
}
