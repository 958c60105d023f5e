package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// TestPrecisionDocumentsUnsafeModes: the modes that trust the object map's
// dirty bits can miss changes, and the e2e tests only log those misses
// (e2e/precise_hazards_test.go) because docs/precision.md says when they
// happen. This keeps it saying so.
func TestPrecisionDocumentsUnsafeModes(t *testing.T) {
	b, err := os.ReadFile("../../docs/precision.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{"--trust-object-map", "--precision=object", "rbd snap rollback", "rbd_clone_copy_on_read", "migration", "Format 1"} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/precision.md does not mention %q", want)
		}
	}
}

// TestReadmeFlags: the README's flag table names every flag of the server
// (klog's apart from -v) with its default, and no flag the server lacks.
func TestReadmeFlags(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{} // flag → default cell
	row := regexp.MustCompile("^\\| `-{1,2}([a-z][a-z0-9-]*)` \\| ([^|]*) \\|")
	for _, line := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			if _, dup := documented[m[1]]; dup {
				t.Errorf("README's flag table lists --%s twice", m[1])
			}
			documented[m[1]] = strings.Trim(strings.TrimSpace(m[2]), "`")
		}
	}
	if len(documented) == 0 {
		t.Fatal("README has no flag table (rows | `--flag` | default | meaning |)")
	}

	klogs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogs)
	for name, def := range serverFlags(t) {
		if klogs.Lookup(name) != nil && name != "v" {
			continue
		}
		cell, ok := documented[name]
		delete(documented, name)
		switch {
		case !ok:
			t.Errorf("README's flag table lacks --%s (default %q)", name, def)
		case !sameDefault(def, cell):
			t.Errorf("README gives --%s the default %q, the server %q", name, cell, def)
		}
	}
	for name := range documented {
		t.Errorf("README's flag table lists --%s, which the server does not have", name)
	}
}

// serverFlags returns the server's flags and their defaults ("" for a zero
// value), as parseFlags prints them for -h: its flag set writes to
// stderr, which is read here.
func serverFlags(t *testing.T) map[string]string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		read <- b
	}()
	stderr := os.Stderr
	os.Stderr = w
	_, err = parseFlags([]string{"-h"})
	os.Stderr = stderr
	w.Close()
	usage := string(<-read)
	r.Close()
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("parseFlags -h: %v, want flag.ErrHelp", err)
	}

	flags := map[string]string{}
	name := ""
	nameLine := regexp.MustCompile(`^  -(\S+)`)
	defaultOf := regexp.MustCompile(`\(default (.*)\)$`)
	for _, line := range strings.Split(usage, "\n") {
		if m := nameLine.FindStringSubmatch(line); m != nil {
			name = m[1]
			flags[name] = ""
			continue
		}
		if m := defaultOf.FindStringSubmatch(line); m != nil && name != "" {
			def := m[1]
			if u, err := strconv.Unquote(def); err == nil {
				def = u
			}
			flags[name] = def
		}
	}
	if len(flags) == 0 {
		t.Fatalf("no flags in parseFlags' usage:\n%s", usage)
	}
	return flags
}

// sameDefault compares a flag's default with the README's cell: durations
// by value (5m is 5m0s); a zero value (no default printed) is "off",
// "false" or "0".
func sameDefault(def, cell string) bool {
	if def == cell || def == "" && (cell == "off" || cell == "false" || cell == "0") {
		return true
	}
	d1, err1 := time.ParseDuration(def)
	d2, err2 := time.ParseDuration(cell)
	if err1 == nil && err2 == nil {
		return d1 == d2
	}
	n1, err1 := strconv.ParseInt(def, 10, 64)
	n2, err2 := strconv.ParseInt(cell, 10, 64)
	return err1 == nil && err2 == nil && n1 == n2
}
