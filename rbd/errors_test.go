package rbd

import (
	"errors"
	"io/fs"
	"os"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
)

// sentinels are the classes of driver.Source.
var sentinels = []error{fs.ErrNotExist, fs.ErrInvalid, fs.ErrPermission, errors.ErrUnsupported, os.ErrDeadlineExceeded, cepherr.ErrUnavailable}
