package driver

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/clip"
)

// The CSI spec's general size limits (its "Size Limits"), which the
// SnapshotMetadata messages do not override: a request beyond them is
// refused before anything is parsed or looked up.
const (
	maxIDBytes      = clip.MaxIDBytes // a string field: the snapshot IDs
	maxSecretsBytes = 4 << 10         // a map<string, string>: the secrets, keys and values
)

// checkIDs refuses an ID beyond the spec's limit, quoting only its start:
// a status or a log line never carries an arbitrarily long string.
func checkIDs(ids ...[2]string) error {
	for _, f := range ids {
		if len(f[1]) > maxIDBytes {
			return status.Errorf(codes.InvalidArgument, msgIDTooLong, f[0], len(f[1]), maxIDBytes, clip.ID(f[1]))
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
