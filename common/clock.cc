#include "common/clock.h"

#include <thread>
#include <vector>

namespace ps {
namespace {

// The real clock: one lazily started timer thread running callbacks in due
// order. It lives for the whole process (never destroyed), like
// Clock::Real() itself.
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }

  TimerId RunAt(absl::Time when, std::function<void()> fn) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { Loop(); }).detach();
    }
    const TimerId id = next_id_++;
    timers_.emplace(std::make_pair(absl::ToUnixNanos(when), id),
                    std::move(fn));
    cv_.notify_one();
    return id;
  }

  bool Cancel(TimerId id) override {
    std::lock_guard<std::mutex> l(mu_);
    return EraseTimer(&timers_, id);
  }

  void SleepUntil(absl::Time when) override {
    const absl::Duration d = when - absl::Now();
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      if (timers_.empty()) {
        cv_.wait(l);
        continue;
      }
      const int64_t due = timers_.begin()->first.first;
      const int64_t now = absl::ToUnixNanos(absl::Now());
      if (due > now) {
        cv_.wait_for(l, std::chrono::nanoseconds(due - now));
        continue;
      }
      std::function<void()> fn = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
      l.unlock();
      fn();
      l.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  TimerId next_id_ = 1;
  TimerQueue timers_;
};

}  // namespace

bool Clock::EraseTimer(TimerQueue* q, TimerId id) {
  for (auto it = q->begin(); it != q->end(); ++it) {
    if (it->first.second == id) {
      q->erase(it);
      return true;
    }
  }
  return false;
}

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start, bool auto_advance)
    : auto_advance_(auto_advance), now_ns_(absl::ToUnixNanos(start)) {}

FakeClock::~FakeClock() = default;

absl::Time FakeClock::Now() const {
  std::lock_guard<std::mutex> l(mu_);
  return absl::FromUnixNanos(now_ns_);
}

Clock::TimerId FakeClock::RunAt(absl::Time when, std::function<void()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  const TimerId id = next_id_++;
  timers_.emplace(std::make_pair(absl::ToUnixNanos(when), id), std::move(fn));
  return id;
}

bool FakeClock::Cancel(TimerId id) {
  std::lock_guard<std::mutex> l(mu_);
  return EraseTimer(&timers_, id);
}

void FakeClock::AdvanceTo(absl::Time t) {
  const int64_t target = absl::ToUnixNanos(t);
  for (;;) {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!timers_.empty() && timers_.begin()->first.first <= target) {
        auto it = timers_.begin();
        if (it->first.first > now_ns_) now_ns_ = it->first.first;
        fn = std::move(it->second);
        timers_.erase(it);
      } else {
        if (target > now_ns_) now_ns_ = target;
        moved_.notify_all();
        return;
      }
      moved_.notify_all();
    }
    fn();
  }
}

void FakeClock::SleepUntil(absl::Time when) {
  if (auto_advance_) {
    AdvanceTo(when);
    return;
  }
  const int64_t target = absl::ToUnixNanos(when);
  std::unique_lock<std::mutex> l(mu_);
  moved_.wait(l, [&] { return now_ns_ >= target; });
}

size_t FakeClock::pending_timers() const {
  std::lock_guard<std::mutex> l(mu_);
  return timers_.size();
}

absl::Time FakeClock::next_timer() const {
  std::lock_guard<std::mutex> l(mu_);
  if (timers_.empty()) return absl::InfiniteFuture();
  return absl::FromUnixNanos(timers_.begin()->first.first);
}

}  // namespace ps
