package main

import "testing"

func TestGoMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want int64
		ok   bool
	}{
		{map[string]string{memoryLimitEnv: "536870912"}, 402653184, true},
		{map[string]string{memoryLimitEnv: "536870912", "GOMEMLIMIT": "100MiB"}, 0, false},
		{map[string]string{}, 0, false},
		{map[string]string{memoryLimitEnv: "0"}, 0, false},
		{map[string]string{memoryLimitEnv: "512Mi"}, 0, false},
		// The downward API's value for a container without a limit: the
		// node's allocatable memory; still a limit.
		{map[string]string{memoryLimitEnv: "25769803776"}, 19327352832, true},
	} {
		got, ok := goMemoryLimit(func(k string) string { return tc.env[k] })
		if got != tc.want || ok != tc.ok {
			t.Errorf("%v: %d, %v; want %d, %v", tc.env, got, ok, tc.want, tc.ok)
		}
	}
}
