package rbd

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
var sentinels = []error{fs.ErrNotExist, fs.ErrInvalid, fs.ErrPermission, errors.ErrUnsupported, os.ErrDeadlineExceeded}

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
		{errno(-int(syscall.EOPNOTSUPP)), os.ErrDeadlineExceeded}, // a restarting OSD: passing
		{errno(-int(syscall.EIO)), nil},
		{errno(-int(syscall.ECANCELED)), nil},
		{librbd.ErrImageNotOpen, nil},
	} {
		got := wrap("do thing", tc.err)
		if !strings.HasPrefix(got.Error(), "do thing: ") {
			t.Errorf("wrap(%v) = %q; want the prefix", tc.err, got)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("wrap(%v) lost the original error", tc.err)
		}
		for _, s := range sentinels {
			if is := errors.Is(got, s); is != (s == tc.want) {
				t.Errorf("wrap(%v): errors.Is(%v) = %v", tc.err, s, is)
			}
		}
	}
	if wrap("x", nil) != nil {
		t.Error("wrap(nil) != nil")
	}
	for _, err := range []error{context.Canceled, context.DeadlineExceeded} {
		got := wrap("x", err)
		if !errors.Is(got, err) {
			t.Errorf("wrap(%v) = %v", err, got)
		}
		for _, s := range sentinels {
			if errors.Is(got, s) {
				t.Errorf("wrap(%v) is %v", err, s)
			}
		}
	}
	if got := wrap("open image rbd/vol", librbd.ErrNotFound).Error(); got != "open image rbd/vol: no such file or directory" {
		t.Errorf("text = %q", got)
	}
}

// TestTemporary: the errnos that go away by themselves are Temporary,
// with a short reason for the driver's metric, whatever their sign; the
// others are not, nor is an errno classified otherwise (a key librados
// cannot read answers EOPNOTSUPP on connect: INVALID_ARGUMENT).
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
			err := wrap("read", errno(sign*int(tc.errno)))
			var tmp interface {
				Temporary() bool
				Reason() string
			}
			if !errors.As(err, &tmp) {
				t.Fatalf("%v: no Temporary method", err)
			}
			if tmp.Temporary() != (tc.reason != "") || temporary(err) != (tc.reason != "") {
				t.Errorf("%v (%d): Temporary() = %v, temporary() = %v", err, sign*int(tc.errno), tmp.Temporary(), temporary(err))
			}
			if tc.reason != "" && tmp.Reason() != tc.reason {
				t.Errorf("%v: Reason() = %q, want %q", err, tmp.Reason(), tc.reason)
			}
		}
	}
	keyType2 := "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="
	err := connectError(connParams{monHost: "x", key: keyType2}, timeouts{}, errno(-int(syscall.EOPNOTSUPP)))
	if !errors.Is(err, fs.ErrInvalid) || temporary(err) {
		t.Errorf("connect refusing the key's type: %v, temporary %v; want INVALID_ARGUMENT, not temporary", err, temporary(err))
	}
}
