// Happens-before edges ThreadSanitizer cannot see on its own: gRPC (uninstrumented, from
// Debian) hands a reactor from the thread that created it to the threads that run its
// callbacks, ordered by gRPC's internal locking. KVARN_TSAN_RELEASE(p) at the end of one side
// and KVARN_TSAN_ACQUIRE(p) at the start of the other state that order for TSan. No-ops in
// other builds.
#ifndef KVARN_COMMON_TSAN_H_
#define KVARN_COMMON_TSAN_H_

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVARN_TSAN 1
#endif
#endif

#ifdef KVARN_TSAN
#include <sanitizer/tsan_interface.h>
#define KVARN_TSAN_ACQUIRE(p) __tsan_acquire(const_cast<void*>(static_cast<const volatile void*>(p)))
#define KVARN_TSAN_RELEASE(p) __tsan_release(const_cast<void*>(static_cast<const volatile void*>(p)))
#else
#define KVARN_TSAN_ACQUIRE(p) ((void)(p))
#define KVARN_TSAN_RELEASE(p) ((void)(p))
#endif

#endif  // KVARN_COMMON_TSAN_H_
