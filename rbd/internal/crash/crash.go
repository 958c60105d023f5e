// Package crash reports the stack of a librados or librbd thread that
// kills the process.
//
// librados and librbd run threads of their own (messengers, timers,
// finishers). When one of them aborts (a failed Ceph assertion, or a C++
// exception that nobody catches: libstdc++ prints its type and message,
// then aborts) or faults, the process dies, and the Go runtime says
// nothing at all about a thread it did not start: the container's log
// ends with libstdc++'s line, or with nothing. Install adds the stack of
// that thread to the log, as the C library's backtrace_symbols_fd writes
// it (a library, a symbol when the library exports it, an offset), so
// that a crash can be told apart and reported to Ceph.
//
// Signals of the Go runtime's own threads (a nil dereference in Go, a
// fault inside a cgo call) still go to the runtime alone, which reports
// them as it always does; the process still dies as it would have, by the
// same signal.
package crash

/*
#cgo CFLAGS: -O2
int rsm_crash_install(void);
*/
import "C"

import (
	"errors"
	"sync"
)

var (
	once sync.Once
	err  error
)

// Install puts the report in front of the Go runtime's handlers of
// SIGABRT, SIGSEGV, SIGBUS, SIGILL and SIGFPE. It must run after the
// runtime installed them (any time once main runs); only its first call
// does anything.
func Install() error {
	once.Do(func() {
		if C.rsm_crash_install() != 0 {
			err = errors.New("install the fatal signal handlers")
		}
	})
	return err
}
