package rbd

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const secretKey = "AQA5pQxrGkLPIhAAH5Kb9DVHbQG5jxVwOxfINg=="

var goodSecrets = map[string]string{SecretUserID: "admin", SecretUserKey: secretKey}

// TestOpenRejects covers the errors Open finds before it connects.
func TestOpenRejects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	cfg := `[{"clusterID": "c1", "monitors": ["127.0.0.1:1"]}, {"clusterID": "c2", "monitors": []}]`
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	s := NewSource(Options{ConfigPath: path})
	defer s.Close()

	for _, tc := range []struct {
		name string
		req  Request
		want error // nil: unclassified
		text string
	}{
		{"bad target", Request{Target: "nope", Secrets: goodSecrets}, fs.ErrInvalid, "target"},
		{"bad base", Request{Base: "c1/rbd/vol", Target: "c1/rbd/vol@s", Secrets: goodSecrets}, fs.ErrInvalid, "base"},
		{"clusters differ", Request{Base: "c2/rbd/vol@a", Target: "c1/rbd/vol@b", Secrets: goodSecrets}, fs.ErrInvalid, "different volumes"},
		{"images differ", Request{Base: "c1/rbd/vol1@a", Target: "c1/rbd/vol2@b", Secrets: goodSecrets}, fs.ErrInvalid, "different volumes"},
		{"no secrets", Request{Target: "c1/rbd/vol@s"}, fs.ErrInvalid, `"userID"`},
		{"no key", Request{Target: "c1/rbd/vol@s", Secrets: map[string]string{SecretUserID: "admin"}}, fs.ErrInvalid, `"userKey"`},
		{"bad key", Request{Target: "c1/rbd/vol@s", Secrets: map[string]string{SecretUserID: "admin", SecretUserKey: "not-base64!"}}, fs.ErrInvalid, `"userKey" is not a cephx key`},
		{"short key", Request{Target: "c1/rbd/vol@s", Secrets: map[string]string{SecretUserID: "admin", SecretUserKey: "AQA="}}, fs.ErrInvalid, `"userKey" is not a cephx key`},
		{"unknown cluster", Request{Target: "c9/rbd/vol@s", Secrets: goodSecrets}, fs.ErrNotExist, "c9"},
		{"no monitors", Request{Target: "c2/rbd/vol@s", Secrets: goodSecrets}, nil, "no monitors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d, err := s.Open(ctx, tc.req)
			if err == nil {
				d.Close()
				t.Fatal("Open succeeded")
			}
			for _, sen := range sentinels {
				if is := errors.Is(err, sen); is != (sen == tc.want) {
					t.Errorf("Open: %v; errors.Is(%v) = %v", err, sen, is)
				}
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("Open: %q does not mention %q", err, tc.text)
			}
			if strings.Contains(err.Error(), secretKey) || strings.Contains(err.Error(), "not-base64") {
				t.Errorf("Open: %q contains the key", err)
			}
		})
	}
	if st := s.Stats(); st != (Stats{}) {
		t.Errorf("stats = %+v", st)
	}
}

// TestOpenImagesDifferInNamespace: a namespace in the ID overrides the
// config's, so these are different volumes even with the same image name.
func TestSnapRefSameImage(t *testing.T) {
	cl := Cluster{ID: "c1", RadosNamespace: "ns1"}
	resolve := func(s string) snapRef {
		t.Helper()
		id, err := ParseID(s)
		if err != nil {
			t.Fatal(err)
		}
		r, err := id.resolve(cl, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := resolve("c1/rbd/vol@s"); r.namespace != "ns1" || r.String() != "rbd/ns1/vol@s" {
		t.Errorf("config namespace not applied: %+v", r)
	}
	if r := resolve("c1/rbd/ns2/vol@s"); r.namespace != "ns2" {
		t.Errorf("ID namespace did not override: %+v", r)
	}
	if !resolve("c1/rbd/vol@a").sameImage(resolve("c1/rbd/ns1/vol@b")) {
		t.Error("same image not recognized")
	}
	if resolve("c1/rbd/vol@a").sameImage(resolve("c1/rbd/ns2/vol@b")) {
		t.Error("different namespaces taken as the same image")
	}
}

// TestOpenUnreachable needs librados but no cluster: a monitor port where
// nothing listens fails after client_mount_timeout as unavailable.
func TestOpenUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(`[{"clusterID": "c1", "monitors": ["`+addr+`"]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := NewSource(Options{ConfigPath: path, MountTimeout: time.Second})
	defer s.Close()

	start := time.Now()
	d, err := s.Open(context.Background(), Request{Target: "c1/rbd/vol@s", Secrets: goodSecrets})
	if err == nil {
		d.Close()
		t.Fatal("Open succeeded")
	}
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("Open: %v; want os.ErrDeadlineExceeded, unreachable", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("Open took %v", time.Since(start))
	}
	if st := s.Stats(); st != (Stats{}) {
		t.Errorf("stats = %+v", st)
	}

	// A context that ends first wins, and the connect goes on alone.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Open(ctx, Request{Target: "c1/rbd/vol@s", Secrets: goodSecrets}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Open with a short deadline: %v", err)
	}
	if st := s.Stats(); st.Refs != 0 || st.Connecting != 1 {
		t.Errorf("stats = %+v", st)
	}
}
