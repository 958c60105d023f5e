// crash.c: see crash.go. Everything the handler calls is async-signal-safe
// (write, getpid, sigaltstack, nanosleep, backtrace_symbols_fd), except backtrace,
// whose first call loads libgcc: rsm_crash_install makes that call first.
// A fault inside the handler itself (all signals are blocked while it
// runs) makes the kernel end the process at once: its report is cut short.

#define _GNU_SOURCE
#include <execinfo.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

static const int rsm_signals[] = {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE};
#define RSM_NSIG (sizeof(rsm_signals) / sizeof(rsm_signals[0]))

static struct sigaction rsm_prev[RSM_NSIG]; // the Go runtime's handlers

// The executable's code (the Go program, and the C it links in), as
// address ranges: a fault there is the Go runtime's to report.
#define RSM_NRANGE 8
static uintptr_t rsm_text[RSM_NRANGE][2];
static int rsm_ntext;

static int rsm_reporting, rsm_reported; // __atomic

static void rsm_put(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

static void rsm_put_int(long v) {
  char b[24];
  int i = sizeof(b);
  unsigned long u = v < 0 ? -(unsigned long)v : (unsigned long)v;
  b[--i] = 0;
  do {
    b[--i] = '0' + u % 10;
    u /= 10;
  } while (u && i > 1);
  if (v < 0) {
    b[--i] = '-';
  }
  rsm_put(b + i);
}

static uintptr_t rsm_pc(void *uctx) {
#if defined(__x86_64__)
  return (uintptr_t)((ucontext_t *)uctx)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
  return (uintptr_t)((ucontext_t *)uctx)->uc_mcontext.pc;
#else
  (void)uctx;
  return 0;
#endif
}

static int rsm_in_executable(uintptr_t pc) {
  for (int i = 0; i < rsm_ntext; i++) {
    if (rsm_text[i][0] <= pc && pc < rsm_text[i][1]) {
      return 1;
    }
  }
  return 0;
}

// rsm_foreign: the signal hit C or C++ code that the Go runtime does not
// report: a thread without the runtime's alternate signal stack (one that
// librados or librbd started), or any thread outside the executable's code
// (in a library: librados called from Go, or a C thread that once called
// into Go and so got a signal stack).
static int rsm_foreign(void *uctx) {
  stack_t ss;
  if (sigaltstack(NULL, &ss) == 0 && !(ss.ss_flags & SS_ONSTACK)) {
    return 1;
  }
  uintptr_t pc = rsm_pc(uctx);
  return pc != 0 && !rsm_in_executable(pc);
}

static void rsm_report(int sig, siginfo_t *info) {
  void *frames[64];
  int n = backtrace(frames, 64);
  rsm_put("rbd-snapshot-metadata: fatal signal ");
  rsm_put(sig == SIGABRT ? "SIGABRT" : sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGILL ? "SIGILL" : "SIGFPE");
  if (info != NULL && info->si_code <= 0 && info->si_pid != getpid()) {
    rsm_put(" (sent by process ");
    rsm_put_int(info->si_pid);
    rsm_put(")");
  } else if (sig == SIGABRT) {
    rsm_put(" (an abort: a failed Ceph assertion, or the uncaught C++ exception printed above)");
  }
  rsm_put(" in C or C++ code (librados, librbd); the stack of its thread, innermost first:\n");
  backtrace_symbols_fd(frames, n, 2);
  rsm_put("rbd-snapshot-metadata: end of the stack\n");
}

static void rsm_on_fatal(int sig, siginfo_t *info, void *uctx) {
  unsigned i = 0;
  while (i < RSM_NSIG - 1 && rsm_signals[i] != sig) {
    i++;
  }
  if (rsm_foreign(uctx)) {
    if (!__atomic_exchange_n(&rsm_reporting, 1, __ATOMIC_SEQ_CST)) {
      rsm_report(sig, info);
      __atomic_store_n(&rsm_reported, 1, __ATOMIC_SEQ_CST);
    } else {
      // Another thread is reporting: let it finish (up to 2 s) before
      // this one ends the process.
      struct timespec ms = {0, 1000000};
      for (int t = 0; t < 2000 && !__atomic_load_n(&rsm_reported, __ATOMIC_SEQ_CST); t++) {
        nanosleep(&ms, NULL);
      }
    }
  }
  // On to the Go runtime's handler, which ends the process as it would
  // have without this one (or handles a signal of Go code).
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

// rsm_note_text records the executable's code segments (the first object
// dl_iterate_phdr visits is the executable).
static int rsm_note_text(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  for (int i = 0; i < info->dlpi_phnum && rsm_ntext < RSM_NRANGE; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
      rsm_text[rsm_ntext][0] = info->dlpi_addr + ph->p_vaddr;
      rsm_text[rsm_ntext][1] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
      rsm_ntext++;
    }
  }
  return 1; // the executable only
}

int rsm_crash_install(void) {
  void *frames[1];
  backtrace(frames, 1);
  dl_iterate_phdr(rsm_note_text, NULL);
  if (rsm_ntext == 0) {
    return -1;
  }
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
