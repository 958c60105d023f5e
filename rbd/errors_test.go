package rbd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
)

// errno is a go-ceph-like error carrying an errno of either sign.
type errno int

func (e errno) Error() string  { return fmt.Sprintf("ret=%d", int(e)) }
func (e errno) ErrorCode() int { return int(e) }

// sentinels are the classes of driver.Source.
var sentinels = []error{fs.ErrNotExist, fs.ErrInvalid, fs.ErrPermission, errors.ErrUnsupported, os.ErrDeadlineExceeded, cepherr.ErrUnavailable}

// TestConnectRefusesKeyType: a key librados cannot read answers EOPNOTSUPP
// on connect (tentacle): INVALID_ARGUMENT, not temporary.
func TestConnectRefusesKeyType(t *testing.T) {
	keyType2 := "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="
	err := connectError(connParams{monHost: "x", key: keyType2}, timeouts{}, errno(-int(syscall.EOPNOTSUPP)))
	if !errors.Is(err, fs.ErrInvalid) || cepherr.Temporary(err) {
		t.Errorf("connect refusing the key's type: %v, temporary %v; want INVALID_ARGUMENT, not temporary", err, cepherr.Temporary(err))
	}
}
