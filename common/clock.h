// Injectable time: the current time, timers and sleeping behind one object.
// Production code takes a `Clock*` (Clock::Real()); tests pass a FakeClock
// and move time by hand, so nothing in a unit test sleeps and every timer
// fires in a known order.
//
// Everything that waits on time in the logic (retry backoff in KVWorker,
// heartbeat and start-up deadlines and control-call retries in
// SchedulerCore, delays in the fault injector) goes through the same Clock,
// never through absl::Now()/absl::SleepFor directly.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {

class Clock {
 public:
  using TimerId = uint64_t;

  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // Runs `fn` once, at or after `when`, on a thread owned by the clock (the
  // real clock's timer thread; for a FakeClock, the thread that advances
  // it), never on the caller's thread before RunAt returns. Callbacks due at
  // the same time run in the order they were scheduled. `fn` must not block
  // for long: it delays every later timer. Thread-safe.
  virtual TimerId RunAt(absl::Time when, std::function<void()> fn) = 0;
  TimerId RunAfter(absl::Duration d, std::function<void()> fn) {
    return RunAt(Now() + d, std::move(fn));
  }
  // Cancels a timer that has not started running. True when it was
  // cancelled (its callback will never run); false when it already ran,
  // is running, or never existed.
  virtual bool Cancel(TimerId id) = 0;

  // Blocks the calling thread until Now() >= when.
  virtual void SleepUntil(absl::Time when) = 0;
  void SleepFor(absl::Duration d) { SleepUntil(Now() + d); }

  // The real clock; lives forever. Its timer thread starts on first use.
  static Clock* Real();

 protected:
  // Pending timers by (due time in unix ns, id); ids grow, so timers due at
  // the same time keep the order they were scheduled in.
  using TimerQueue =
      std::map<std::pair<int64_t, TimerId>, std::function<void()>>;
  // Removes timer `id` from `q`; false when it is not there.
  static bool EraseTimer(TimerQueue* q, TimerId id);
};

// A clock that moves only when told to. Thread-safe.
//
// Advance(d) and AdvanceTo(t) move time forward step by step, running every
// timer that falls due, in time order, on the advancing thread (without any
// internal lock held, so callbacks may schedule or cancel timers; a timer a
// callback schedules within the advanced window also runs).
//
// SleepUntil: with auto_advance (the default) the sleeper moves the clock
// itself to `when` (running due timers), so synchronous retry loops run at
// full speed in tests; without it the sleeper blocks until another thread
// advances the clock far enough.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1),
                     bool auto_advance = true);
  ~FakeClock() override;

  absl::Time Now() const override;
  TimerId RunAt(absl::Time when, std::function<void()> fn) override;
  bool Cancel(TimerId id) override;
  void SleepUntil(absl::Time when) override;

  void Advance(absl::Duration d) { AdvanceTo(Now() + d); }
  void AdvanceTo(absl::Time t);
  // Runs the timers already due at Now() (e.g. ones scheduled for "now").
  void RunDue() { AdvanceTo(Now()); }
  // Timers scheduled and neither run nor cancelled.
  size_t pending_timers() const;
  // When the earliest pending timer is due; InfiniteFuture when none.
  absl::Time next_timer() const;

 private:
  const bool auto_advance_;
  mutable std::mutex mu_;
  std::condition_variable moved_;
  int64_t now_ns_;  // guarded by mu_
  TimerId next_id_ = 1;
  TimerQueue timers_;
};

// Per id (a server), whether `every` has passed since Due last said yes for
// it (the first time: yes); a yes starts the next interval. Rate-limits
// naming the same suspect (issue 9). Not thread-safe: its owner guards it.
class IntervalPerId {
 public:
  bool Due(int id, absl::Time now, absl::Duration every) {
    auto [it, first] = last_.try_emplace(id, now);
    if (!first) {
      if (now - it->second < every) return false;
      it->second = now;
    }
    return true;
  }

 private:
  absl::flat_hash_map<int, absl::Time> last_;
};

}  // namespace ps
