#include "common/clock.h"

#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(FakeClock, TimersRunInDueOrderWhenAdvanced) {
  FakeClock clock;
  std::vector<int> ran;
  clock.RunAfter(absl::Seconds(2), [&] { ran.push_back(2); });
  clock.RunAfter(absl::Seconds(1), [&] { ran.push_back(1); });
  clock.RunAfter(absl::Seconds(1), [&] { ran.push_back(11); });
  clock.Advance(absl::Milliseconds(999));
  EXPECT_TRUE(ran.empty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(ran, (std::vector<int>{1, 11}));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(ran, (std::vector<int>{1, 11, 2}));
  EXPECT_EQ(clock.pending_timers(), 0u);
}

TEST(FakeClock, CallbackSeesItsDueTimeAndMaySchedule) {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  std::vector<absl::Duration> at;
  clock.RunAfter(absl::Seconds(1), [&] {
    at.push_back(clock.Now() - t0);
    clock.RunAfter(absl::Seconds(1), [&] { at.push_back(clock.Now() - t0); });
  });
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(at, (std::vector<absl::Duration>{absl::Seconds(1),
                                              absl::Seconds(2)}));
  EXPECT_EQ(clock.Now() - t0, absl::Seconds(10));
}

TEST(FakeClock, CancelledTimerNeverRuns) {
  FakeClock clock;
  bool ran = false;
  Clock::TimerId id = clock.RunAfter(absl::Seconds(1), [&] { ran = true; });
  EXPECT_TRUE(clock.Cancel(id));
  EXPECT_FALSE(clock.Cancel(id));
  clock.Advance(absl::Seconds(2));
  EXPECT_FALSE(ran);
}

TEST(FakeClock, AutoAdvancingSleepRunsDueTimers) {
  FakeClock clock;
  bool ran = false;
  clock.RunAfter(absl::Seconds(3), [&] { ran = true; });
  const absl::Time t0 = clock.Now();
  clock.SleepFor(absl::Seconds(5));
  EXPECT_TRUE(ran);
  EXPECT_EQ(clock.Now() - t0, absl::Seconds(5));
}

TEST(RealClock, RunsTimerOnItsOwnThread) {
  Clock* clock = Clock::Real();
  std::mutex mu;
  std::condition_variable cv;
  bool ran = false;
  clock->RunAfter(absl::Milliseconds(5), [&] {
    std::lock_guard<std::mutex> l(mu);
    ran = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> l(mu);
  EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(10), [&] { return ran; }));
}

TEST(IntervalPerId, SaysYesOncePerIntervalPerId) {
  IntervalPerId due;
  const absl::Time t0 = absl::UnixEpoch();
  const absl::Duration every = absl::Seconds(2);
  EXPECT_TRUE(due.Due(1, t0, every));
  EXPECT_TRUE(due.Due(2, t0, every));  // ids are independent
  EXPECT_FALSE(due.Due(1, t0 + absl::Seconds(1), every));
  EXPECT_TRUE(due.Due(1, t0 + absl::Seconds(2), every));
  EXPECT_FALSE(due.Due(1, t0 + absl::Seconds(3), every));  // restarted at 2
  EXPECT_TRUE(due.Due(1, t0 + absl::Seconds(4), every));
}

}  // namespace
}  // namespace ps
