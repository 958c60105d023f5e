package conn

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Monitor addresses, as Ceph-CSI's config lists them and as librados reads
// them (Ceph's MonMap::_add_ambiguous_addr):
//
//	10.0.0.1:6789                       the legacy port: msgr v1
//	10.0.0.1:3300                       the IANA port: msgr v2
//	10.0.0.1                            both: v2 on 3300 and v1 on 6789
//	10.0.0.1:16789                      ambiguous: librados adds a v2 AND a v1
//	                                    address on that port and hunts between them
//	v1:10.0.0.1:6789, v2:...            typed: as written
//	any:10.0.0.1:16789                  "any" is no type: as without it
//	[v2:10.0.0.1:3300,v1:10.0.0.1:6789] one monitor with two addresses
//	mon.example.com:6789                a name, resolved by librados
//	[2001:db8::1]:6789, 2001:db8::1     IPv6, as above
//
// An entry may also hold several of these separated by commas, as mon_host
// does.
//
// Everything connects as written except the ambiguous form. There, librados
// tries the protocol that the port does not speak half of the time, and a
// refused login (wrong key, unknown user) then surfaces only as a timeout
// after client_mount_timeout, indistinguishable from an unreachable cluster.
// So before each connect, typeMonHost asks such a port what it speaks: a
// monitor greets every new connection with its messenger's banner, "ceph
// v027" for v1 and "ceph v2\n" for msgr2, before the client says anything.
// The address is then typed accordingly. The same probe leaves out the
// monitors that are down (see typeMonHost).

// Ceph's default monitor ports.
const (
	monPortV1 = "6789" // CEPH_MON_PORT_LEGACY
	monPortV2 = "3300" // CEPH_MON_PORT_IANA
)

// MonHost checks Ceph-CSI's monitor list and returns it as one mon_host
// value, entries as written (the cache key of connections), and the TCP
// addresses (host:port) that the monitors listen on, for telling an
// unreachable monitor from a refused login.
func MonHost(monitors []string) (host string, dial []string, err error) {
	var parts []string
	for _, m := range monitors {
		for _, e := range splitMonHost(m) {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			addrs, err := monitorDial(e)
			if err != nil {
				return "", nil, err
			}
			parts = append(parts, e)
			dial = append(dial, addrs...)
		}
	}
	if len(parts) == 0 {
		return "", nil, fmt.Errorf("no monitors")
	}
	return strings.Join(parts, ","), dial, nil
}

// splitMonHost splits a mon_host value at the commas that are not inside an
// address vector's brackets.
func splitMonHost(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// monitorDial checks one monitor entry and returns its TCP addresses.
func monitorDial(m string) (dial []string, err error) {
	if strings.ContainsAny(m, "\x00 \t\n;") {
		return nil, fmt.Errorf("monitor %q: invalid character", m)
	}
	if strings.HasPrefix(m, "[") && strings.HasSuffix(m, "]") && typed(m[1:]) {
		for _, a := range strings.Split(m[1:len(m)-1], ",") {
			if !typed(a) {
				return nil, fmt.Errorf("monitor %q: address %q has no v1:/v2: prefix", m, a)
			}
			dial = append(dial, untyped(a))
		}
		return dial, nil
	}
	if typed(m) {
		return []string{untyped(m)}, nil
	}
	if _, _, err := net.SplitHostPort(m); err != nil {
		// No port: librados tries both default ports.
		h := strings.TrimSuffix(strings.TrimPrefix(m, "["), "]")
		return []string{net.JoinHostPort(h, monPortV2), net.JoinHostPort(h, monPortV1)}, nil
	}
	return []string{m}, nil
}

// ambiguous reports whether librados would try both messenger versions on
// the one port of monitor entry m, and if so returns its host and port.
func ambiguous(m string) (host, port string, ok bool) {
	m = strings.TrimPrefix(m, "any:") // entity_addr_t::TYPE_ANY, as with no prefix
	if typed(m) || strings.HasPrefix(m, "[") && strings.HasSuffix(m, "]") {
		return "", "", false
	}
	if i := strings.IndexByte(m, '/'); i >= 0 {
		m = m[:i] // a nonce
	}
	host, port, err := net.SplitHostPort(m)
	if err != nil || port == monPortV1 || port == monPortV2 || port == "0" {
		return "", "", false
	}
	return host, port, true
}

// Messenger versions, as a monitor's banner tells them.
const (
	msgrUnknown = ""
	msgrV1      = "v1"
	msgrV2      = "v2"
)

// typeMonHost returns the mon_host to give librados: each ambiguous
// address typed by the protocol that its port speaks (see above), a host
// name on such a port resolved and each of its addresses typed, and the
// monitors that do not greet left out, as long as one does. librados hunts
// among the monitors it is given and learns the others from the cluster's
// monitor map once it has a session; but while one of the given monitors
// does not answer, a refused login on another is not final to librados,
// and it waits for client_mount_timeout. Each probe takes at most timeout;
// the probes run in parallel.
func typeMonHost(ctx context.Context, monHost string, timeout time.Duration) string {
	parts := splitMonHost(monHost)
	out := make([]string, len(parts))
	alive := make([]bool, len(parts))
	var wg sync.WaitGroup
	for i, m := range parts {
		m = strings.TrimSpace(m)
		out[i] = m
		wg.Add(1)
		go func() {
			defer wg.Done()
			if host, port, ok := ambiguous(m); ok {
				out[i], alive[i] = typeMonitor(ctx, host, port, timeout)
				return
			}
			if dial, err := monitorDial(m); err == nil {
				alive[i] = reachable(dial, timeout)
			}
		}()
	}
	wg.Wait()
	var live []string
	for i := range out {
		if alive[i] {
			live = append(live, out[i])
		}
	}
	if len(live) == 0 {
		return strings.Join(out, ",") // as written: librados may still get through
	}
	return strings.Join(live, ",")
}

// typeMonitor types the ambiguous monitor host:port; see typeMonHost. It
// returns the monitor as written when none of its addresses greets.
func typeMonitor(ctx context.Context, host, port string, timeout time.Duration) (typed string, alive bool) {
	asWritten := net.JoinHostPort(host, port) // "any:" adds nothing
	ips := []string{host}
	if net.ParseIP(host) == nil {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		resolved, err := net.DefaultResolver.LookupHost(rctx, host)
		cancel()
		if err != nil || len(resolved) == 0 {
			return asWritten, false // librados will fail to resolve it as well
		}
		ips = resolved
	}
	out := make([]string, len(ips))
	var wg sync.WaitGroup
	for i, ip := range ips {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := net.JoinHostPort(ip, port)
			if v := probeMessenger(ctx, a, timeout); v != msgrUnknown {
				out[i] = v + ":" + a
			}
		}()
	}
	wg.Wait()
	var greeted []string
	for _, a := range out {
		if a != "" {
			greeted = append(greeted, a)
		}
	}
	if len(greeted) == 0 {
		return asWritten, false
	}
	return strings.Join(greeted, ","), true
}

// probeMessenger connects to addr and returns the messenger version that
// its banner announces, or msgrUnknown when nothing there greets as a Ceph
// daemon within timeout.
func probeMessenger(ctx context.Context, addr string, timeout time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return msgrUnknown
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	if c.SetReadDeadline(deadline) != nil {
		return msgrUnknown
	}
	return bannerVersion(c)
}

// bannerVersion reads a Ceph messenger banner from r: "ceph v027" (v1) or
// "ceph v2\n" (msgr2). It reads 8 bytes, which tell the two apart.
func bannerVersion(r io.Reader) string {
	b := make([]byte, 8)
	if _, err := io.ReadFull(r, b); err != nil {
		return msgrUnknown
	}
	switch string(b) {
	case "ceph v02":
		return msgrV1
	case "ceph v2\n":
		return msgrV2
	}
	return msgrUnknown
}

// typed reports whether a monitor address starts with a messenger type.
func typed(a string) bool {
	return strings.HasPrefix(a, "v1:") || strings.HasPrefix(a, "v2:") || strings.HasPrefix(a, "any:")
}

// untyped strips the messenger type and any "/nonce" suffix of an address.
func untyped(a string) string {
	a = a[strings.IndexByte(a, ':')+1:]
	if i := strings.IndexByte(a, '/'); i >= 0 {
		a = a[:i]
	}
	return a
}
