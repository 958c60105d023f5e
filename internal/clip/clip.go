// Package clip bounds what a status message or a log line quotes of a
// client's string. Both the driver (its statuses) and the server (its
// request log lines) quote snapshot IDs, and neither may import the other.
package clip

import (
	"strings"
	"unicode/utf8"
)

// MaxIDBytes is the CSI spec's general size limit of a string field (its
// "Size Limits"), which the SnapshotMetadata messages do not override: the
// snapshot IDs.
const MaxIDBytes = 128

// keep is how much of an oversized ID is quoted.
const keep = 40

// ID returns s when it is within the spec's limit of a string field,
// else its first bytes (whole UTF-8 characters, invalid bytes replaced)
// and an ellipsis: what a status message or a log line may quote of a
// client's string.
func ID(s string) string {
	if len(s) <= MaxIDBytes {
		return s
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "\uFFFD") + "..."
}
