// threads.cpp: threads that Go did not start, dying as a librados thread can.
#include <cerrno>
#include <system_error>
#include <thread>

extern "C" void rsm_test_throw(void) {
  std::thread([] { throw std::system_error(EOWNERDEAD, std::generic_category()); }).detach();
}

extern "C" void rsm_test_fault(void) {
  std::thread([] { *static_cast<volatile int *>(nullptr) = 1; }).detach();
}
