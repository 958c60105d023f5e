// threads.cpp: C and C++ code dying as librados can.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

extern "C" void goNothing(void);

// A thread Go did not start throws what nobody catches.
extern "C" void rsm_test_throw(void) {
  std::thread([] { throw std::system_error(EOWNERDEAD, std::generic_category()); }).detach();
}

// A thread Go did not start dereferences null.
extern "C" void rsm_test_fault(void) {
  std::thread([] { *static_cast<volatile int *>(nullptr) = 1; }).detach();
}

// A thread Go did not start calls into Go (which gives it a signal stack
// and keeps it bound), then aborts.
extern "C" void rsm_test_bound_abort(void) {
  std::thread([] {
    goNothing();
    std::abort();
  }).detach();
}

// A library faults inside a cgo call, on a Go thread.
extern "C" size_t rsm_test_cgo_fault(void) {
  const char *volatile p = nullptr;
  return std::strlen(p);
}
