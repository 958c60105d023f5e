package cepherr

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"
)

// errno is a go-ceph-like error carrying an errno of either sign.
type errno int

func (e errno) Error() string  { return fmt.Sprintf("ret=%d", int(e)) }
func (e errno) ErrorCode() int { return int(e) }

// sentinels are the classes of driver.Source.
var sentinels = []error{fs.ErrNotExist, fs.ErrInvalid, fs.ErrPermission, errors.ErrUnsupported, os.ErrDeadlineExceeded, ErrUnavailable}

func TestWrapClassifies(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error // nil: unclassified
	}{
		{librbd.ErrNotFound, fs.ErrNotExist},
		{rados.ErrNotFound, fs.ErrNotExist},
		{librbd.ErrNotExist, fs.ErrNotExist},
		{rados.ErrPermissionDenied, fs.ErrPermission},
		{librbd.ErrNotImplemented, errors.ErrUnsupported},
		{fmt.Errorf("%w: dlsym", librbd.ErrNotImplemented), errors.ErrUnsupported},
		{errno(-int(syscall.EINVAL)), fs.ErrInvalid},
		{errno(int(syscall.EINVAL)), fs.ErrInvalid}, // go-ceph's other sign
		{errno(-int(syscall.EACCES)), fs.ErrPermission},
		{errno(-int(syscall.ETIMEDOUT)), os.ErrDeadlineExceeded},
		{errno(int(syscall.ETIMEDOUT)), os.ErrDeadlineExceeded},
		{errno(-int(syscall.ENOSYS)), errors.ErrUnsupported},
		{errno(-int(syscall.EOPNOTSUPP)), ErrUnavailable}, // a restarting OSD: passing
		{errno(-int(syscall.EIO)), nil},
		{errno(-int(syscall.ECANCELED)), nil},
		{librbd.ErrImageNotOpen, nil},
	} {
		got := Wrap("do thing", tc.err)
		if !strings.HasPrefix(got.Error(), "do thing: ") {
			t.Errorf("Wrap(%v) = %q; want the prefix", tc.err, got)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("Wrap(%v) lost the original error", tc.err)
		}
		for _, s := range sentinels {
			if is := errors.Is(got, s); is != (s == tc.want) {
				t.Errorf("Wrap(%v): errors.Is(%v) = %v", tc.err, s, is)
			}
		}
	}
	if Wrap("x", nil) != nil {
		t.Error("Wrap(nil) != nil")
	}
	for _, err := range []error{context.Canceled, context.DeadlineExceeded} {
		got := Wrap("x", err)
		if !errors.Is(got, err) {
			t.Errorf("Wrap(%v) = %v", err, got)
		}
		for _, s := range sentinels {
			if errors.Is(got, s) {
				t.Errorf("Wrap(%v) is %v", err, s)
			}
		}
	}
	if got := Wrap("open image rbd/vol", librbd.ErrNotFound).Error(); got != "open image rbd/vol: no such file or directory" {
		t.Errorf("text = %q", got)
	}
}

// TestTemporary: the errnos that go away by themselves are Temporary,
// with a short reason for the driver's metric, whatever their sign; the
// others are not, nor is an errno classified otherwise (As).
func TestTemporary(t *testing.T) {
	for _, tc := range []struct {
		errno  syscall.Errno
		reason string
	}{
		{syscall.ETIMEDOUT, "timeout"},
		{syscall.ECONNRESET, "connection_reset"},
		{syscall.ESHUTDOWN, "connection_shutdown"},
		{syscall.ENOTCONN, "not_connected"},
		{syscall.EOPNOTSUPP, "class_unavailable"},
		{syscall.EAGAIN, "try_again"},
		{syscall.EIO, ""},
		{syscall.ENOENT, ""},
		{syscall.EACCES, ""},
		{syscall.EINVAL, ""},
	} {
		for _, sign := range []int{-1, 1} {
			err := Wrap("read", errno(sign*int(tc.errno)))
			var tmp interface {
				Temporary() bool
				Reason() string
			}
			if !errors.As(err, &tmp) {
				t.Fatalf("%v: no Temporary method", err)
			}
			if tmp.Temporary() != (tc.reason != "") || Temporary(err) != (tc.reason != "") {
				t.Errorf("%v (%d): method Temporary() = %v, Temporary() = %v", err, sign*int(tc.errno), tmp.Temporary(), Temporary(err))
			}
			if tc.reason != "" && tmp.Reason() != tc.reason {
				t.Errorf("%v: Reason() = %q, want %q", err, tmp.Reason(), tc.reason)
			}
		}
	}
	if err := As(fs.ErrInvalid, errno(-int(syscall.EOPNOTSUPP))); !errors.Is(err, fs.ErrInvalid) || Temporary(err) || errors.Is(err, ErrUnavailable) {
		t.Errorf("As(fs.ErrInvalid, EOPNOTSUPP): %v, temporary %v; want INVALID_ARGUMENT only", err, Temporary(err))
	}
	if err := Wrap("read", errno(-int(syscall.EOPNOTSUPP))); Unanswered(err) || !Temporary(err) {
		t.Errorf("EOPNOTSUPP: Unanswered %v, Temporary %v; want a temporary error the cluster answered", Unanswered(err), Temporary(err))
	}
	if err := Wrap("read", errno(-int(syscall.ECONNRESET))); !Unanswered(err) {
		t.Errorf("ECONNRESET: not Unanswered")
	}
}
