package clip_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/clip"
)

func TestID(t *testing.T) {
	for _, s := range []string{"", "c1/rbd/img@s1", strings.Repeat("a", 128), strings.Repeat("a", 129),
		strings.Repeat("é", 100), strings.Repeat("ab€", 60), strings.Repeat("\xff", 200)} {
		got := clip.ID(s)
		if len(s) <= 128 {
			if got != s {
				t.Errorf("ID(%q) = %q, want it unchanged", s, got)
			}
			continue
		}
		if len(got) > 64 || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
			t.Errorf("ID of %d bytes = %q (%d bytes), want a short valid prefix", len(s), got, len(got))
		}
	}
}
