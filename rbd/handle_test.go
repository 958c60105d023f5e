package rbd

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const testUUID = "87e86f14-231d-4ab2-aaeb-70608e7db6e6"

func TestParseHandle(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Handle
	}{
		{"0001-0002-c1-0000000000000001-" + testUUID, Handle{Cluster: "c1", PoolID: 1, UUID: testUUID}},
		// Rook's usual cluster ID, and a pool ID past 9.
		{"0001-0009-rook-ceph-000000000000000a-" + testUUID, Handle{Cluster: "rook-ceph", PoolID: 10, UUID: testUUID}},
		// A cluster ID that is an fsid, full of '-' and hex.
		{"0001-0024-7635de36-ab1f-4a70-98a2-a1bd80ba77c4-0000000000000006-6e696bba-064f-11ec-a251-0242ac110002",
			Handle{Cluster: "7635de36-ab1f-4a70-98a2-a1bd80ba77c4", PoolID: 6, UUID: "6e696bba-064f-11ec-a251-0242ac110002"}},
		// Upper-case hex, as hex.DecodeString in Ceph-CSI accepts it.
		{"0001-000B-rsm-e2e-ns1-00000000000000FF-" + strings.ToUpper(testUUID), Handle{Cluster: "rsm-e2e-ns1", PoolID: 255, UUID: strings.ToUpper(testUUID)}},
	} {
		got, err := ParseHandle(tc.in)
		if err != nil {
			t.Errorf("ParseHandle(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseHandle(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if back, err := ParseHandle(got.String()); err != nil || back != got {
			t.Errorf("ParseHandle(%q) = %+v, %v; want %+v", got.String(), back, err, got)
		}
	}
	if s := (Handle{Cluster: "c1", PoolID: 1, UUID: testUUID}).String(); s != "0001-0002-c1-0000000000000001-"+testUUID {
		t.Errorf("String() = %q", s)
	}
}

func TestParseHandleRejects(t *testing.T) {
	good := "0001-0002-c1-0000000000000001-" + testUUID
	for _, tc := range []struct{ in, why string }{
		{"", "too short"},
		{"0001-0002-c1", "too short"},
		{"0002-0002-c1-0000000000000001-" + testUUID, "unknown encoding version"},
		{"000g-0002-c1-0000000000000001-" + testUUID, "version"},
		{"0001-0003-c1-0000000000000001-" + testUUID, "length"},
		{"0001-0001-c1-0000000000000001-" + testUUID, "length"},
		{"0001-0000--0000000000000001-" + testUUID, "too short"},
		{"0001-0000-x-0000000000000001-" + testUUID, "empty cluster ID"},
		{"0001-00x2-c1-0000000000000001-" + testUUID, "cluster ID length"},
		{"0001_0002-c1-0000000000000001-" + testUUID, "'-'"},
		{"0001-0002-c1_0000000000000001-" + testUUID, "'-' around the pool ID"},
		{"0001-0002-c1-000000000000000g-" + testUUID, "pool ID"},
		{"0001-0002-c1-8000000000000000-" + testUUID, "negative pool ID"},
		{"0001-0002-c1-0000000000000001-" + strings.Replace(testUUID, "-", "x", 1), "uuid"},
		{"0001-0002-c1-0000000000000001-" + strings.Replace(testUUID, "a", "z", 1), "uuid"},
		{"0001-0002-c\x00-0000000000000001-" + testUUID, "NUL"},
		{good + "0", "length"},
		{good[:len(good)-1], "length"},
	} {
		_, err := ParseHandle(tc.in)
		if !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("ParseHandle(%q) = %v, want fs.ErrInvalid", tc.in, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.why) {
			t.Errorf("ParseHandle(%q) = %q, want it to mention %q", tc.in, err, tc.why)
		}
	}
}

// TestParseReferenceForms: native IDs always contain '/' and '@' and are
// never taken for handles; the rest are handles.
func TestParseReferenceForms(t *testing.T) {
	h := "0001-0002-c1-0000000000000001-" + testUUID
	for _, tc := range []struct {
		in     string
		handle bool
		ok     bool
	}{
		{h, true, true},
		{"c1/rbd/vol@snap", false, true},
		{"c1/rbd/ns1/vol@snap", false, true},
		// A native ID whose names look like handles is still native.
		{"c1/rbd/" + h + "@" + h, false, true},
		{h + "@snap", false, false}, // '@' makes it native, and malformed
		{"c1/rbd/vol", false, false},
		{"nope", true, false},
	} {
		r, err := parseReference(tc.in)
		if tc.ok != (err == nil) {
			t.Errorf("parseReference(%q) = %v, %v; want ok=%t", tc.in, r, err, tc.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("parseReference(%q): %v is not fs.ErrInvalid", tc.in, err)
			}
			if tc.handle != strings.Contains(err.Error(), "handle") {
				t.Errorf("parseReference(%q): %q; handle form expected: %t", tc.in, err, tc.handle)
			}
			continue
		}
		if _, isHandle := r.(Handle); isHandle != tc.handle {
			t.Errorf("parseReference(%q) = %T, want handle=%t", tc.in, r, tc.handle)
		}
	}
}

func FuzzParseHandle(f *testing.F) {
	f.Add("0001-0002-c1-0000000000000001-" + testUUID)
	f.Add("0001-0024-7635de36-ab1f-4a70-98a2-a1bd80ba77c4-0000000000000006-6e696bba-064f-11ec-a251-0242ac110002")
	f.Add("0001-ffff-c1-0000000000000001-" + testUUID)
	f.Add("0001-0002-c1-ffffffffffffffff-" + testUUID)
	f.Add("c1/rbd/vol@snap")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseHandle(s)
		if err != nil {
			if !errors.Is(err, fs.ErrInvalid) {
				t.Fatalf("ParseHandle(%q): %v is not fs.ErrInvalid", s, err)
			}
		} else {
			if h.PoolID < 0 || h.Cluster == "" || !isUUID(h.UUID) {
				t.Fatalf("ParseHandle(%q) = %+v", s, h)
			}
			back, err := ParseHandle(h.String())
			if err != nil || back != h {
				t.Fatalf("round trip of %q: %+v, %v; want %+v", s, back, err, h)
			}
			if !strings.EqualFold(h.String(), s) {
				t.Fatalf("ParseHandle(%q).String() = %q", s, h.String())
			}
		}
		r, err := parseReference(s)
		if err != nil {
			if !errors.Is(err, fs.ErrInvalid) {
				t.Fatalf("parseReference(%q): %v is not fs.ErrInvalid", s, err)
			}
			return
		}
		if r.clusterID() == "" {
			t.Fatalf("parseReference(%q) = %+v without a cluster ID", s, r)
		}
	})
}

// TestOpenHandleRejects: malformed handles and unknown cluster IDs fail
// before any connect.
func TestOpenHandleRejects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(`[{"clusterID": "c1", "monitors": ["127.0.0.1:1"]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := NewSource(Options{ConfigPath: path})
	defer s.Close()
	h := "0001-0002-c1-0000000000000001-" + testUUID
	for _, tc := range []struct {
		name string
		req  Request
		want error
		text string
	}{
		{"malformed target", Request{Target: "0001-0002-c1-0000000000000001-x", Secrets: goodSecrets}, fs.ErrInvalid, "target"},
		{"malformed base", Request{Base: "0001-0002", Target: h, Secrets: goodSecrets}, fs.ErrInvalid, "base"},
		{"unknown cluster", Request{Target: "0001-0002-c9-0000000000000001-" + testUUID, Secrets: goodSecrets}, fs.ErrNotExist, `"c9"`},
		{"clusters differ", Request{Base: "0001-0002-c2-0000000000000001-" + testUUID, Target: h, Secrets: goodSecrets}, fs.ErrInvalid, "different volumes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d, err := s.Open(ctx, tc.req)
			if err == nil {
				d.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("Open: %v; want %v mentioning %q", err, tc.want, tc.text)
			}
		})
	}
}

func TestSnapRefSameImageByID(t *testing.T) {
	native := snapRef{pool: "rbd", image: "csi-vol-1", snapName: "s"}
	handle := snapRef{pool: "rbd", image: "csi-vol-1", imageID: "abc", snapID: 7}
	renamed := snapRef{pool: "rbd", image: "csi-vol-x", imageID: "abc", snapID: 9}
	other := snapRef{pool: "rbd", image: "csi-vol-1", imageID: "def", snapID: 9}
	otherNS := snapRef{pool: "rbd", namespace: "ns1", image: "csi-vol-1", imageID: "abc", snapID: 9}
	for _, tc := range []struct {
		a, b snapRef
		want bool
	}{
		{native, handle, true}, {handle, native, true}, {handle, renamed, true},
		{handle, other, false}, {handle, otherNS, false}, {native, otherNS, false},
		{snapRef{pool: "rbd", imageID: "abc"}, native, false},
	} {
		if got := tc.a.sameImage(tc.b); got != tc.want {
			t.Errorf("%+v.sameImage(%+v) = %t, want %t", tc.a, tc.b, got, tc.want)
		}
	}
}
