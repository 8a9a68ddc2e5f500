// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
//
// With clang and -Wthread-safety the compiler checks the lock rules these state: a field marked
// GUARDED_BY(mu) is touched only with `mu` held, a function marked REQUIRES(mu) is called only with
// it held, EXCLUDES(mu) only without. Under other compilers (GCC builds kvpush by default) every
// macro expands to nothing. scripts/thread-safety.sh compiles the annotated translation units with
// clang and -Werror=thread-safety (docs/xfer.md, "Checking").
//
// The lockable type is kvpush::Mutex (common/mutex.h): libstdc++'s std::mutex carries no
// annotations, so a std::mutex field cannot be named in them.
#pragma once

#if defined(__clang__)
#define KVP_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVP_THREAD_ANNOTATION_(x)
#endif

/// A type that is a lock ("mutex") for the analysis.
#define CAPABILITY(x) KVP_THREAD_ANNOTATION_(capability(x))
/// An RAII type that holds a capability from construction to destruction.
#define SCOPED_CAPABILITY KVP_THREAD_ANNOTATION_(scoped_lockable)
/// A field that may be read or written only with the given capability held.
#define GUARDED_BY(x) KVP_THREAD_ANNOTATION_(guarded_by(x))
/// A pointer whose pointee may be touched only with the given capability held.
#define PT_GUARDED_BY(x) KVP_THREAD_ANNOTATION_(pt_guarded_by(x))
/// Lock order: this capability is taken after the given ones.
#define ACQUIRED_AFTER(...) KVP_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
/// Lock order: this capability is taken before the given ones.
#define ACQUIRED_BEFORE(...) KVP_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
/// The caller must hold the capabilities (exclusively).
#define REQUIRES(...) KVP_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
/// The caller must hold the capabilities, at least shared.
#define REQUIRES_SHARED(...) KVP_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
/// The function acquires the capabilities (and returns holding them).
#define ACQUIRE(...) KVP_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
/// The function acquires the capabilities shared.
#define ACQUIRE_SHARED(...) KVP_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
/// The function releases the capabilities (held on entry).
#define RELEASE(...) KVP_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
/// The function releases shared capabilities.
#define RELEASE_SHARED(...) KVP_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
/// The function tries to acquire the capability; the first argument is the return value on success.
#define TRY_ACQUIRE(...) KVP_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
/// The caller must not hold the capabilities (the function takes them).
#define EXCLUDES(...) KVP_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
/// The function checks at run time (or the code states) that the capability is held; the analysis
/// assumes it is held afterwards.
#define ASSERT_CAPABILITY(x) KVP_THREAD_ANNOTATION_(assert_capability(x))
/// The function returns a reference to the given capability (lets annotations name it through an
/// accessor, e.g. GUARDED_BY(shell_.mu())).
#define RETURN_CAPABILITY(x) KVP_THREAD_ANNOTATION_(lock_returned(x))
/// Turns the analysis off for one function (say why at the use).
#define NO_THREAD_SAFETY_ANALYSIS KVP_THREAD_ANNOTATION_(no_thread_safety_analysis)
