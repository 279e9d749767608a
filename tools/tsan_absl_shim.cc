// ThreadSanitizer builds only (PS_SANITIZE=thread): tells TSan about
// absl::Mutex, CondVar, Notification and BlockingCounter.
//
// Why: the Debian absl is a shared library built without TSan, so its Mutex
// synchronises through atomics and futexes TSan never sees, and every field
// guarded by an absl::Mutex would be reported as a race. This file is linked
// into each test executable (ps_add_test): a definition in the executable
// wins over the library's, so every call lands here, annotates the
// operation (sanitizer/tsan_interface.h) and forwards to the real function,
// found by its mangled name in the library (dlsym RTLD_NEXT). A name that is
// not found aborts with a message: the absl version (inline namespace
// "debian3" of the 2022-06-23 LTS) changed.
//
// Limit: Await* and CondVar waits are annotated as releasing and re-taking
// the mutex in writer mode (the code base never waits under a reader lock).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

void* Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_shim: %s not found (absl changed?)\n",
                 mangled);
    std::abort();
  }
  return f;
}

#define PS_REAL(type, mangled)                                    \
  static const auto real = reinterpret_cast<type>(Real(mangled)); \
  Nest nest
#define PS_ABSL "_ZN4absl7debian3"

// The library calls its own exported functions through the PLT (e.g. the
// real AwaitWithTimeout calls AwaitWithDeadline), and those calls land here
// too: only the outermost call on a thread annotates.
thread_local int depth = 0;
struct Nest {
  Nest() { ++depth; }
  ~Nest() { --depth; }
  bool outer() const { return depth == 1; }
};

#define PS_ANNOTATE(call) \
  do {                     \
    if (nest.outer()) call; \
  } while (0)

void Released(void* m, unsigned flags) {
  __tsan_mutex_pre_unlock(m, flags);
  __tsan_mutex_post_unlock(m, flags);
}
constexpr unsigned kRead = __tsan_mutex_read_lock;

// The library evaluates a waiter's condition while it holds the mutex but
// before the wait returns (and before the lock is annotated here), so each
// condition evaluation acquires and then releases the mutex's TSan clock.
struct Guarded {
  const absl::Condition* cond;
  const void* mu;
  bool operator()() const {
    __tsan_acquire(const_cast<void*>(mu));
    const bool r = cond->Eval();
    // If false the library drops the mutex again without telling TSan.
    __tsan_release(const_cast<void*>(mu));
    return r;
  }
};

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// Thread-safety analysis would flag these definitions; they are the lock
// functions themselves.
#pragma clang diagnostic ignored "-Wthread-safety-analysis"

Mutex::~Mutex() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5MutexD2Ev");
  PS_ANNOTATE(__tsan_mutex_destroy(this, 0));
  real(this);
}
void Mutex::Lock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex4LockEv");
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, 0));
  real(this);
  PS_ANNOTATE(__tsan_mutex_post_lock(this, 0, 0));
}
void Mutex::ReaderLock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex10ReaderLockEv");
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, kRead));
  real(this);
  PS_ANNOTATE(__tsan_mutex_post_lock(this, kRead, 0));
}
bool Mutex::TryLock() {
  PS_REAL(bool (*)(Mutex*), PS_ABSL "5Mutex7TryLockEv");
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, __tsan_mutex_try_lock));
  const bool ok = real(this);
  PS_ANNOTATE(__tsan_mutex_post_lock(
      this, __tsan_mutex_try_lock | (ok ? 0 : __tsan_mutex_try_lock_failed),
      0));
  return ok;
}
bool Mutex::ReaderTryLock() {
  PS_REAL(bool (*)(Mutex*), PS_ABSL "5Mutex13ReaderTryLockEv");
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, kRead | __tsan_mutex_try_lock));
  const bool ok = real(this);
  PS_ANNOTATE(__tsan_mutex_post_lock(
      this, kRead | __tsan_mutex_try_lock |
                (ok ? 0 : __tsan_mutex_try_lock_failed),
      0));
  return ok;
}
void Mutex::Unlock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex6UnlockEv");
  // The unlocker evaluates waiters' conditions, published by LockWhen*.
  PS_ANNOTATE(__tsan_acquire(this));
  PS_ANNOTATE(__tsan_mutex_pre_unlock(this, 0));
  real(this);
  PS_ANNOTATE(__tsan_mutex_post_unlock(this, 0));
}
void Mutex::ReaderUnlock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex12ReaderUnlockEv");
  PS_ANNOTATE(__tsan_acquire(this));
  PS_ANNOTATE(__tsan_mutex_pre_unlock(this, kRead));
  real(this);
  PS_ANNOTATE(__tsan_mutex_post_unlock(this, kRead));
}
void Mutex::LockWhen(const Condition& c) {
  PS_REAL(void (*)(Mutex*, const Condition&),
          PS_ABSL "5Mutex8LockWhenERKNS0_9ConditionE");
  const Guarded g{&c, this};
  // Built before the release below; a nested call (the library calling
  // itself) passes the condition through unchanged.
  const Condition gc_outer(&g);
  const Condition& gc = nest.outer() ? gc_outer : c;
  PS_ANNOTATE(__tsan_release(this));  // publishes gc to the unlocker
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, 0));
  real(this, gc);
  PS_ANNOTATE(__tsan_mutex_post_lock(this, 0, 0));
}
void Mutex::ReaderLockWhen(const Condition& c) {
  PS_REAL(void (*)(Mutex*, const Condition&),
          PS_ABSL "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  const Guarded g{&c, this};
  // Built before the release below; a nested call (the library calling
  // itself) passes the condition through unchanged.
  const Condition gc_outer(&g);
  const Condition& gc = nest.outer() ? gc_outer : c;
  PS_ANNOTATE(__tsan_release(this));  // publishes gc to the unlocker
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, kRead));
  real(this, gc);
  PS_ANNOTATE(__tsan_mutex_post_lock(this, kRead, 0));
}
bool Mutex::LockWhenWithTimeout(const Condition& c, Duration d) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Duration),
          PS_ABSL "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Guarded g{&c, this};
  // Built before the release below; a nested call (the library calling
  // itself) passes the condition through unchanged.
  const Condition gc_outer(&g);
  const Condition& gc = nest.outer() ? gc_outer : c;
  PS_ANNOTATE(__tsan_release(this));  // publishes gc to the unlocker
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, 0));
  const bool r = real(this, gc, d);
  PS_ANNOTATE(__tsan_mutex_post_lock(this, 0, 0));
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& c, Time t) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Time),
          PS_ABSL "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Guarded g{&c, this};
  // Built before the release below; a nested call (the library calling
  // itself) passes the condition through unchanged.
  const Condition gc_outer(&g);
  const Condition& gc = nest.outer() ? gc_outer : c;
  PS_ANNOTATE(__tsan_release(this));  // publishes gc to the unlocker
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, 0));
  const bool r = real(this, gc, t);
  PS_ANNOTATE(__tsan_mutex_post_lock(this, 0, 0));
  return r;
}
void Mutex::Await(const Condition& c) {
  PS_REAL(void (*)(Mutex*, const Condition&),
          PS_ABSL "5Mutex5AwaitERKNS0_9ConditionE");
  const Guarded g{&c, this};
  // Built before the release below; a nested call (the library calling
  // itself) passes the condition through unchanged.
  const Condition gc_outer(&g);
  const Condition& gc = nest.outer() ? gc_outer : c;
  PS_ANNOTATE(Released(this, 0));
  real(this, gc);
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, 0));
  PS_ANNOTATE(__tsan_mutex_post_lock(this, 0, 0));
}
bool Mutex::AwaitWithTimeout(const Condition& c, Duration d) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Duration),
          PS_ABSL "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Guarded g{&c, this};
  // Built before the release below; a nested call (the library calling
  // itself) passes the condition through unchanged.
  const Condition gc_outer(&g);
  const Condition& gc = nest.outer() ? gc_outer : c;
  PS_ANNOTATE(Released(this, 0));
  const bool r = real(this, gc, d);
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, 0));
  PS_ANNOTATE(__tsan_mutex_post_lock(this, 0, 0));
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& c, Time t) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Time),
          PS_ABSL "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Guarded g{&c, this};
  // Built before the release below; a nested call (the library calling
  // itself) passes the condition through unchanged.
  const Condition gc_outer(&g);
  const Condition& gc = nest.outer() ? gc_outer : c;
  PS_ANNOTATE(Released(this, 0));
  const bool r = real(this, gc, t);
  PS_ANNOTATE(__tsan_mutex_pre_lock(this, 0));
  PS_ANNOTATE(__tsan_mutex_post_lock(this, 0, 0));
  return r;
}

void CondVar::Wait(Mutex* mu) {
  PS_REAL(void (*)(CondVar*, Mutex*), PS_ABSL "7CondVar4WaitEPNS0_5MutexE");
  PS_ANNOTATE(Released(mu, 0));
  real(this, mu);
  PS_ANNOTATE(__tsan_mutex_pre_lock(mu, 0));
  PS_ANNOTATE(__tsan_mutex_post_lock(mu, 0, 0));
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration d) {
  PS_REAL(bool (*)(CondVar*, Mutex*, Duration),
          PS_ABSL "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  PS_ANNOTATE(Released(mu, 0));
  const bool r = real(this, mu, d);
  PS_ANNOTATE(__tsan_mutex_pre_lock(mu, 0));
  PS_ANNOTATE(__tsan_mutex_post_lock(mu, 0, 0));
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time t) {
  PS_REAL(bool (*)(CondVar*, Mutex*, Time),
          PS_ABSL "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  PS_ANNOTATE(Released(mu, 0));
  const bool r = real(this, mu, t);
  PS_ANNOTATE(__tsan_mutex_pre_lock(mu, 0));
  PS_ANNOTATE(__tsan_mutex_post_lock(mu, 0, 0));
  return r;
}

// Notification: Notify releases, every successful wait acquires. The
// inline HasBeenNotified() is an acquire load of notified_yet_, which
// follows the Mutex member (notification.h), so Notify also releases on
// that address.
void Notification::Notify() {
  PS_REAL(void (*)(Notification*), PS_ABSL "12Notification6NotifyEv");
  PS_ANNOTATE(__tsan_release(this));
  PS_ANNOTATE(__tsan_release(reinterpret_cast<char*>(this) + sizeof(Mutex)));
  real(this);
}
void Notification::WaitForNotification() const {
  PS_REAL(void (*)(const Notification*),
          "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  PS_ANNOTATE(__tsan_acquire(const_cast<Notification*>(this)));
}
bool Notification::WaitForNotificationWithTimeout(Duration d) const {
  PS_REAL(bool (*)(const Notification*, Duration),
          "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeout"
          "ENS0_8DurationE");
  const bool r = real(this, d);
  if (r) PS_ANNOTATE(__tsan_acquire(const_cast<Notification*>(this)));
  return r;
}
bool Notification::WaitForNotificationWithDeadline(Time t) const {
  PS_REAL(bool (*)(const Notification*, Time),
          "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadline"
          "ENS0_4TimeE");
  const bool r = real(this, t);
  if (r) PS_ANNOTATE(__tsan_acquire(const_cast<Notification*>(this)));
  return r;
}

bool BlockingCounter::DecrementCount() {
  PS_REAL(bool (*)(BlockingCounter*),
          PS_ABSL "15BlockingCounter14DecrementCountEv");
  PS_ANNOTATE(__tsan_release(this));
  return real(this);
}
void BlockingCounter::Wait() {
  PS_REAL(void (*)(BlockingCounter*), PS_ABSL "15BlockingCounter4WaitEv");
  real(this);
  PS_ANNOTATE(__tsan_acquire(this));
}

ABSL_NAMESPACE_END
}  // namespace absl
