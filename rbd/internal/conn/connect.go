package conn

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rados"
)

// Timeouts are the librados timeouts of a connection.
type Timeouts struct {
	Mount time.Duration // client_mount_timeout: to get a monitor session
	Op    time.Duration // rados_mon_op_timeout and rados_osd_op_timeout
}

// connector returns the function that makes a new cluster connection.
func (t Timeouts) connector() func(Params) (*rados.Conn, error) {
	return func(p Params) (*rados.Conn, error) { return connect(p, t) }
}

// connect makes a cluster connection as p.User, configured without any
// ceph.conf or keyring file. A refused login (wrong key, unknown user) is
// refused (cepherr.Refused); a login that times out, whether the monitors are
// unreachable or accept connections but give no session (no quorum, a
// hung monitor), is os.ErrDeadlineExceeded. Ambiguous monitor addresses
// are typed first (typeMonHost), so that a refused login is told apart in
// milliseconds rather than as a timeout.
//
// Implements (through go-ceph): rados_create, rados_conf_set, rados_connect.
func connect(p Params, t Timeouts) (*rados.Conn, error) {
	// Errors never name the user: it comes from the request's secrets,
	// and errors reach the client.
	conn, err := rados.NewConnWithUser(p.User)
	if err != nil {
		return nil, cepherr.Wrap("create cluster handle for the request's cephx user", err)
	}
	// A handle that never connected cannot be shut down through go-ceph:
	// shutdownUnconnected frees it, and its threads, at once.
	for _, o := range []struct{ name, value string }{
		{"mon_host", typeMonHost(context.Background(), p.MonHost, min(dialTimeout, t.Mount))},
		{"key", p.Key},
		{"keyring", "/dev/null"},
		{"client_mount_timeout", seconds(t.Mount)},
		{"rados_mon_op_timeout", seconds(t.Op)},
		{"rados_osd_op_timeout", seconds(t.Op)},
		// A library does not log: errors are returned, classified. These
		// apply once connected; before that librados writes to std::cerr,
		// which this package silences for every connection when it loads
		// (the init in cerr.go, rsm_silence_cerr in cerr.cpp).
		{"log_to_stderr", "false"},
		{"err_to_stderr", "false"},
	} {
		if err := conn.SetConfigOption(o.name, o.value); err != nil {
			shutdownUnconnected(conn)
			// Only the option's name: the value may be the key.
			return nil, cepherr.Wrap("set librados option "+o.name, err)
		}
	}
	if err := conn.Connect(); err != nil {
		shutdownUnconnected(conn)
		return nil, connectError(p, t, err)
	}
	return conn, nil
}

// noSession marks an error of rados_connect: the monitors gave no
// session. The driver retries a request's first open after temporary
// errors, but not after these (driver.Source).
type noSession struct{ error }

func (e noSession) Unwrap() error   { return e.error }
func (e noSession) NoSession() bool { return true }

// connectError classifies a failed rados_connect.
func connectError(p Params, t Timeouts, err error) error {
	return noSession{classifyConnect(p, t, err)}
}

func classifyConnect(p Params, t Timeouts, err error) error {
	// Not the user's name: it comes from the request's secrets.
	what := "connect to monitors " + p.MonHost
	n := cepherr.Errno(err)
	switch syscall.Errno(n) {
	case syscall.EACCES, syscall.EPERM:
		if knownKeyType(p.Key) {
			return fmt.Errorf("%s: %w", what, cepherr.Refused(err))
		}
		// Over msgr2, tentacle's librados sends a key of a type it does
		// not know, and the monitor refuses it: a key that no librados of
		// ours reads, not a wrong one.
		fallthrough
	case syscall.EINVAL, syscall.EOPNOTSUPP: // reef, tentacle
		if why := keyTrouble(p.Key); why != "" {
			return fmt.Errorf("%s: %s: %w", what, why, cepherr.As(fs.ErrInvalid, err))
		}
	case syscall.ETIMEDOUT:
		if reachable(p.Dial, dialTimeout) {
			return fmt.Errorf("%s: the monitors accept connections but gave no session within %s "+
				"(no quorum, or a monitor that does not answer); try again later: %w",
				what, t.Mount, cepherr.As(os.ErrDeadlineExceeded, err))
		}
		return fmt.Errorf("%s: monitors %v unreachable: %w",
			what, p.Dial, cepherr.As(os.ErrDeadlineExceeded, err))
	}
	return cepherr.Wrap(what, err)
}

// keyTrouble says why librados may have refused key (reef with EINVAL,
// tentacle with EOPNOTSUPP), never quoting it: it is not base64, or it is
// a cephx key of a type that this librados may not read (tentacle makes
// aes256k keys, type 2, by default; reef's librados reads only aes keys,
// type 1, while the image's, tentacle 20.2.4's, reads both). "" for an aes
// key.
func keyTrouble(key string) string {
	t, ok := keyType(key)
	switch {
	case !ok:
		return "the request's userKey is not a base64 cephx key"
	case t == keyAES:
		return ""
	case t == keyAES256k:
		return "the request's userKey is an aes256k cephx key (the default of new squid 19.2.6+ and tentacle 20.2.4+ clusters), " +
			"which this server's librados cannot read (reef's cannot): run the server with librados 19.2.6 / 20.2.4 or later " +
			"(the project's image has tentacle's), or give the user an aes key"
	default:
		return fmt.Sprintf("the request's userKey is a cephx key of type %d, which this server's librados cannot read", t)
	}
}

// The cephx key types (Ceph's CryptoKey) that librados may read.
const (
	keyAES     = 1
	keyAES256k = 2
)

// keyType is the type of a base64 cephx key, its first two bytes; false
// when key is not one.
func keyType(key string) (uint16, bool) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(key))
	if err != nil || len(b) < 2 {
		return 0, false
	}
	return binary.LittleEndian.Uint16(b), true
}

// knownKeyType reports whether key is a base64 cephx key of a type that
// some librados reads: aes or aes256k.
func knownKeyType(key string) bool {
	t, ok := keyType(key)
	return ok && (t == keyAES || t == keyAES256k)
}

// dialTimeout bounds each TCP dial of reachable, and the wait for the banner.
const dialTimeout = 3 * time.Second

// reachable reports whether any of the addresses answers as a Ceph
// monitor within timeout: it accepts a TCP connection and sends the
// messenger's banner ("ceph v027" for v1, "ceph v2\n" for v2) at once. A
// hung monitor process still has its connections accepted by the kernel,
// so a connect alone proves nothing. It returns once all dials have
// finished.
func reachable(addrs []string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		ok bool
	)
	for _, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if probeMessenger(ctx, a, timeout) == msgrUnknown {
				return
			}
			mu.Lock()
			ok = true
			mu.Unlock()
			cancel()
		}()
	}
	wg.Wait()
	return ok
}

// seconds formats d as a whole number of seconds, at least 1, rounded up:
// some librados versions take these options as integers.
func seconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(s, 1), 10)
}
