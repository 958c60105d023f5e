package conformance_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client/conformance"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver/drivertest"
)

func dial(t *testing.T, srv csi.SnapshotMetadataServer) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	csi.RegisterSnapshotMetadataServer(s, srv)
	go func() { _ = s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); s.Stop() })
	return conn
}

func ourServer(t *testing.T, typ csi.BlockMetadataType) *grpc.ClientConn {
	src := drivertest.NewSource()
	ext := []driver.Extent{{Offset: 0, Length: 4096}, {Offset: 4096, Length: 100}, {Offset: 1 << 20, Length: 3 << 20}, {Offset: 9 << 20, Length: 512}}
	src.Add(&drivertest.Volume{Capacity: 16 << 20,
		Allocated: map[string][]driver.Extent{"a": ext[:2], "b": ext},
		Delta:     map[string][]driver.Extent{"a>b": ext[2:]}})
	d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: typ, FixedBlockSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return dial(t, d)
}

func TestOurServerConforms(t *testing.T) {
	for _, typ := range []csi.BlockMetadataType{csi.BlockMetadataType_VARIABLE_LENGTH, csi.BlockMetadataType_FIXED_LENGTH} {
		for _, target := range []conformance.Target{{Snapshot: "b", Missing: "zz"}, {Base: "a", Snapshot: "b", Missing: "zz"}} {
			rep, err := conformance.Run(context.Background(), ourServer(t, typ), target)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK() || len(rep.Results) < 12 {
				t.Errorf("%v %+v:\n%s", typ, target, rep)
			}
		}
	}
}

// broken breaks one rule of the spec.
type broken struct {
	csi.UnimplementedSnapshotMetadataServer
	rule string
}

func (b *broken) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, s csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	send := func(typ csi.BlockMetadataType, capacity int64, ts ...*csi.BlockMetadata) error {
		return s.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: typ, VolumeCapacityBytes: capacity, BlockMetadata: ts})
	}
	v := csi.BlockMetadataType_VARIABLE_LENGTH
	const c = 1 << 20
	switch b.rule {
	case "overlap":
		return send(v, c, &csi.BlockMetadata{ByteOffset: 0, SizeBytes: 8192}, &csi.BlockMetadata{ByteOffset: 4096, SizeBytes: 4096})
	case "big pages":
		// ignores max_results
		return send(v, c, &csi.BlockMetadata{ByteOffset: 0, SizeBytes: 4096}, &csi.BlockMetadata{ByteOffset: 8192, SizeBytes: 4096})
	case "capacity changes":
		if err := send(v, c, &csi.BlockMetadata{ByteOffset: 0, SizeBytes: 4096}); err != nil {
			return err
		}
		return send(v, c*2, &csi.BlockMetadata{ByteOffset: 8192, SizeBytes: 4096})
	case "ignores starting_offset":
		// sends everything, whatever starting_offset asks: the first tuple
		// may end before it
		return send(v, c, &csi.BlockMetadata{ByteOffset: 0, SizeBytes: 4096}, &csi.BlockMetadata{ByteOffset: 8192, SizeBytes: 4096})
	}
	return nil
}

func TestViolationsAreReported(t *testing.T) {
	for rule, want := range map[string]string{
		"overlap":                 "overlaps or precedes",
		"big pages":               "more than max_results 1",
		"capacity changes":        "but page 0 had",
		"ignores starting_offset": "ends before starting_offset",
	} {
		rep, err := conformance.Run(context.Background(), dial(t, &broken{rule: rule}), conformance.Target{Snapshot: "x"})
		if err != nil {
			t.Fatalf("%s: %v", rule, err)
		}
		if rep.OK() || !strings.Contains(rep.String(), want) {
			t.Errorf("%s: the report lacks %q:\n%s", rule, want, rep)
		}
		// It never answers OUT_OF_RANGE or INVALID_ARGUMENT either.
		if !strings.Contains(rep.String(), "FAIL  negative max_results is InvalidArgument") {
			t.Errorf("%s: bad input accepted but not reported:\n%s", rule, rep)
		}
	}
}
