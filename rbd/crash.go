package rbd

import "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/crash"

// ReportCrashes makes a librados or librbd thread that kills the process
// (an abort: a failed Ceph assertion or an uncaught C++ exception; a
// fault) write its stack to stderr first: the Go runtime reports only its
// own threads, and the log of such a crash would otherwise end with
// libstdc++'s one line, or with nothing. The process still dies as it
// would have. Call it once main runs; later calls do nothing.
func ReportCrashes() error { return crash.Install() }
