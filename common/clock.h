// Injectable time source. Production code takes a `Clock*`; tests pass a
// FakeClock and advance it by hand, so nothing in a unit test sleeps.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The real clock; lives forever.
  static Clock* Real();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1))
      : now_ns_(absl::ToUnixNanos(start)) {}
  absl::Time Now() const override { return absl::FromUnixNanos(now_ns_.load()); }
  void Advance(absl::Duration d) { now_ns_ += absl::ToInt64Nanoseconds(d); }

 private:
  std::atomic<int64_t> now_ns_;
};

}  // namespace ps
