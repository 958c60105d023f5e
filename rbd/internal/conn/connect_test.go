package conn

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
)

// secretKey is an aes cephx key, as reef's ceph-authtool makes them.
const (
	secretKey = "AQA5pQxrGkLPIhAAH5Kb9DVHbQG5jxVwOxfINg=="
	keyType2  = "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="
	keyType7  = "BwAa8A5rtvaDEyAA"
)

// errno is a go-ceph-like error carrying an errno of either sign.
type errno int

func (e errno) Error() string  { return fmt.Sprintf("ret=%d", int(e)) }
func (e errno) ErrorCode() int { return int(e) }

// sentinels are the classes of driver.Source.
var sentinels = []error{fs.ErrNotExist, fs.ErrInvalid, fs.ErrPermission, errors.ErrUnsupported, os.ErrDeadlineExceeded, cepherr.ErrUnavailable}

func TestConnectErrorClassifies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A live monitor sends its banner at once.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("ceph v2\n"))
			defer c.Close()
		}
	}()
	// A hung monitor: the kernel accepts, nothing answers.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	tm := Timeouts{Mount: 10 * time.Second}
	for _, tc := range []struct {
		name string
		dial []string
		err  error
		want error
		auth bool // a refused login: Unauthenticated() is true
		text string
		key  string // "": secretKey, an aes key
	}{
		{"refused", []string{ln.Addr().String()}, errno(-int(syscall.EACCES)), fs.ErrPermission, true, "authentication failed", ""},
		{"eperm", []string{ln.Addr().String()}, errno(-int(syscall.EPERM)), fs.ErrPermission, true, "authentication failed", ""},
		// Tentacle's librados reads aes256k keys: refused, a wrong key.
		{"refused aes256k", []string{ln.Addr().String()}, errno(-int(syscall.EACCES)), fs.ErrPermission, true, "authentication failed", keyType2},
		// Tentacle's librados over msgr2 sends a key of a type it does not
		// know, and the monitor refuses it: the key's type is the trouble.
		{"refused type 7", []string{ln.Addr().String()}, errno(-int(syscall.EACCES)), fs.ErrInvalid, false, "type 7", keyType7},
		{"refused not base64", []string{ln.Addr().String()}, errno(-int(syscall.EACCES)), fs.ErrInvalid, false, "not a base64 cephx key", "not-base64"},
		// A monitor that greets but gives no session: no quorum, or hung
		// past the banner. Retryable, never a refused login.
		{"no session", []string{closedAddr, ln.Addr().String()}, errno(-int(syscall.ETIMEDOUT)), os.ErrDeadlineExceeded, false, "gave no session", ""},
		{"unreachable", []string{closedAddr}, errno(-int(syscall.ETIMEDOUT)), os.ErrDeadlineExceeded, false, "unreachable", ""},
		{"hung monitor", []string{hung.Addr().String()}, errno(-int(syscall.ETIMEDOUT)), os.ErrDeadlineExceeded, false, "unreachable", ""},
		{"other", []string{closedAddr}, errno(-int(syscall.EIO)), nil, false, "input/output error", ""},
	} {
		p := params
		p.Dial = tc.dial
		p.Key = secretKey
		if tc.key != "" {
			p.Key = tc.key
		}
		err := connectError(p, tm, tc.err)
		for _, sen := range sentinels {
			if is := errors.Is(err, sen); is != (sen == tc.want) {
				t.Errorf("%s: %v; errors.Is(%v) = %v", tc.name, err, sen, is)
			}
		}
		var u interface{ Unauthenticated() bool }
		if auth := errors.As(err, &u) && u.Unauthenticated(); auth != tc.auth {
			t.Errorf("%s: %v; Unauthenticated() = %v, want %v", tc.name, err, auth, tc.auth)
		}
		if !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %q does not mention %q", tc.name, err, tc.text)
		}
		// Every failed connect: the driver does not retry a first open.
		var ns interface{ NoSession() bool }
		if !errors.As(err, &ns) || !ns.NoSession() {
			t.Errorf("%s: %v has no NoSession() true", tc.name, err)
		}
		// The user's name comes from the request's secrets: not in errors.
		if strings.Contains(err.Error(), p.User) {
			t.Errorf("%s: %q names the cephx user %q", tc.name, err, p.User)
		}
		if strings.Contains(err.Error(), p.Key) {
			t.Errorf("%s: %q contains the key", tc.name, err)
		}
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "1", time.Millisecond: "1", time.Second: "1", 1500 * time.Millisecond: "2", 10 * time.Second: "10",
	} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%v) = %s; want %s", d, got, want)
		}
	}
}

// TestConnectRefusesKeyType: a key librados cannot read answers EOPNOTSUPP
// on connect (tentacle): INVALID_ARGUMENT, not temporary.
func TestConnectRefusesKeyType(t *testing.T) {
	err := connectError(Params{MonHost: "x", Key: keyType2}, Timeouts{}, errno(-int(syscall.EOPNOTSUPP)))
	if !errors.Is(err, fs.ErrInvalid) || cepherr.Temporary(err) {
		t.Errorf("connect refusing the key's type: %v, temporary %v; want INVALID_ARGUMENT, not temporary", err, cepherr.Temporary(err))
	}
}

// TestKeyTrouble: a key librados refuses with EINVAL is explained by its
// type, and never quoted.
func TestKeyTrouble(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"AQAY8A5rW8adERAAomp1b3NoV+RmNC+KhpczOA==", ""},                            // reef's ceph-authtool
		{"AgAa8A5rtvaDEyAA3tetUzql166We1DQGmG5MOMnkpH80lLjnkaU2uwtA3k=", "aes256k"}, // tentacle's
		{"BwAa8A5rtvaDEyAA", "type 7"},
		{"not base64!", "not a base64 cephx key"},
		{"", "not a base64 cephx key"},
	} {
		got := keyTrouble(tc.key)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("keyTrouble(%q) = %q, want %q", tc.key, got, tc.want)
		}
		if tc.key != "" && strings.Contains(got, tc.key) {
			t.Errorf("keyTrouble quotes the key: %q", got)
		}
	}
}

// TestFailedConnectsLeaveNoThreads: a failed rados_connect leaves the
// handle's threads running until something shuts it down; connect does so
// at once, so that wrong keys do not pile threads up.
func TestFailedConnectsLeaveNoThreads(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := params
	p.MonHost, p.Dial, p.Key = "v1:"+addr, []string{addr}, secretKey
	tm := Timeouts{Mount: time.Second, Op: time.Second}
	const n = 8
	attempt := func() {
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if conn, err := connect(p, tm); err == nil {
					conn.Shutdown()
					t.Error("connect to nothing succeeded")
				}
			}()
		}
		wg.Wait()
	}
	attempt() // Go's own threads for n cgo calls at once
	before := osThreads(t)
	attempt()
	attempt()
	after := osThreads(t)
	t.Logf("threads: %d before, %d after %d more failed connects", before, after, 2*n)
	if after > before+n/2 {
		t.Errorf("%d threads after %d failed connects, %d before: their handles were left running", after, 2*n, before)
	}
}

func osThreads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads in /proc/self/status")
	return 0
}
