package conn

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestMonHost(t *testing.T) {
	for _, tc := range []struct {
		in       []string
		host     string
		dial     []string
		wantFail bool
	}{
		{in: []string{"127.0.0.1:16489"}, host: "127.0.0.1:16489", dial: []string{"127.0.0.1:16489"}},
		{in: []string{"10.0.0.1:3300"}, host: "10.0.0.1:3300", dial: []string{"10.0.0.1:3300"}},
		{in: []string{"10.0.0.1:6789", " 10.0.0.2:6789 "}, host: "10.0.0.1:6789,10.0.0.2:6789",
			dial: []string{"10.0.0.1:6789", "10.0.0.2:6789"}},
		{in: []string{"10.0.0.1:6789,10.0.0.2:6789"}, host: "10.0.0.1:6789,10.0.0.2:6789",
			dial: []string{"10.0.0.1:6789", "10.0.0.2:6789"}},
		{in: []string{"[2001:db8::1]:6789"}, host: "[2001:db8::1]:6789", dial: []string{"[2001:db8::1]:6789"}},
		{in: []string{"2001:db8::1"}, host: "2001:db8::1", dial: []string{"[2001:db8::1]:3300", "[2001:db8::1]:6789"}},
		{in: []string{"10.0.0.1"}, host: "10.0.0.1", dial: []string{"10.0.0.1:3300", "10.0.0.1:6789"}},
		{in: []string{"v2:10.0.0.1:3300/0"}, host: "v2:10.0.0.1:3300/0", dial: []string{"10.0.0.1:3300"}},
		{in: []string{"[v2:127.0.0.1:15500,v1:127.0.0.1:15489]"}, host: "[v2:127.0.0.1:15500,v1:127.0.0.1:15489]",
			dial: []string{"127.0.0.1:15500", "127.0.0.1:15489"}},
		{in: []string{"[v2:127.0.0.1:15500,v1:127.0.0.1:15489],v1:10.0.0.2:6789"},
			host: "[v2:127.0.0.1:15500,v1:127.0.0.1:15489],v1:10.0.0.2:6789",
			dial: []string{"127.0.0.1:15500", "127.0.0.1:15489", "10.0.0.2:6789"}},
		{in: []string{"mon.example.com:6789"}, host: "mon.example.com:6789", dial: []string{"mon.example.com:6789"}},
		{in: nil, wantFail: true},
		{in: []string{"", " "}, wantFail: true},
		{in: []string{"[v2:1.2.3.4:3300,1.2.3.4:6789]"}, wantFail: true},
		{in: []string{"1.2.3.4:6789;x"}, wantFail: true},
	} {
		host, dial, err := MonHost(tc.in)
		if tc.wantFail {
			if err == nil {
				t.Errorf("MonHost(%q) = %q; want an error", tc.in, host)
			}
			continue
		}
		if err != nil {
			t.Errorf("MonHost(%q): %v", tc.in, err)
			continue
		}
		if host != tc.host {
			t.Errorf("MonHost(%q) = %q; want %q", tc.in, host, tc.host)
		}
		if diff := cmp.Diff(tc.dial, dial); diff != "" {
			t.Errorf("MonHost(%q) dial addresses (-want +got):\n%s", tc.in, diff)
		}
	}
}

// fakeMonitor listens on 127.0.0.1 and greets each connection with banner,
// as a Ceph daemon does; an empty banner accepts and says nothing.
func fakeMonitor(t *testing.T, banner string) (port string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if banner != "" {
				c.Write([]byte(banner))
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	_, port, _ = net.SplitHostPort(l.Addr().String())
	return port
}

// closedPort returns a port on 127.0.0.1 where nothing listens.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}

func TestTypeMonHost(t *testing.T) {
	v1 := fakeMonitor(t, "ceph v027\x00\x00\x00")
	v2 := fakeMonitor(t, "ceph v2\n\x10\x00")
	mute := fakeMonitor(t, "")
	http := fakeMonitor(t, "HTTP/1.1 400 Bad Request\r\n")
	down := closedPort(t)
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:" + v1, "v1:127.0.0.1:" + v1},
		{"127.0.0.1:" + v2, "v2:127.0.0.1:" + v2},
		// Nothing greets: as written, for librados to try.
		{"127.0.0.1:" + mute, "127.0.0.1:" + mute},
		{"127.0.0.1:" + http, "127.0.0.1:" + http},
		{"127.0.0.1:" + down, "127.0.0.1:" + down},
		{"v2:127.0.0.1:" + down + ",127.0.0.1:" + mute, "v2:127.0.0.1:" + down + ",127.0.0.1:" + mute},
		// Several monitors, some down: only those that greet; commas
		// inside an address vector.
		{"127.0.0.1:" + down + ",127.0.0.1:" + v2 + ",[v2:127.0.0.1:" + down + ",v1:127.0.0.1:" + v1 + "]",
			"v2:127.0.0.1:" + v2 + ",[v2:127.0.0.1:" + down + ",v1:127.0.0.1:" + v1 + "]"},
		{"v1:127.0.0.1:" + down + ",v2:127.0.0.1:" + v2 + ",127.0.0.1:" + mute, "v2:127.0.0.1:" + v2},
		// Unambiguous forms are left to librados.
		{"v1:127.0.0.1:" + v2, "v1:127.0.0.1:" + v2},
		{"v2:127.0.0.1:" + v2 + "/0", "v2:127.0.0.1:" + v2 + "/0"},
		// "any:" is no type at all for librados: ambiguous as without it.
		{"any:127.0.0.1:" + v2, "v2:127.0.0.1:" + v2},
		{"any:127.0.0.1:" + v1, "v1:127.0.0.1:" + v1},
		// Default ports and no port: as written (nothing listens there
		// in this test, so nothing is left out either).
		{"127.0.0.1:6789", "127.0.0.1:6789"},
		{"127.0.0.1:3300", "127.0.0.1:3300"},
		{"127.0.0.1", "127.0.0.1"},
		{"any:127.0.0.1:6789", "any:127.0.0.1:6789"},
		{"localhost:6789", "localhost:6789"},
		{"[::1]:6789", "[::1]:6789"},
		// A name that does not resolve stays as written.
		{"no-such-monitor.invalid:" + v2, "no-such-monitor.invalid:" + v2},
	} {
		if got := typeMonHost(context.Background(), tc.in, time.Second); got != tc.want {
			t.Errorf("typeMonHost(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}

	// A name: each address it resolves to that greets, typed (localhost
	// may also resolve to ::1, where nothing listens: that one is left out).
	if got, want := typeMonHost(context.Background(), "localhost:"+v2, time.Second), "v2:127.0.0.1:"+v2; got != want {
		t.Errorf("typeMonHost(localhost:%s) = %q; want %q", v2, got, want)
	}
}
