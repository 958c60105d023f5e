// crasher dies the ways crash_test.go checks: argv[1] names how, and
// -install puts crash.Install in front first.
package main

/*
#include <stddef.h>
void rsm_test_throw(void);
void rsm_test_fault(void);
void rsm_test_bound_abort(void);
size_t rsm_test_cgo_fault(void);
*/
import "C"

import (
	"flag"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/crash"
)

func main() {
	install := flag.Bool("install", false, "crash.Install first")
	flag.Parse()
	if *install {
		if err := crash.Install(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
	}
	switch flag.Arg(0) {
	case "throw": // a C++ thread throws what nobody catches, as librados did
		C.rsm_test_throw()
	case "fault": // a C++ thread dereferences null
		C.rsm_test_fault()
	case "bound-abort": // a C++ thread calls into Go, then aborts
		C.rsm_test_bound_abort()
	case "cgo-fault": // libc faults in a cgo call, on a Go thread
		C.rsm_test_cgo_fault()
	case "go-nil": // Go's own nil dereference must stay a recoverable panic
		defer func() { fmt.Println("recovered:", recover()) }()
		var p *int
		*p = 1
	case "go-abort": // SIGABRT to the process: the runtime's dump, as ever
		_ = syscall.Kill(os.Getpid(), syscall.SIGABRT)
	default:
		fmt.Fprintln(os.Stderr, "usage: crasher [-install] throw|fault|bound-abort|cgo-fault|go-nil|go-abort")
		os.Exit(2)
	}
	time.Sleep(10 * time.Second)
	fmt.Println("still alive")
}

//export goNothing
func goNothing() {}
