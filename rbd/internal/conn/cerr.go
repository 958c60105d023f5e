package conn

/*
#cgo LDFLAGS: -lstdc++
void rsm_silence_cerr(void);
*/
import "C"

// librados writes its log to C++'s std::cerr until a connection's
// configuration reaches it, and before that it quotes there a cephx key it
// cannot decode (reef, given tentacle's aes256k key). Secrets never reach
// a log: the process's std::cerr writes nothing from the time this package
// loads, before any connection is made. klog and the Go runtime write to
// the stderr file itself, not through it.
func init() { C.rsm_silence_cerr() }
