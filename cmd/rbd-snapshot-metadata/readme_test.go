package main

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeDocumentsUnsafeModes: the modes that trust the object map's
// dirty bits can miss changes, and the e2e tests only log those misses
// (e2e/precise_hazards_test.go) because README's Precision section says
// when they happen. This keeps it saying so.
func TestReadmeDocumentsUnsafeModes(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "### Precision")
	if start < 0 {
		t.Fatal("README has no Precision section")
	}
	sec := s[start:]
	if end := strings.Index(sec[4:], "\n### "); end >= 0 {
		sec = sec[:end+4]
	}
	for _, want := range []string{"--trust-object-map", "--precision=object", "rbd snap rollback", "rbd_clone_copy_on_read", "migration", "Format 1"} {
		if !strings.Contains(sec, want) {
			t.Errorf("README's Precision section does not mention %q", want)
		}
	}
}
