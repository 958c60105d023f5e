package driver

import (
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The CSI spec's general size limits (its "Size Limits"), which the
// SnapshotMetadata messages do not override: a request beyond them is
// refused before anything is parsed or looked up.
const (
	maxIDBytes      = 128     // a string field: the snapshot IDs
	maxSecretsBytes = 4 << 10 // a map<string, string>: the secrets, keys and values
)

// clipLen is how much of an oversized ID a status quotes.
const clipLen = 40

// checkIDs refuses an ID beyond the spec's limit, quoting only its start:
// a status or a log line never carries an arbitrarily long string.
func checkIDs(ids ...[2]string) error {
	for _, f := range ids {
		if len(f[1]) > maxIDBytes {
			return status.Errorf(codes.InvalidArgument, msgIDTooLong, f[0], len(f[1]), maxIDBytes, Clip(f[1]))
		}
	}
	return nil
}

// checkSecrets refuses secrets beyond the spec's limit, naming no key or
// value.
func checkSecrets(secrets map[string]string) error {
	n := 0
	for k, v := range secrets {
		n += len(k) + len(v)
	}
	if n > maxSecretsBytes {
		return status.Errorf(codes.InvalidArgument, msgSecretsTooLarge, n, maxSecretsBytes)
	}
	return nil
}

// Clip returns s when it is within the spec's limit of a string field,
// else its first bytes (whole UTF-8 characters, invalid bytes replaced)
// and an ellipsis: what a status message or a log line may quote of a
// client's string.
func Clip(s string) string {
	if len(s) <= maxIDBytes {
		return s
	}
	cut := clipLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "\uFFFD") + "..."
}
