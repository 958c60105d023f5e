// crash.c: see crash.go. Everything the handler calls is async-signal-safe
// (write, sigaltstack, backtrace_symbols_fd), except backtrace, whose first
// call loads libgcc: rsm_crash_install makes that call first.

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static const int rsm_signals[] = {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE};
#define RSM_NSIG (sizeof(rsm_signals) / sizeof(rsm_signals[0]))

static struct sigaction rsm_prev[RSM_NSIG]; // the Go runtime's handlers
static volatile sig_atomic_t rsm_reported;

static void rsm_put(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

static void rsm_on_fatal(int sig, siginfo_t *info, void *uctx) {
  unsigned i = 0;
  while (i < RSM_NSIG - 1 && rsm_signals[i] != sig) {
    i++;
  }
  // A thread of the Go runtime runs its signal handlers on an alternate
  // stack: the runtime reports those itself. Threads that librados and
  // librbd start have none, and the runtime says nothing about them.
  stack_t ss;
  if (!rsm_reported && sigaltstack(NULL, &ss) == 0 && !(ss.ss_flags & SS_ONSTACK)) {
    rsm_reported = 1;
    void *frames[64];
    int n = backtrace(frames, 64);
    rsm_put("rbd-snapshot-metadata: fatal signal ");
    rsm_put(sig == SIGABRT ? "SIGABRT (an abort: a failed Ceph assertion, or the uncaught C++ exception printed above)"
            : sig == SIGSEGV ? "SIGSEGV"
            : sig == SIGBUS  ? "SIGBUS"
            : sig == SIGILL  ? "SIGILL"
                             : "SIGFPE");
    rsm_put(" in a thread of librados or librbd; its stack, innermost first:\n");
    backtrace_symbols_fd(frames, n, 2);
    rsm_put("rbd-snapshot-metadata: end of the stack\n");
  }
  // On to the Go runtime's handler, which ends the process as it would
  // have without this one (or reports a Go thread's signal).
  struct sigaction *p = &rsm_prev[i];
  if (p->sa_flags & SA_SIGINFO) {
    p->sa_sigaction(sig, info, uctx);
  } else if (p->sa_handler != SIG_IGN && p->sa_handler != SIG_DFL) {
    p->sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

int rsm_crash_install(void) {
  void *frames[1];
  backtrace(frames, 1);
  for (unsigned i = 0; i < RSM_NSIG; i++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = rsm_on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigfillset(&sa.sa_mask);
    if (sigaction(rsm_signals[i], &sa, &rsm_prev[i]) != 0) {
      return -1;
    }
  }
  return 0;
}
