package rbd

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMonHost(t *testing.T) {
	for _, tc := range []struct {
		in       []string
		host     string
		dial     []string
		wantFail bool
	}{
		{in: []string{"127.0.0.1:16489"}, host: "v1:127.0.0.1:16489", dial: []string{"127.0.0.1:16489"}},
		{in: []string{"10.0.0.1:3300"}, host: "v2:10.0.0.1:3300", dial: []string{"10.0.0.1:3300"}},
		{in: []string{"10.0.0.1:6789", " 10.0.0.2:6789 "}, host: "v1:10.0.0.1:6789,v1:10.0.0.2:6789",
			dial: []string{"10.0.0.1:6789", "10.0.0.2:6789"}},
		{in: []string{"[2001:db8::1]:6789"}, host: "v1:[2001:db8::1]:6789", dial: []string{"[2001:db8::1]:6789"}},
		{in: []string{"10.0.0.1"}, host: "10.0.0.1", dial: []string{"10.0.0.1:3300", "10.0.0.1:6789"}},
		{in: []string{"v2:10.0.0.1:3300/0"}, host: "v2:10.0.0.1:3300/0", dial: []string{"10.0.0.1:3300"}},
		{in: []string{"[v2:127.0.0.1:15500,v1:127.0.0.1:15489]"}, host: "[v2:127.0.0.1:15500,v1:127.0.0.1:15489]",
			dial: []string{"127.0.0.1:15500", "127.0.0.1:15489"}},
		{in: []string{"mon.example.com:6789"}, host: "mon.example.com:6789", dial: []string{"mon.example.com:6789"}},
		{in: nil, wantFail: true},
		{in: []string{"", " "}, wantFail: true},
		{in: []string{"[v2:1.2.3.4:3300,1.2.3.4:6789]"}, wantFail: true},
		{in: []string{"1.2.3.4:6789;x"}, wantFail: true},
	} {
		host, dial, err := monHost(tc.in)
		if tc.wantFail {
			if err == nil {
				t.Errorf("monHost(%q) = %q; want an error", tc.in, host)
			}
			continue
		}
		if err != nil {
			t.Errorf("monHost(%q): %v", tc.in, err)
			continue
		}
		if host != tc.host {
			t.Errorf("monHost(%q) = %q; want %q", tc.in, host, tc.host)
		}
		if diff := cmp.Diff(tc.dial, dial); diff != "" {
			t.Errorf("monHost(%q) dial addresses (-want +got):\n%s", tc.in, diff)
		}
	}
}
