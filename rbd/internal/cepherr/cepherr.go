// Package cepherr classifies the errors of librados and librbd (as go-ceph
// returns them) by the standard sentinels that the driver maps to gRPC
// codes (see driver.Source), and says which ones go away by themselves.
//
// go-ceph wraps an errno in errors with an ErrorCode method (rbd.ErrNotFound,
// rados.ErrNotFound and its unexported cephError), and its functions
// disagree on the sign of the same errno: DiffIterate reports a missing
// callback as +EINVAL, DiffIterateByID as -EINVAL. Everything here works on
// the absolute value.
//
//	ENOENT             fs.ErrNotExist
//	EINVAL             fs.ErrInvalid
//	EACCES, EPERM      fs.ErrPermission
//	ENOSYS             errors.ErrUnsupported (librbd lacks the call: lasting)
//	ETIMEDOUT          os.ErrDeadlineExceeded (the cluster did not answer in time)
//	EOPNOTSUPP         ErrUnavailable (an OSD cannot load an object class yet)
//
// Temporary errors (Temporary) are those a stream resumes after: the two
// last classes, and the unclassified ECONNRESET, ESHUTDOWN, ENOTCONN and
// EAGAIN. Unanswered is the part of them where the cluster did not answer:
// all but ErrUnavailable.
package cepherr

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ErrUnavailable is the class of an OSD that answered, but cannot do the
// operation now: it could not load an object class (EOPNOTSUPP from an OSD
// that restarted outside its osd_class_dir). It is the cluster's to fix,
// not the request's: UNAVAILABLE and retried, never FAILED_PRECONDITION,
// which tells a backup tool to give up on incrementals. It is a sentinel
// of its own, not os.ErrDeadlineExceeded, so that "the cluster did not
// answer" (Unanswered) needs no exception for it.
var ErrUnavailable = errors.New("unavailable")

// Errno returns the positive errno carried by a go-ceph error, or 0 when
// err carries none.
func Errno(err error) int {
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

// kindOf returns the sentinel that classifies errno n, or nil when n has no
// class of its own.
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
		return ErrUnavailable
	}
	return nil
}

// transient returns the short reason (a metric's label) when errno n goes
// away by itself, "" when it does not: an OSD or monitor that did not
// answer within the op timeout, a connection to one that was reset, shut
// down or not (yet) made again, an OSD restarted and not yet serving its
// object classes, a resource busy for now.
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

// cephError is a failed librados or librbd call, classified by the sentinel
// of its errno. errors.Is matches both the sentinel and go-ceph's original
// error.
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
// key librados cannot read is INVALID_ARGUMENT: see As).
func (e *cephError) Temporary() bool {
	return (e.kind == nil || e.kind == os.ErrDeadlineExceeded || e.kind == ErrUnavailable) && transient(e.errno) != ""
}

// Reason is the short reason of a temporary error, for the driver's metric.
func (e *cephError) Reason() string { return transient(e.errno) }

// Temporary reports whether err goes away by itself: a stream resumes
// after it, on a new connection.
func Temporary(err error) bool {
	var ce *cephError
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ce) && ce.Temporary()
}

// Unanswered reports whether err says that the cluster did not answer (in
// time, or on a connection that broke): Temporary, but not ErrUnavailable.
// Precise mode stops on these, to be resumed, and falls back to the whole
// object on any other error.
func Unanswered(err error) bool {
	err = Classify(err)
	return Temporary(err) && !errors.Is(err, ErrUnavailable)
}

// Classify turns a go-ceph error into a classified one. Context errors and
// errors already classified here pass through unchanged.
func Classify(err error) error {
	var ce *cephError
	if err == nil || errors.As(err, &ce) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	n := Errno(err)
	return &cephError{errno: n, kind: kindOf(n), err: err}
}

// As classifies err as kind, whatever its errno says: for a call whose
// errno means something else than usual (a login's EOPNOTSUPP is a key
// type librados cannot read, fs.ErrInvalid).
func As(kind, err error) error {
	return &cephError{errno: Errno(err), kind: kind, err: err}
}

// Wrap classifies err and prefixes it with what was being done, as in
// Wrap("open image rbd/vol", err). It returns nil for a nil err.
func Wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, Classify(err))
}

// IsNotSupported reports whether err carries EOPNOTSUPP.
func IsNotSupported(err error) bool { return Errno(err) == int(syscall.EOPNOTSUPP) }

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

// Refused is err as a login the monitors refused (fs.ErrPermission, and
// Unauthenticated).
func Refused(err error) error { return authError{As(fs.ErrPermission, err)} }
