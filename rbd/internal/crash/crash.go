// Package crash reports the stack of C or C++ code (librados, librbd)
// that kills the process.
//
// librados and librbd run threads of their own (messengers, timers,
// finishers). When one of them aborts (a failed Ceph assertion, or a C++
// exception that nobody catches: libstdc++ prints its type and message,
// then aborts) or faults, the process dies, and the Go runtime says
// nothing at all about a thread it did not start: the container's log
// ends with libstdc++'s line, or with nothing. Install adds the stack of
// that thread to the log, as the C library's backtrace_symbols_fd writes
// it (a library, a symbol when the library exports it, an offset), so
// that a crash can be told apart and reported to Ceph. A fault in a
// library during a cgo call gets that stack too, before the runtime's own
// report of the goroutine that made the call.
//
// The report is for signals that hit a thread without the runtime's
// alternate signal stack, or code outside the executable (a library). The
// rest are the Go runtime's alone, reported as they always were: a nil
// dereference in Go still panics, and SIGABRT to a Go thread still dumps
// the goroutines. In every case the process ends as it would have, by the
// same signal. A thread that overflows its stack cannot run the report.
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
