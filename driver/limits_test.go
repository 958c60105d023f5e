package driver_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
)

func TestClip(t *testing.T) {
	for _, s := range []string{"", "c1/rbd/img@s1", strings.Repeat("a", 128), strings.Repeat("a", 129),
		strings.Repeat("é", 100), strings.Repeat("ab€", 60), strings.Repeat("\xff", 200)} {
		got := driver.Clip(s)
		if len(s) <= 128 {
			if got != s {
				t.Errorf("Clip(%q) = %q, want it unchanged", s, got)
			}
			continue
		}
		if len(got) > 64 || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
			t.Errorf("Clip of %d bytes = %q (%d bytes), want a short valid prefix", len(s), got, len(got))
		}
	}
}
