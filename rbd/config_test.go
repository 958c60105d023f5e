package rbd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseConfig(t *testing.T) {
	got, err := ParseConfig([]byte(`[
		{"clusterID": "c1", "monitors": ["127.0.0.1:6789", "127.0.0.2:3300"], "cephFS": {"subvolumeGroup": "x"}},
		{"clusterID": "c1ns", "monitors": ["127.0.0.1:6789"], "rbd": {"radosNamespace": "ns1", "mirrorDaemonCount": 1}},
		{"clusterID": "c1", "monitors": ["ignored:1"]}
	]`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Cluster{
		"c1":   {ID: "c1", Monitors: []string{"127.0.0.1:6789", "127.0.0.2:3300"}},
		"c1ns": {ID: "c1ns", Monitors: []string{"127.0.0.1:6789"}, RadosNamespace: "ns1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseConfig (-want +got):\n%s", diff)
	}

	for _, bad := range []string{`{}`, `[{"monitors": ["a:1"]}]`, `not json`} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("ParseConfig(%s): no error", bad)
		}
	}
}

func TestConfigLookupAndReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	c := &config{path: path}

	// A missing file is the server's fault: not fs.ErrNotExist.
	if _, err := c.lookup("c1"); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lookup without a file: %v; want an unclassified error", err)
	}

	write := func(data string) {
		t.Helper()
		// Like the kubelet: write a new file, swap it in.
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(`[{"clusterID": "c1", "monitors": ["127.0.0.1:6789"]}]`)
	cl, err := c.lookup("c1")
	if err != nil || cl.Monitors[0] != "127.0.0.1:6789" {
		t.Fatalf("lookup c1 = %+v, %v", cl, err)
	}
	if _, err := c.lookup("c2"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lookup c2: %v; want fs.ErrNotExist", err)
	}

	write(`[{"clusterID": "c2", "monitors": ["127.0.0.2:6789"]}]`)
	if cl, err := c.lookup("c2"); err != nil || cl.Monitors[0] != "127.0.0.2:6789" {
		t.Fatalf("lookup c2 after reload = %+v, %v", cl, err)
	}
	if _, err := c.lookup("c1"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lookup c1 after reload: %v; want fs.ErrNotExist", err)
	}

	write(`[{`)
	if _, err := c.lookup("c2"); err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
		t.Fatalf("lookup with a broken file: %v; want an unclassified error", err)
	}
}
