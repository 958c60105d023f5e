package server

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// socketMode is the unix socket's permissions: owner and group.
const socketMode = 0o660

// listen opens the endpoint: unix:///path/to.sock (or unix:/path) or
// tcp://host:port. A stale unix socket, one that nobody answers on, is
// replaced; a live one is an error, so that two servers never share a
// socket. The returned cleanup removes the socket file.
func listen(endpoint string) (net.Listener, func(), error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, nil, fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Opaque
		}
		if u.Host != "" || !filepath.IsAbs(path) {
			return nil, nil, fmt.Errorf("endpoint %q: want unix:///absolute/path", endpoint)
		}
		if err := removeStale(path); err != nil {
			return nil, nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, nil, fmt.Errorf("endpoint %q: %w", endpoint, err)
		}
		// Only the owner and its group (the sidecar's container in the
		// pod) may connect. The umask closes the window between bind and
		// chmod; the server is not serving yet, so nothing else creates
		// files meanwhile.
		old := syscall.Umask(0o117)
		l, err := net.Listen("unix", path)
		syscall.Umask(old)
		if err != nil {
			return nil, nil, err
		}
		if err := os.Chmod(path, socketMode); err != nil {
			l.Close()
			return nil, nil, err
		}
		// The file is removed on exit only while it is still ours: a
		// successor may already have replaced a socket it found stale
		// (this server hung, say), and removing its socket would cut the
		// sidecar off from it. Go's listener would unlink the path
		// blindly on Close.
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		own, err := os.Lstat(path)
		if err != nil {
			l.Close()
			return nil, nil, err
		}
		return l, func() { removeOwn(path, own) }, nil
	case "tcp":
		if u.Host == "" || strings.Trim(u.Path, "/") != "" {
			return nil, nil, fmt.Errorf("endpoint %q: want tcp://host:port", endpoint)
		}
		l, err := net.Listen("tcp", u.Host)
		return l, func() {}, err
	default:
		return nil, nil, fmt.Errorf("endpoint %q: scheme must be unix or tcp", endpoint)
	}
}

// removeOwn removes the socket at path if it is still the file own, the
// one this server created (same device and inode).
func removeOwn(path string, own os.FileInfo) {
	if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, own) {
		_ = os.Remove(path)
	}
}

// removeStale removes a socket file that no server answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: another server is listening on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.Remove(path)
}
