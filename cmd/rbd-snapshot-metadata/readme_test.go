package main

import (
	"os"
	"strings"
	"testing"
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
