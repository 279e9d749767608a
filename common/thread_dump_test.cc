#include "common/thread_dump.h"

#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

extern char** environ;

namespace ps {
namespace {

// ThreadSanitizer holds an asynchronous signal back until the thread runs
// code it intercepts, so a thread blocked in a futex never records its
// stack there: the dump says "no answer" for it.
#if defined(__SANITIZE_THREAD__)
constexpr bool kSignalsDeferred = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kSignalsDeferred = true;
#else
constexpr bool kSignalsDeferred = false;
#endif
#else
constexpr bool kSignalsDeferred = false;
#endif
#define SKIP_IF_SIGNALS_DEFERRED()                                         \
  if (kSignalsDeferred) {                                                  \
    GTEST_SKIP() << "ThreadSanitizer defers signals to blocked threads";   \
  }

// Blocks on `mu` (held by the test) until it is released: the frame the
// dump must show.
[[gnu::noinline]] void WaitsForTheLockInThisFunction(absl::Mutex* mu,
                                                     absl::Notification* in) {
  in->Notify();
  absl::MutexLock l(mu);
  asm volatile("" ::: "memory");  // not a tail call: this frame stays
}

TEST(ThreadDumpTest, ShowsWhereEachThreadWaits) {
  SKIP_IF_SIGNALS_DEFERRED();
  absl::Mutex mu;
  mu.Lock();
  absl::Notification in;
  std::thread blocked([&] { WaitsForTheLockInThisFunction(&mu, &in); });
  in.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));  // into the lock's wait
  const std::string dump = DumpThreads();
  mu.Unlock();
  blocked.join();
  EXPECT_TRUE(absl::StrContains(dump, "WaitsForTheLockInThisFunction"))
      << dump;
  EXPECT_TRUE(absl::StrContains(dump, ": this dump")) << dump;
  // Every thread answered (none blocks the signal here).
  EXPECT_FALSE(absl::StrContains(dump, "no answer")) << dump;
}

TEST(ThreadDumpTest, ThreadThatBlocksTheSignalIsNamedNotWaitedFor) {
  SKIP_IF_SIGNALS_DEFERRED();
  absl::Notification ready, done;
  std::thread deaf([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    ready.Notify();
    done.WaitForNotification();
  });
  ready.WaitForNotification();
  const absl::Time t0 = absl::Now();
  const std::string dump = DumpThreads(absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - t0;
  done.Notify();
  deaf.join();
  EXPECT_TRUE(absl::StrContains(dump, "no answer in 100ms")) << dump;
  EXPECT_LT(took, absl::Seconds(5));
  // The next dump is not confused by the late answer (the blocked signal
  // was delivered once the thread exited or unblocked it: never, here).
  const std::string again = DumpThreads();
  EXPECT_FALSE(absl::StrContains(again, "no answer")) << again;
}

// A loop stuck in one step past its limit is reported once, with the
// stacks; a step within its limit, and the same stall again, are not.
TEST(StallWatchTest, ReportsAStuckStepOnceWithTheStacks) {
  SKIP_IF_SIGNALS_DEFERRED();
  absl::Mutex mu;
  std::vector<std::string> reports;
  {
    StallWatch watch(absl::Milliseconds(20), absl::ZeroDuration(),
                     [&](const std::string& r) {
                       absl::MutexLock l(&mu);
                       reports.push_back(r);
                     });
    const StallWatch::Step quick{"quick step", absl::Milliseconds(300)};
    const StallWatch::Step stuck{"stuck step", absl::Milliseconds(300)};
    for (int i = 0; i < 10; ++i) {
      watch.Enter(&quick);
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::Mutex held;
    held.Lock();
    absl::Notification in;
    std::thread blocked([&] { WaitsForTheLockInThisFunction(&held, &in); });
    in.WaitForNotification();
    watch.Enter(&stuck);
    absl::SleepFor(absl::Milliseconds(1200));  // 4 limits: one report
    held.Unlock();
    blocked.join();
    watch.Enter(nullptr);
  }
  ASSERT_EQ(reports.size(), 1u) << absl::StrJoin(reports, "\n----\n");
  EXPECT_TRUE(absl::StartsWith(reports[0], "stuck step for ")) << reports[0];
  EXPECT_TRUE(absl::StrContains(reports[0], "WaitsForTheLockInThisFunction"))
      << reports[0];
}

// A process that was not run (stopped by SIGSTOP for a second, as a VM
// pause or a debugger would) is reported once as such, naming the step its
// loop was in and without stacks, whichever step that was; the step is not
// then reported as stuck for the time the process was stopped (issue 9: a
// server stopped during its heartbeat's call blamed the scheduler).
TEST(StallWatchTest, StoppedProcessIsReportedOnceWithoutStacks) {
  absl::Mutex mu;
  std::vector<std::string> reports;
  {
    StallWatch watch(absl::Milliseconds(20), absl::ZeroDuration(),
                     [&](const std::string& r) {
                       absl::MutexLock l(&mu);
                       reports.push_back(r);
                     });
    const StallWatch::Step calling{"the call step", absl::Milliseconds(300)};
    watch.Enter(&calling);
    absl::SleepFor(absl::Milliseconds(100));
    // A shell stops this process, waits a second and continues it.
    const std::string script = absl::StrCat(
        "kill -STOP ", ::getpid(), "; sleep 1; kill -CONT ", ::getpid());
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
    pid_t child = 0;
    ASSERT_EQ(posix_spawn(&child, "/bin/sh", nullptr, nullptr,
                          const_cast<char* const*>(argv), environ),
              0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    // Still in the same step, for less than its limit since it ran again.
    absl::SleepFor(absl::Milliseconds(150));
    watch.Enter(nullptr);
  }
  ASSERT_EQ(reports.size(), 1u) << absl::StrJoin(reports, "\n----\n");
  EXPECT_TRUE(absl::StartsWith(reports[0], "the stall watch woke "))
      << reports[0];
  EXPECT_TRUE(absl::StrContains(reports[0], "this process was not run"))
      << reports[0];
  EXPECT_TRUE(absl::EndsWith(reports[0], "the call step")) << reports[0];
  EXPECT_FALSE(absl::StrContains(reports[0], "thread ")) << reports[0];
}

}  // namespace
}  // namespace ps
