//go:build e2e

package harness

// The memory of a process, from /proc: what the memory and load tests
// measure the server by.

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MemSampler samples a process's VmRSS from /proc until stopped.
type MemSampler struct {
	pid      int
	stop     chan struct{}
	done     chan struct{}
	peakRSS  int64 // KiB
	Samples  int
	Baseline int64 // KiB, VmRSS when sampling started
}

// ProcStatus returns the fields of /proc/PID/status that are in KiB.
func ProcStatus(t testing.TB, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/status: %v", pid, err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 10, 64)
		if err == nil {
			m[k] = n
		}
	}
	return m
}

// SampleMemory samples the RSS of process pid (VmRSS of /proc) every 5 ms
// until Finish, keeping the peak; Baseline is the first sample.
func SampleMemory(t testing.TB, pid int) *MemSampler {
	t.Helper()
	s := &MemSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	s.Baseline = ProcStatus(t, pid)["VmRSS"]
	s.peakRSS = s.Baseline
	go func() {
		defer close(s.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				return
			}
			if i := bytes.Index(b, []byte("VmRSS:")); i >= 0 {
				var kb int64
				fmt.Sscan(string(b[i+len("VmRSS:"):]), &kb)
				s.peakRSS = max(s.peakRSS, kb)
				s.Samples++
			}
		}
	}()
	return s
}

// Finish stops sampling and returns a summary; VmHWM is the kernel's peak
// RSS since the process started.
func (s *MemSampler) Finish(t testing.TB) (peakRSS, hwm int64) {
	t.Helper()
	close(s.stop)
	<-s.done
	return s.peakRSS, ProcStatus(t, s.pid)["VmHWM"]
}

// FmtKiB prints a size in KiB (as /proc reports them) in MiB.
func FmtKiB(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }
