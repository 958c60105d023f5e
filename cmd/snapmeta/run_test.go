package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/client"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver/drivertest"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/server"
)

func serve(t *testing.T) string {
	t.Helper()
	src := drivertest.NewSource()
	src.Add(&drivertest.Volume{Capacity: 1 << 30,
		Allocated: map[string][]driver.Extent{"c/p/i@a": {{Offset: 0, Length: 4096}, {Offset: 1 << 20, Length: 8192}}, "c/p/i@b": nil},
		Delta:     map[string][]driver.Extent{"c/p/i@a>c/p/i@b": {{Offset: 4096, Length: 4096}}}})
	d, err := driver.New(src, driver.Options{Name: "x", BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH})
	if err != nil {
		t.Fatal(err)
	}
	sock := "unix://" + filepath.Join(t.TempDir(), "s.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.Config{Endpoint: sock, Services: d, Ready: func() { close(ready) }})
	}()
	<-ready
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

func TestSnapmeta(t *testing.T) {
	sock := serve(t)
	var out, errOut bytes.Buffer
	if rc := run([]string{"--endpoint", sock, "--format", "json", "allocated", "c/p/i@a"}, &out, &errOut); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errOut.String())
	}
	var got []client.Extent
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(got) != 2 || got[1] != (client.Extent{Offset: 1 << 20, Length: 8192}) {
		t.Errorf("json = %+v", got)
	}
	if !strings.Contains(errOut.String(), "2 extents, 12.0 KiB (12288 bytes) of a 1.0 GiB volume") {
		t.Errorf("summary: %s", errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if rc := run([]string{"--endpoint", sock, "delta", "c/p/i@a", "c/p/i@b"}, &out, &errOut); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errOut.String())
	}
	if !strings.Contains(out.String(), "4096                 4096") || !strings.Contains(out.String(), "total: 1 extents") {
		t.Errorf("table:\n%s", out.String())
	}
	errOut.Reset()
	if rc := run([]string{"--endpoint", sock, "allocated", "c/p/i@nope"}, &out, &errOut); rc != 1 || !strings.Contains(errOut.String(), "NotFound") {
		t.Errorf("missing snapshot: rc %d, %s", rc, errOut.String())
	}
	out.Reset()
	if rc := run([]string{"--endpoint", sock, "--missing", "c/p/i@zz", "check", "c/p/i@a", "c/p/i@b"}, &out, &errOut); rc != 0 || !strings.Contains(out.String(), "PASS  resumed after every tuple") {
		t.Errorf("check: rc %d:\n%s%s", rc, out.String(), errOut.String())
	}
	if rc := run([]string{"allocated"}, &out, &errOut); rc != 2 {
		t.Errorf("bad usage: rc %d", rc)
	}
}

func TestHealth(t *testing.T) {
	sock := serve(t)
	var out, errOut bytes.Buffer
	if rc := run([]string{"--endpoint", sock, "--timeout", "5s", "health"}, &out, &errOut); rc != 0 || strings.TrimSpace(out.String()) != "SERVING" {
		t.Errorf("health: rc %d, %q, %s", rc, out.String(), errOut.String())
	}
	errOut.Reset()
	nobody := "unix://" + filepath.Join(t.TempDir(), "none.sock")
	if rc := run([]string{"--endpoint", nobody, "--timeout", "2s", "health"}, &out, &errOut); rc != 1 {
		t.Errorf("health without a server: rc %d, %s", rc, errOut.String())
	}
}
