#include "common/thread_dump.h"

#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

namespace ps {
namespace {

constexpr int kMaxFrames = 48;

// The one thread being dumped. `target` is the thread asked (0: none); its
// handler claims the request by setting it to -tid, so that an answer that
// arrives after the dumper gave up on it cannot land in the next thread's
// request.
struct Request {
  std::atomic<pid_t> target{0};
  std::atomic<int> depth{-1};  // frames recorded; -1 until then
  void* frames[kMaxFrames];
};
Request g_request;

int DumpSignal() { return SIGRTMIN + 5; }

pid_t ThisThread() { return static_cast<pid_t>(syscall(SYS_gettid)); }

void OnDumpSignal(int, siginfo_t*, void*) {
  const int saved_errno = errno;
  pid_t expected = ThisThread();
  if (g_request.target.compare_exchange_strong(expected, -expected)) {
    // backtrace() was called once at install time: its unwinder is loaded,
    // and it allocates nothing from here on.
    const int n = backtrace(g_request.frames, kMaxFrames);
    g_request.depth.store(n, std::memory_order_release);
  }
  errno = saved_errno;
}

std::string ReadTrimmed(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)),
                std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The state letter of /proc/self/task/TID/stat (after the name's ')').
std::string TaskState(pid_t tid) {
  const std::string stat =
      ReadTrimmed(absl::StrCat("/proc/self/task/", tid, "/stat"));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return "?";
  return stat.substr(close + 2, 1);
}

std::vector<pid_t> Threads() {
  std::vector<pid_t> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long tid = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && tid > 0) {
      tids.push_back(static_cast<pid_t>(tid));
    }
  }
  closedir(dir);
  return tids;
}

std::string Frame(int i, void* pc) {
  // A return address points after its call: look up the call itself.
  const void* at = i == 0 ? pc : static_cast<char*>(pc) - 1;
  char name[512];
  if (!absl::Symbolize(at, name, sizeof(name))) {
    std::snprintf(name, sizeof(name), "?");
  }
  return absl::StrFormat("  #%d %p %s\n", i, pc, name);
}

}  // namespace

void InstallThreadDump(const char* argv0) {
  static absl::once_flag once;
  absl::call_once(once, [argv0] {
    absl::InitializeSymbolizer(argv0 != nullptr ? argv0 : "/proc/self/exe");
    void* warm[2];
    (void)backtrace(warm, 2);  // loads libgcc_s's unwinder now
    struct sigaction sa = {};
    sa.sa_sigaction = OnDumpSignal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(DumpSignal(), &sa, nullptr);
  });
}

StallWatch::StallWatch(absl::Duration check_every, absl::Duration min_interval,
                       std::function<void(const std::string&)> report)
    : every_(check_every),
      min_interval_(min_interval),
      report_(std::move(report)),
      thread_([this] { Run(); }) {}

StallWatch::~StallWatch() {
  stop_.Notify();
  thread_.join();
}

void StallWatch::Enter(const Step* step) {
  since_ns_.store(MonotonicNanos(), std::memory_order_relaxed);
  step_.store(step, std::memory_order_release);
}

void StallWatch::Run() {
  int64_t reported = -1;  // the since_ns_ of the stall reported
  int64_t last_report = std::numeric_limits<int64_t>::min() / 2;
  int64_t last_gap_report = last_report;
  int64_t run_again = 0;  // when the process last ran again after a gap
  int64_t last = MonotonicNanos();
  while (!stop_.WaitForNotificationWithTimeout(every_)) {
    const Step* step = step_.load(std::memory_order_acquire);
    const int64_t since = since_ns_.load(std::memory_order_relaxed);
    const int64_t now = MonotonicNanos();
    const absl::Duration slept = absl::Nanoseconds(now - last);
    last = now;
    if (step == nullptr) continue;
    if (slept > step->limit) {
      // The whole process was not run: said here, whichever step the loop
      // was in (its own measure of a late step would blame that step, as
      // "the scheduler took 4 s to answer" for a process stopped during
      // the call), without stacks, which would show the gap's end.
      run_again = now;
      if (absl::Nanoseconds(now - last_gap_report) >= min_interval_) {
        last_gap_report = now;
        report_(absl::StrCat(
            "the stall watch woke ", absl::FormatDuration(slept - every_),
            " late: this process was not run meanwhile (a stopped process, "
            "or an overloaded machine); the loop was in its step: ",
            step->what));
      }
      continue;
    }
    // Stuck only for the time the process ran.
    const absl::Duration stuck =
        absl::Nanoseconds(now - std::max(since, run_again));
    if (stuck <= step->limit || since == reported ||
        absl::Nanoseconds(now - last_report) < min_interval_) {
      continue;
    }
    reported = since;
    last_report = now;
    report_(absl::StrCat(step->what, " for ", absl::FormatDuration(stuck),
                         ": the threads of this process follow\n",
                         DumpThreads()));
  }
}

std::string DumpThreads(absl::Duration per_thread) {
  InstallThreadDump();
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock l(&mu);
  const pid_t self = ThisThread();
  const pid_t pid = getpid();
  std::string out;
  for (pid_t tid : Threads()) {
    const std::string task = absl::StrCat("/proc/self/task/", tid);
    absl::StrAppend(&out, "thread ", tid, " ", ReadTrimmed(task + "/comm"),
                    " (state ", TaskState(tid), ", waits in ",
                    ReadTrimmed(task + "/wchan"), ")");
    if (tid == self) {
      absl::StrAppend(&out, ": this dump\n");
      continue;
    }
    g_request.depth.store(-1, std::memory_order_relaxed);
    g_request.target.store(tid, std::memory_order_release);
    if (syscall(SYS_tgkill, pid, tid, DumpSignal()) != 0) {
      g_request.target.store(0);
      absl::StrAppend(&out, ": gone\n");
      continue;
    }
    const absl::Time until = absl::Now() + per_thread;
    int depth = -1;
    while ((depth = g_request.depth.load(std::memory_order_acquire)) < 0 &&
           absl::Now() < until) {
      absl::SleepFor(absl::Microseconds(200));
    }
    if (depth < 0) {
      pid_t asked = tid;
      if (g_request.target.compare_exchange_strong(asked, 0)) {
        absl::StrAppend(&out, ": no answer in ",
                        absl::FormatDuration(per_thread),
                        " (not run meanwhile, or the signal is blocked)\n");
        continue;
      }
      // Its handler claimed the request just now: it is recording.
      while ((depth = g_request.depth.load(std::memory_order_acquire)) < 0) {
        absl::SleepFor(absl::Microseconds(100));
      }
    }
    g_request.target.store(0);
    absl::StrAppend(&out, "\n");
    // Frame 0 is the handler itself.
    for (int i = 1; i < depth; ++i) {
      absl::StrAppend(&out, Frame(i, g_request.frames[i]));
    }
  }
  return out;
}

}  // namespace ps
