// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
// Under Clang with -Wthread-safety they are checked; under GCC they expand to nothing and
// stay as documentation of which lock guards what.
#pragma once

#if defined(__clang__)
#define RF_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define RF_THREAD_ANNOTATION(x)
#endif

#define RF_GUARDED_BY(x) RF_THREAD_ANNOTATION(guarded_by(x))
#define RF_PT_GUARDED_BY(x) RF_THREAD_ANNOTATION(pt_guarded_by(x))
#define RF_REQUIRES(...) RF_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define RF_EXCLUDES(...) RF_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define RF_ACQUIRED_BEFORE(...) RF_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define RF_ACQUIRED_AFTER(...) RF_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define RF_CAPABILITY(x) RF_THREAD_ANNOTATION(capability(x))
#define RF_SCOPED_CAPABILITY RF_THREAD_ANNOTATION(scoped_lockable)
#define RF_ACQUIRE(...) RF_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RF_RELEASE(...) RF_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RF_NO_THREAD_SAFETY_ANALYSIS RF_THREAD_ANNOTATION(no_thread_safety_analysis)
#define RF_ACQUIRE_SHARED(...) RF_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RF_RELEASE_SHARED(...) RF_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RF_RELEASE_GENERIC(...) RF_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define RF_REQUIRES_SHARED(...) RF_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define RF_ASSERT_CAPABILITY(x) RF_THREAD_ANNOTATION(assert_capability(x))
#define RF_RETURN_CAPABILITY(x) RF_THREAD_ANNOTATION(lock_returned(x))
