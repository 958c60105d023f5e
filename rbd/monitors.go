package rbd

import (
	"fmt"
	"net"
	"strings"
)

// monHost turns Ceph-CSI's monitor list into a mon_host value for librados,
// and lists the TCP addresses (host:port) that the monitors listen on, for
// telling an unreachable monitor from a refused login.
//
// Accepted forms of one monitor, as they appear in Ceph-CSI's config:
//
//	10.0.0.1:6789                       msgr v1, written as v1:10.0.0.1:6789
//	10.0.0.1:3300                       msgr v2, written as v2:10.0.0.1:3300
//	[2001:db8::1]:6789                  as above, for IPv6
//	10.0.0.1                            unchanged: librados tries 3300 (v2) and 6789 (v1)
//	v1:10.0.0.1:6789, v2:..., any:...   unchanged
//	[v2:10.0.0.1:3300,v1:10.0.0.1:6789] unchanged (one monitor, two addresses)
//	mon.example.com:6789                unchanged: librados resolves the name
//
// A bare ip:port is msgr v1 unless the port is 3300, which is what librados
// itself assumes and what Ceph-CSI documents; the prefix only makes it
// explicit.
func monHost(monitors []string) (host string, dial []string, err error) {
	var parts []string
	for _, m := range monitors {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		part, addrs, err := monitor(m)
		if err != nil {
			return "", nil, err
		}
		parts = append(parts, part)
		dial = append(dial, addrs...)
	}
	if len(parts) == 0 {
		return "", nil, fmt.Errorf("no monitors")
	}
	return strings.Join(parts, ","), dial, nil
}

// monitor converts one monitor entry; see monHost.
func monitor(m string) (part string, dial []string, err error) {
	if strings.ContainsAny(m, "\x00 \t\n;") {
		return "", nil, fmt.Errorf("monitor %q: invalid character", m)
	}
	if strings.HasPrefix(m, "[") && strings.HasSuffix(m, "]") && typed(m[1:]) {
		for _, a := range strings.Split(m[1:len(m)-1], ",") {
			if !typed(a) {
				return "", nil, fmt.Errorf("monitor %q: address %q has no v1:/v2: prefix", m, a)
			}
			dial = append(dial, untyped(a))
		}
		return m, dial, nil
	}
	if typed(m) {
		return m, []string{untyped(m)}, nil
	}
	h, port, err := net.SplitHostPort(m)
	if err != nil {
		// No port: librados tries both default ports.
		h = strings.TrimSuffix(strings.TrimPrefix(m, "["), "]")
		return m, []string{net.JoinHostPort(h, "3300"), net.JoinHostPort(h, "6789")}, nil
	}
	if net.ParseIP(h) == nil {
		return m, []string{m}, nil // a name: librados resolves it
	}
	proto := "v1:"
	if port == "3300" {
		proto = "v2:"
	}
	return proto + net.JoinHostPort(h, port), []string{net.JoinHostPort(h, port)}, nil
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
