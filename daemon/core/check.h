// Broken invariants. A failed KVARN_CHECK is a bug in kvarnd (never bad input): it logs the
// condition and where, and aborts, because continuing would corrupt shared state (a block
// freed twice, a reference count below zero). KVARN_DCHECK states a `REQUIRES:` precondition
// of an internal interface; it is checked in debug builds (NDEBUG undefined) and costs
// nothing in release builds.
#ifndef KVARN_DAEMON_CORE_CHECK_H_
#define KVARN_DAEMON_CORE_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define KVARN_CHECK(cond, what)                                                              \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "kvarnd: broken invariant at %s:%d: %s (%s)\n", __FILE__, __LINE__, \
                   #cond, what);                                                             \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

#ifdef NDEBUG
#define KVARN_DCHECK(cond, what) \
  do {                           \
  } while (false && (cond))
#else
#define KVARN_DCHECK(cond, what) KVARN_CHECK(cond, what)
#endif

#endif  // KVARN_DAEMON_CORE_CHECK_H_
