// The stacks of every thread of this process, for a process that is alive
// but stops answering (issue 9: a live server whose heartbeats stopped for
// seconds under load was failed over, and nothing in its log said why).
//
// DumpThreads() signals each thread in turn (tgkill with kDumpSignal); the
// handler records the thread's return addresses with backtrace(), and the
// calling thread symbolizes them. A thread that does not answer within
// `per_thread` is reported as such, with its state and kernel wait channel
// from /proc: a thread that cannot be run (the process starved of CPU, or
// stopped) is a finding too.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace ps {

// Installs the handler of the dump signal (SIGRTMIN + 5) and loads the
// unwinder, so that the handler allocates nothing. Idempotent and
// thread-safe; DumpThreads calls it too. `argv0` (may be null) helps the
// symbolizer find the executable.
void InstallThreadDump(const char* argv0 = nullptr);

// One block per thread of this process: "thread TID NAME (state S, waits
// in WCHAN)", then one line per frame ("  #N 0xPC FUNCTION"). The calling
// thread is listed without frames. One dump at a time (a second caller
// waits); takes up to `per_thread` for each thread that does not answer.
std::string DumpThreads(absl::Duration per_thread = absl::Milliseconds(200));

// Watches a loop that should never stay long in one step (a server's
// heartbeat loop): while it has been in the same step for longer than that
// step's limit, `report` gets a line saying which step and for how long,
// followed by DumpThreads(): once per stall, at most once per
// `min_interval`. When the watch itself was not run for longer than the
// step's limit (the whole process was not: stopped, or starved of CPU),
// `report` gets one line saying so and naming the step, without stacks
// (they would show the gap's end), at most once per `min_interval`; a step
// counts as stuck only for the time the process ran after such a gap.
class StallWatch {
 public:
  struct Step {
    const char* what;        // "filling a heartbeat", ...
    absl::Duration limit;    // how long it may take
  };
  StallWatch(absl::Duration check_every, absl::Duration min_interval,
             std::function<void(const std::string&)> report);
  ~StallWatch();  // stops and joins its thread
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // The loop enters `step` now (`step` must outlive the next Enter).
  void Enter(const Step* step);

 private:
  void Run();

  const absl::Duration every_, min_interval_;
  const std::function<void(const std::string&)> report_;
  std::atomic<const Step*> step_{nullptr};
  std::atomic<int64_t> since_ns_{0};
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace ps
