package rbd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// Errors from librados and librbd carry an errno. go-ceph wraps it in
// errors with an ErrorCode method (rbd.ErrNotFound, rados.ErrNotFound and
// the unexported cephError), and its functions disagree on the sign of the
// same errno: DiffIterate reports a missing callback as +EINVAL,
// DiffIterateByID as -EINVAL. Everything here works on the absolute value.

// errnoOf returns the positive errno carried by a go-ceph error, or 0 when
// err carries none.
func errnoOf(err error) int {
	var coded interface{ ErrorCode() int }
	if !errors.As(err, &coded) {
		return 0
	}
	n := coded.ErrorCode()
	if n < 0 {
		n = -n
	}
	return n
}

// kindOf returns the standard sentinel that classifies errno n for the
// driver (see driver.Source), or nil when n has no class of its own.
func kindOf(n int) error {
	switch syscall.Errno(n) {
	case syscall.ENOENT:
		return fs.ErrNotExist
	case syscall.EINVAL:
		return fs.ErrInvalid
	case syscall.EACCES, syscall.EPERM:
		return fs.ErrPermission
	case syscall.ETIMEDOUT:
		return os.ErrDeadlineExceeded
	case syscall.ENOSYS:
		// librbd's own answer for a call it lacks (go-ceph's
		// ErrNotImplemented): lasting, FAILED_PRECONDITION.
		return errors.ErrUnsupported
	case syscall.EOPNOTSUPP:
		// The OSD's answer for a class method it cannot load (seen from
		// an OSD restarted outside / with reef's relative
		// osd_class_dir): the cluster's to fix, not the request's, so
		// UNAVAILABLE and retried, never FAILED_PRECONDITION, which
		// tells a backup tool to give up on incrementals.
		return os.ErrDeadlineExceeded
	}
	return nil
}

// transient returns the short reason (a metric's label) when errno n goes
// away by itself, "" when it does not: an OSD or monitor that did not
// answer within the op timeout, a connection to one that was reset, shut
// down or not (yet) made again, an OSD restarted and not yet serving its
// object classes, a resource busy for now. The driver resumes a stream
// after these (driver.Source's Temporary).
func transient(n int) string {
	switch syscall.Errno(n) {
	case syscall.ETIMEDOUT:
		return "timeout"
	case syscall.ECONNRESET:
		return "connection_reset"
	case syscall.ESHUTDOWN:
		return "connection_shutdown"
	case syscall.ENOTCONN:
		return "not_connected"
	case syscall.EOPNOTSUPP:
		return "class_unavailable"
	case syscall.EAGAIN:
		return "try_again"
	}
	return ""
}

// cephError is a failed librados or librbd call, classified by the standard
// sentinel of its errno. errors.Is matches both the sentinel and go-ceph's
// original error.
type cephError struct {
	errno int   // positive; 0 when the go-ceph error carried none
	kind  error // fs.ErrNotExist, ...; nil when unclassified
	err   error // go-ceph's error
}

// Error is the errno's text ("no such file or directory"), without go-ceph's
// prefixes, or the go-ceph error's text when it carries no errno.
func (e *cephError) Error() string {
	if e.errno != 0 {
		return syscall.Errno(e.errno).Error()
	}
	return e.err.Error()
}

// Unwrap returns the sentinel (when there is one) and go-ceph's error.
func (e *cephError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// Temporary tells the driver that the error goes away by itself (see
// transient), unless its errno was classified otherwise (EOPNOTSUPP for a
// key librados cannot read is INVALID_ARGUMENT: see connectError).
func (e *cephError) Temporary() bool {
	return (e.kind == nil || e.kind == os.ErrDeadlineExceeded) && transient(e.errno) != ""
}

// Reason is the short reason of a temporary error, for the driver's metric.
func (e *cephError) Reason() string { return transient(e.errno) }

// temporary reports whether err goes away by itself: a stream resumes
// after it, on a new connection (see Diff.discardConnOnTimeout).
func temporary(err error) bool {
	var ce *cephError
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ce) && ce.Temporary()
}

// classify turns a go-ceph error into a cephError. Context errors and errors
// already classified here pass through unchanged.
func classify(err error) error {
	var ce *cephError
	if err == nil || errors.As(err, &ce) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	n := errnoOf(err)
	return &cephError{errno: n, kind: kindOf(n), err: err}
}

// wrap classifies err and prefixes it with what was being done, as in
// wrap("open image rbd/vol", err). It returns nil for a nil err.
func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, classify(err))
}

// authError is a login that the monitors refused: a wrong key or an unknown
// cephx user. It is also fs.ErrPermission, and Unauthenticated tells the
// driver to answer UNAUTHENTICATED rather than PERMISSION_DENIED, which is
// for a user that logs in but lacks the caps for a pool.
type authError struct{ err error }

func (e authError) Error() string {
	return "authentication failed (wrong key or unknown user): " + e.err.Error()
}

func (e authError) Unwrap() error { return e.err }

// Unauthenticated marks the error as a refused login.
func (authError) Unauthenticated() bool { return true }
