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

#define PS_REAL(type, mangled) \
  static const auto real = reinterpret_cast<type>(Real(mangled))
#define PS_ABSL "_ZN4absl7debian3"

void PreLock(void* m, unsigned flags) { __tsan_mutex_pre_lock(m, flags); }
void PostLock(void* m, unsigned flags) { __tsan_mutex_post_lock(m, flags, 0); }
void Released(void* m, unsigned flags) {
  __tsan_mutex_pre_unlock(m, flags);
  __tsan_mutex_post_unlock(m, flags);
}
constexpr unsigned kRead = __tsan_mutex_read_lock;

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// Thread-safety analysis would flag these definitions; they are the lock
// functions themselves.
#pragma clang diagnostic ignored "-Wthread-safety-analysis"

Mutex::~Mutex() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5MutexD2Ev");
  __tsan_mutex_destroy(this, 0);
  real(this);
}
void Mutex::Lock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex4LockEv");
  PreLock(this, 0);
  real(this);
  PostLock(this, 0);
}
void Mutex::ReaderLock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex10ReaderLockEv");
  PreLock(this, kRead);
  real(this);
  PostLock(this, kRead);
}
bool Mutex::TryLock() {
  PS_REAL(bool (*)(Mutex*), PS_ABSL "5Mutex7TryLockEv");
  PreLock(this, __tsan_mutex_try_lock);
  const bool ok = real(this);
  __tsan_mutex_post_lock(
      this, __tsan_mutex_try_lock | (ok ? 0 : __tsan_mutex_try_lock_failed), 0);
  return ok;
}
bool Mutex::ReaderTryLock() {
  PS_REAL(bool (*)(Mutex*), PS_ABSL "5Mutex13ReaderTryLockEv");
  PreLock(this, kRead | __tsan_mutex_try_lock);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this,
                         kRead | __tsan_mutex_try_lock |
                             (ok ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return ok;
}
void Mutex::Unlock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex6UnlockEv");
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}
void Mutex::ReaderUnlock() {
  PS_REAL(void (*)(Mutex*), PS_ABSL "5Mutex12ReaderUnlockEv");
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}
void Mutex::LockWhen(const Condition& c) {
  PS_REAL(void (*)(Mutex*, const Condition&),
          PS_ABSL "5Mutex8LockWhenERKNS0_9ConditionE");
  PreLock(this, 0);
  real(this, c);
  PostLock(this, 0);
}
void Mutex::ReaderLockWhen(const Condition& c) {
  PS_REAL(void (*)(Mutex*, const Condition&),
          PS_ABSL "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  PreLock(this, kRead);
  real(this, c);
  PostLock(this, kRead);
}
bool Mutex::LockWhenWithTimeout(const Condition& c, Duration d) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Duration),
          PS_ABSL "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  PreLock(this, 0);
  const bool r = real(this, c, d);
  PostLock(this, 0);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& c, Time t) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Time),
          PS_ABSL "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  PreLock(this, 0);
  const bool r = real(this, c, t);
  PostLock(this, 0);
  return r;
}
void Mutex::Await(const Condition& c) {
  PS_REAL(void (*)(Mutex*, const Condition&),
          PS_ABSL "5Mutex5AwaitERKNS0_9ConditionE");
  Released(this, 0);
  real(this, c);
  PreLock(this, 0);
  PostLock(this, 0);
}
bool Mutex::AwaitWithTimeout(const Condition& c, Duration d) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Duration),
          PS_ABSL "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Released(this, 0);
  const bool r = real(this, c, d);
  PreLock(this, 0);
  PostLock(this, 0);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& c, Time t) {
  PS_REAL(bool (*)(Mutex*, const Condition&, Time),
          PS_ABSL "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Released(this, 0);
  const bool r = real(this, c, t);
  PreLock(this, 0);
  PostLock(this, 0);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  PS_REAL(void (*)(CondVar*, Mutex*), PS_ABSL "7CondVar4WaitEPNS0_5MutexE");
  Released(mu, 0);
  real(this, mu);
  PreLock(mu, 0);
  PostLock(mu, 0);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration d) {
  PS_REAL(bool (*)(CondVar*, Mutex*, Duration),
          PS_ABSL "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Released(mu, 0);
  const bool r = real(this, mu, d);
  PreLock(mu, 0);
  PostLock(mu, 0);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time t) {
  PS_REAL(bool (*)(CondVar*, Mutex*, Time),
          PS_ABSL "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Released(mu, 0);
  const bool r = real(this, mu, t);
  PreLock(mu, 0);
  PostLock(mu, 0);
  return r;
}

// Notification: Notify releases, every successful wait acquires. The
// inline HasBeenNotified() is an acquire load of notified_yet_, which
// follows the Mutex member (notification.h), so Notify also releases on
// that address.
void Notification::Notify() {
  PS_REAL(void (*)(Notification*), PS_ABSL "12Notification6NotifyEv");
  __tsan_release(this);
  __tsan_release(reinterpret_cast<char*>(this) + sizeof(Mutex));
  real(this);
}
void Notification::WaitForNotification() const {
  PS_REAL(void (*)(const Notification*),
          PS_ABSL "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}
bool Notification::WaitForNotificationWithTimeout(Duration d) const {
  PS_REAL(bool (*)(const Notification*, Duration),
          "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeout"
          "ENS0_8DurationE");
  const bool r = real(this, d);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}
bool Notification::WaitForNotificationWithDeadline(Time t) const {
  PS_REAL(bool (*)(const Notification*, Time),
          "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadline"
          "ENS0_4TimeE");
  const bool r = real(this, t);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool BlockingCounter::DecrementCount() {
  PS_REAL(bool (*)(BlockingCounter*),
          PS_ABSL "15BlockingCounter14DecrementCountEv");
  __tsan_release(this);
  return real(this);
}
void BlockingCounter::Wait() {
  PS_REAL(void (*)(BlockingCounter*), PS_ABSL "15BlockingCounter4WaitEv");
  real(this);
  __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl
