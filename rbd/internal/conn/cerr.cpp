// std::cerr for package conn's init (cerr.go): librados logs to it before
// its configuration applies (log_to_stderr and err_to_stderr reach its log
// only once connected), and quotes there a key it cannot decode. Go's own
// stderr (klog, the runtime) is not std::cerr.
#include <iostream>

// rsm_silence_cerr: std::cerr writes nothing from now on.
extern "C" void rsm_silence_cerr(void) { std::cerr.rdbuf(nullptr); }
