package rbd

import (
	"errors"
	"io/fs"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ID
		bad  bool
	}{
		{in: "c1/rbd/vol@s1", want: ID{Cluster: "c1", Pool: "rbd", Image: "vol", Snapshot: "s1"}},
		{in: "c1/rbd/ns1/vol@s1", want: ID{Cluster: "c1", Pool: "rbd", Namespace: "ns1", Image: "vol", Snapshot: "s1"}},
		{in: "fsid-1234/replica pool/csi-vol-x@csi-snap.1", want: ID{Cluster: "fsid-1234", Pool: "replica pool", Image: "csi-vol-x", Snapshot: "csi-snap.1"}},
		{in: "", bad: true},
		{in: "c1/rbd/vol", bad: true},
		{in: "c1/rbd/vol@", bad: true},
		{in: "c1/rbd@s", bad: true},
		{in: "rbd/vol@s", bad: true},
		{in: "c1/rbd/ns/x/vol@s", bad: true},
		{in: "c1//vol@s", bad: true},
		{in: "/rbd/vol@s", bad: true},
		{in: "c1/rbd/vol/@s", bad: true},
		{in: "c1/rbd/vol@s@t", bad: true},
		{in: "c1/rbd/vol@s/t", bad: true},
		{in: "c1/rbd/v\x00l@s", bad: true},
		{in: "0001-0002-c1-0000000000000001-87e86f14-231d-4ab2-aaeb-70608e7db6e6", bad: true},
	} {
		got, err := ParseID(tc.in)
		if tc.bad {
			if !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("ParseID(%q) = %+v, %v; want fs.ErrInvalid", tc.in, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseID(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseID(%q) (-want +got):\n%s", tc.in, diff)
		}
		if s := got.String(); s != tc.in {
			t.Errorf("ParseID(%q).String() = %q", tc.in, s)
		}
	}
}

// refID is a naive reference for ParseID.
var refID = regexp.MustCompile(`^([^/@\x00]+)/([^/@\x00]+)(?:/([^/@\x00]+))?/([^/@\x00]+)@([^/@\x00]+)$`)

func FuzzParseID(f *testing.F) {
	for _, s := range []string{
		"c1/rbd/vol@s1", "c1/rbd/ns1/vol@s1", "c1/rbd/vol", "@", "/", "a/b/c/d/e@f",
		"c1//vol@s", "c1/rbd/vol@s@t", "0001-0002-c1-0000000000000001-87e86f14",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseID(s)
		m := refID.FindStringSubmatch(s)
		if err != nil {
			if !errors.Is(err, fs.ErrInvalid) {
				t.Fatalf("ParseID(%q): error %v is not fs.ErrInvalid", s, err)
			}
			if m != nil {
				t.Fatalf("ParseID(%q): %v, but the reference accepts it", s, err)
			}
			return
		}
		if m == nil {
			t.Fatalf("ParseID(%q) = %+v, but the reference rejects it", s, got)
		}
		want := ID{Cluster: m[1], Pool: m[2], Namespace: m[3], Image: m[4], Snapshot: m[5]}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("ParseID(%q) (-reference +got):\n%s", s, diff)
		}
		if got.String() != s {
			t.Fatalf("ParseID(%q).String() = %q", s, got.String())
		}
		again, err := ParseID(got.String())
		if err != nil || again != got {
			t.Fatalf("re-parse of %q = %+v, %v", got.String(), again, err)
		}
	})
}
