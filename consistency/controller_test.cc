#include "consistency/controller.h"

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "transport/errors.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(5);

// Records the status a WaitPull callback was run with.
struct Result {
  bool fired = false;
  absl::Status status;
  std::function<void(absl::Status)> Callback() {
    return [this](absl::Status s) {
      EXPECT_FALSE(fired) << "callback ran twice";
      fired = true;
      status = std::move(s);
    };
  }
};

TEST(ControllerTest, BspWaitsForEveryoneAndAdvanceReleases) {
  FakeClock clock;
  ConsistencyController c(2, 4, /*tau=*/0, &clock);
  EXPECT_EQ(c.num_workers(), 2);
  EXPECT_EQ(c.num_ranges(), 4);
  // Clock 0: nobody has completed anything yet; every entry is 0 >= 0.
  EXPECT_TRUE(c.CanServe(0, {}));
  c.AdvanceClock(0, 0, {});  // worker 0 completed clock 0
  EXPECT_EQ(c.Entry(2, 0), 1);
  EXPECT_FALSE(c.CanServe(1, {}));

  Result r;
  EXPECT_FALSE(c.WaitPull(0, 1, {1, 2}, clock.Now() + kTimeout, r.Callback()));
  EXPECT_FALSE(r.fired);
  EXPECT_EQ(c.pending_waits(), 1u);

  c.AdvanceClock(1, 0, {0});  // not a range the pull touches
  EXPECT_FALSE(r.fired);
  c.AdvanceClock(1, 0, {1, 2});
  ASSERT_TRUE(r.fired);
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(c.pending_waits(), 0u);
  EXPECT_EQ(c.MinClockPerWorker(), (std::vector<int64_t>{1, 0}));
}

// Issue 9: a worker joining at the others' clock holds nobody back until
// it lags; its own pulls wait like anyone's.
TEST(ControllerTest, JoinedWorkerStartsAtItsEntries) {
  FakeClock clock;
  ConsistencyController c(1, 2, /*tau=*/1, &clock);
  for (int k = 0; k < 3; ++k) c.AdvanceClock(0, k, {});  // entry 3
  EXPECT_EQ(c.AddWorker({3, 3}), 1);
  EXPECT_EQ(c.num_workers(), 2);
  EXPECT_TRUE(c.IsLive(1));
  EXPECT_EQ(c.Entry(1, 1), 3);
  EXPECT_TRUE(c.CanServe(4, {}));  // 3 >= 4 - 1
  EXPECT_FALSE(c.CanServe(5, {}));
  Result r;
  EXPECT_FALSE(c.WaitPull(1, 5, {0}, clock.Now() + kTimeout, r.Callback()));
  c.AdvanceClock(0, 3, {0});
  EXPECT_FALSE(r.fired);  // the joiner itself is at 3
  c.AdvanceClock(1, 3, {0});
  ASSERT_TRUE(r.fired);
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(c.MinClockPerWorker(), (std::vector<int64_t>{3, 3}));
  c.SetWorkerDead(1);
  EXPECT_TRUE(c.IsDead(1));
}

TEST(ControllerTest, AsyncNeverWaits) {
  FakeClock clock;
  ConsistencyController c(3, 2, kInfiniteTau, &clock);
  Result r;
  EXPECT_TRUE(c.WaitPull(1, 1000000, {}, clock.Now(), r.Callback()));
  ASSERT_TRUE(r.fired);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(c.pending_waits(), 0u);
}

TEST(ControllerTest, InvalidIdsFailAtOnce) {
  FakeClock clock;
  ConsistencyController c(2, 4, 1, &clock);
  Result bad_range, bad_worker, negative_range;
  EXPECT_TRUE(c.WaitPull(0, 0, {4}, clock.Now() + kTimeout,
                         bad_range.Callback()));
  EXPECT_TRUE(c.WaitPull(2, 0, {}, clock.Now() + kTimeout,
                         bad_worker.Callback()));
  EXPECT_TRUE(c.WaitPull(0, 0, {-1}, clock.Now() + kTimeout,
                         negative_range.Callback()));
  for (Result* r : {&bad_range, &bad_worker, &negative_range}) {
    ASSERT_TRUE(r->fired);
    EXPECT_EQ(r->status.code(), absl::StatusCode::kInvalidArgument)
        << r->status;
  }
  EXPECT_NE(bad_range.status.message().find("range 4"), std::string::npos);
  EXPECT_EQ(c.pending_waits(), 0u);
  EXPECT_FALSE(c.CanServe(0, {7}));
}

TEST(ControllerTest, DeadlineNamesTheLaggingWorker) {
  FakeClock clock;
  ConsistencyController c(3, 16, /*tau=*/2, &clock);
  c.AdvanceClock(0, 2, {});  // worker 0 completed clocks 0..2: entry 3
  c.AdvanceClock(1, 6, {});  // entry 7
  c.AdvanceClock(2, 6, {});
  Result r;
  EXPECT_FALSE(c.WaitPull(1, 7, {12}, clock.Now() + absl::Seconds(5),
                          r.Callback()));
  clock.Advance(absl::Seconds(4));
  EXPECT_EQ(c.ExpireWaits(), 0);
  EXPECT_FALSE(r.fired);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(c.ExpireWaits(), 1);
  ASSERT_TRUE(r.fired);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.status.message(),
            "pull by worker 1 at clock 7 (tau 2) waited 5s: "
            "worker 0 at clock 3 on range 12");
  EXPECT_EQ(c.pending_waits(), 0u);
  // An expired wait is gone: a later advance does not run it again.
  c.AdvanceClock(0, 10, {});
  EXPECT_EQ(c.ExpireWaits(), 0);
}

TEST(ControllerTest, ExpireLeavesUnexpiredWaits) {
  FakeClock clock;
  ConsistencyController c(2, 1, 0, &clock);
  c.AdvanceClock(0, 0, {});
  Result early, late;
  c.WaitPull(0, 1, {}, clock.Now() + absl::Seconds(1), early.Callback());
  c.WaitPull(0, 1, {}, clock.Now() + absl::Seconds(10), late.Callback());
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(c.ExpireWaits(), 1);
  EXPECT_TRUE(early.fired);
  EXPECT_FALSE(late.fired);
  c.AdvanceClock(1, 0, {});
  ASSERT_TRUE(late.fired);
  EXPECT_TRUE(late.status.ok());
}

TEST(ControllerTest, SetTauReleasesWaits) {
  FakeClock clock;
  ConsistencyController c(2, 2, /*tau=*/0, &clock);
  c.AdvanceClock(0, 2, {});  // worker 0 at 3, worker 1 at 0
  Result r;
  EXPECT_FALSE(c.WaitPull(0, 3, {}, clock.Now() + kTimeout, r.Callback()));
  c.SetTau(2);
  EXPECT_FALSE(r.fired);  // needs worker 1 >= 1
  c.SetTau(3);
  ASSERT_TRUE(r.fired);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(c.tau(), 3);

  Result r2;
  EXPECT_FALSE(c.WaitPull(0, 10, {}, clock.Now() + kTimeout, r2.Callback()));
  c.SetTau(kInfiniteTau);
  ASSERT_TRUE(r2.fired);
  EXPECT_TRUE(r2.status.ok());
}

TEST(ControllerTest, FinishedAndDeadWorkersDoNotBlock) {
  FakeClock clock;
  ConsistencyController c(3, 2, /*tau=*/1, &clock);
  c.AdvanceClock(0, 4, {});  // 0 at 5; 1 and 2 at 0
  Result r;
  EXPECT_FALSE(c.WaitPull(0, 5, {0}, clock.Now() + kTimeout, r.Callback()));
  c.SetWorkerFinished(1);
  EXPECT_FALSE(r.fired);  // worker 2 still lags
  EXPECT_FALSE(c.IsLive(1));
  EXPECT_TRUE(c.IsFinished(1));
  EXPECT_FALSE(c.IsDead(1));
  c.SetWorkerDead(2);
  ASSERT_TRUE(r.fired);
  EXPECT_TRUE(r.status.ok());
  EXPECT_FALSE(c.IsLive(2));
  EXPECT_TRUE(c.IsDead(2));
  EXPECT_FALSE(c.IsFinished(2));
  EXPECT_TRUE(c.IsLive(0));
  EXPECT_FALSE(c.IsLive(3));  // out of range
  // With nobody live at all, everything is servable.
  c.SetWorkerFinished(0);
  EXPECT_TRUE(c.CanServe(1000, {}));
}

// The SSP catch-up's watch: released once every other live worker has
// completed `others_at` clocks on the watched ranges, whatever the watcher's
// own entry and tau; its deadline answers OK; a watcher that stops training
// is released at once.
TEST(ControllerTest, WaitOthersFiresWhenTheOthersGetAhead) {
  FakeClock clock;
  ConsistencyController c(3, 2, /*tau=*/8, &clock);
  // Worker 0 (the watcher) completed nothing; the others 3 on range 0.
  c.AdvanceClock(1, 2, {0});
  c.AdvanceClock(2, 2, {0});
  EXPECT_EQ(c.OthersMin(0, {0}), 3);
  EXPECT_EQ(c.OthersMin(0, {}), 0);  // range 1: nobody completed anything
  EXPECT_EQ(c.OthersMin(0, {5}), -1);
  Result now;
  EXPECT_TRUE(c.WaitOthers(0, 3, {0}, clock.Now() + kTimeout, now.Callback()));
  ASSERT_TRUE(now.fired);
  EXPECT_TRUE(now.status.ok());

  Result r;
  EXPECT_FALSE(c.WaitOthers(0, 5, {0}, clock.Now() + kTimeout, r.Callback()));
  c.AdvanceClock(1, 4, {0});  // worker 1 at 5, worker 2 still at 3
  EXPECT_FALSE(r.fired);
  c.AdvanceClock(0, 9, {0});  // the watcher's own entry does not count
  EXPECT_FALSE(r.fired);
  c.AdvanceClock(2, 4, {1});  // another range
  EXPECT_FALSE(r.fired);
  c.AdvanceClock(2, 4, {0});
  ASSERT_TRUE(r.fired);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(c.pending_waits(), 0u);

  // The deadline is an answer, not a failure.
  Result expired;
  EXPECT_FALSE(c.WaitOthers(0, 100, {0}, clock.Now() + absl::Seconds(1),
                            expired.Callback()));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(c.ExpireWaits(), 1);
  ASSERT_TRUE(expired.fired);
  EXPECT_TRUE(expired.status.ok());

  // A dead other stops counting; the watcher finishing releases it.
  Result dead, finished;
  EXPECT_FALSE(
      c.WaitOthers(1, 6, {0}, clock.Now() + kTimeout, dead.Callback()));
  c.SetWorkerDead(2);  // left: worker 0 at 10
  ASSERT_TRUE(dead.fired);
  EXPECT_FALSE(
      c.WaitOthers(1, 50, {0}, clock.Now() + kTimeout, finished.Callback()));
  c.SetWorkerFinished(1);
  ASSERT_TRUE(finished.fired);
  EXPECT_TRUE(finished.status.ok());

  // The last worker training has nobody to watch: only its deadline
  // answers (released at once, it would ask again and again).
  Result alone;
  EXPECT_FALSE(c.WaitOthers(0, 1, {0}, clock.Now() + absl::Seconds(1),
                            alone.Callback()));
  EXPECT_EQ(c.OthersMin(0, {0}), -1);
  c.AdvanceClock(0, 20, {0});
  EXPECT_FALSE(alone.fired);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(c.ExpireWaits(), 1);
  ASSERT_TRUE(alone.fired);
  EXPECT_TRUE(alone.status.ok());
}

TEST(ControllerTest, CancelAllRunsEveryWait) {
  FakeClock clock;
  ConsistencyController c(2, 2, 0, &clock);
  c.AdvanceClock(0, 0, {});
  Result a, b, ok_replaced;
  c.WaitPull(0, 1, {}, clock.Now() + kTimeout, a.Callback());
  c.WaitPull(0, 1, {1}, clock.Now() + kTimeout, b.Callback());
  EXPECT_EQ(c.pending_waits(), 2u);
  c.CancelAll(absl::UnavailableError("shutting down"));
  EXPECT_EQ(c.pending_waits(), 0u);
  for (Result* r : {&a, &b}) {
    ASSERT_TRUE(r->fired);
    EXPECT_EQ(r->status.code(), absl::StatusCode::kUnavailable);
  }
  c.WaitPull(0, 1, {}, clock.Now() + kTimeout, ok_replaced.Callback());
  c.CancelAll(absl::OkStatus());
  ASSERT_TRUE(ok_replaced.fired);
  EXPECT_EQ(ok_replaced.status.code(), absl::StatusCode::kCancelled);
}

// Every callback path calls back into the controller; with the lock held any
// of these would deadlock (absl::Mutex is not reentrant).
TEST(ControllerTest, CallbacksRunWithoutTheLock) {
  FakeClock clock;
  ConsistencyController c(2, 2, 0, &clock);
  int calls = 0;
  auto reenter = [&](absl::Status) {
    ++calls;
    (void)c.pending_waits();
    (void)c.Entry(0, 0);
    (void)c.CanServe(0, {});
    c.AdvanceClock(1, -1, {});  // no-op advance: takes the lock again
    Result nested;
    c.WaitPull(1, 0, {}, clock.Now() + kTimeout, nested.Callback());
    EXPECT_TRUE(nested.fired);
  };
  c.WaitPull(0, 0, {}, clock.Now() + kTimeout, reenter);  // immediate
  c.AdvanceClock(0, 0, {});
  c.WaitPull(0, 1, {}, clock.Now() + kTimeout, reenter);  // via advance
  c.AdvanceClock(1, 0, {});
  c.AdvanceClock(0, 1, {});
  c.WaitPull(0, 2, {}, clock.Now() + kTimeout, reenter);  // via SetTau
  c.SetTau(1);
  c.WaitPull(0, 5, {}, clock.Now() + kTimeout, reenter);  // via expiry
  clock.Advance(kTimeout);
  EXPECT_EQ(c.ExpireWaits(), 1);
  c.WaitPull(0, 5, {}, clock.Now() + kTimeout, reenter);  // via finish
  c.SetWorkerFinished(1);
  c.SetWorkerFinished(0);
  c.SetTau(0);
  c.WaitPull(0, 50, {}, clock.Now() + kTimeout, reenter);  // nobody live
  EXPECT_EQ(calls, 6);
  // A callback that queues a new wait while CancelAll runs keeps it queued.
  ConsistencyController d(1, 1, 0, &clock);
  d.WaitPull(0, 1, {}, clock.Now() + kTimeout, [&](absl::Status) {
    d.WaitPull(0, 1, {}, clock.Now() + kTimeout, [](absl::Status) {});
  });
  d.CancelAll(absl::CancelledError("stop"));
  EXPECT_EQ(d.pending_waits(), 1u);
  d.CancelAll(absl::CancelledError("stop"));
  EXPECT_EQ(d.pending_waits(), 0u);
}

// The property the spec requires: with an injected clock and a deliberately
// slow worker, a pull at clock c is never answered while a live worker is
// below c - tau. Worker 0 completes one clock every `kSlowEvery` steps; the
// others each complete at most one clock per step, as fast as allowed. Each
// iteration is: pull (wait), compute, advance clock on all ranges. Worker 3
// dies half way through.
class StalenessSimulationTest
    : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(StalenessSimulationTest, PullNeverSeesAWorkerBeyondTheBound) {
  const int64_t tau = std::get<0>(GetParam());
  const int slow_every = std::get<1>(GetParam());
  constexpr int kWorkers = 4;
  constexpr int kRanges = 8;
  constexpr int kSteps = 200;
  constexpr int kDeathStep = 100;
  FakeClock clock;
  ConsistencyController c(kWorkers, kRanges, tau, &clock);
  std::mt19937_64 rng(42);

  enum class State { kIdle, kWaiting, kReady };
  struct Worker {
    int64_t clock = 0;  // completed clocks
    State state = State::kIdle;
  };
  std::vector<Worker> workers(kWorkers);
  int issued = 0, queued = 0, answered = 0, violations = 0;

  auto issue_pull = [&](int w) {
    std::vector<int> ranges;
    for (int r = 0; r < kRanges; ++r) {
      if (rng() % 2) ranges.push_back(r);
    }  // sometimes empty: all ranges
    const int64_t at = workers[w].clock;
    workers[w].state = State::kWaiting;
    ++issued;
    const bool now = c.WaitPull(
        w, at, ranges, clock.Now() + absl::Hours(1),
        [&, w, at, ranges](absl::Status s) {
          ASSERT_TRUE(s.ok()) << s;
          ++answered;
          // Runs without the lock, so it may read the controller.
          for (int x = 0; x < kWorkers; ++x) {
            if (!c.IsLive(x) || tau == kInfiniteTau) continue;
            auto check = [&](int r) {
              if (c.Entry(r, x) < at - tau) {
                ++violations;
                ADD_FAILURE() << "pull by worker " << w << " at clock " << at
                              << " answered while worker " << x
                              << " is at " << c.Entry(r, x) << " on range "
                              << r;
              }
            };
            if (ranges.empty()) {
              for (int r = 0; r < kRanges; ++r) check(r);
            } else {
              for (int r : ranges) check(r);
            }
          }
          workers[w].state = State::kReady;
        });
    if (!now) ++queued;
    if (tau == kInfiniteTau) {
      EXPECT_TRUE(now) << "ASP must never wait";
    }
  };

  for (int step = 0; step < kSteps; ++step) {
    clock.Advance(absl::Milliseconds(10));
    if (step == kDeathStep) c.SetWorkerDead(3);
    for (int w = 0; w < kWorkers; ++w) {
      if (w == 3 && step >= kDeathStep) continue;
      if (w == 0 && step % slow_every != 0) continue;
      Worker& me = workers[w];
      if (me.state == State::kReady) {  // computed; push and advance
        c.AdvanceClock(w, me.clock, {});
        ++me.clock;
        me.state = State::kIdle;
      }
      if (me.state == State::kIdle) issue_pull(w);
    }
    // The bound holds between steps too: nobody completed more than
    // tau + 1 clocks beyond the slow worker.
    if (tau != kInfiniteTau) {
      for (int w = 1; w < kWorkers; ++w) {
        if (w == 3 && step >= kDeathStep) continue;
        EXPECT_LE(workers[w].clock, workers[0].clock + tau + 1)
            << "worker " << w << " at step " << step;
      }
    }
    EXPECT_EQ(c.ExpireWaits(), 0);  // deadlines are an hour away
  }
  EXPECT_EQ(violations, 0);

  const int64_t slow = workers[0].clock;
  EXPECT_GE(slow, kSteps / slow_every - 2);
  for (int w = 1; w < 3; ++w) {
    if (tau == kInfiniteTau) {
      // ASP: fast workers are never held back by the slow one.
      EXPECT_GE(workers[w].clock, kSteps - 2);
      EXPECT_EQ(queued, 0);
    } else {
      // Fast workers are not starved: they run right up to the bound.
      EXPECT_GE(workers[w].clock, slow + tau) << "worker " << w;
    }
  }
  if (tau != kInfiniteTau) {
    EXPECT_GT(queued, 0);
  }

  // Waits eventually fire: once the slow worker is done, nobody is blocked.
  c.SetWorkerFinished(0);
  EXPECT_EQ(c.pending_waits(), 0u);
  for (int w = 1; w < 3; ++w) {
    EXPECT_EQ(workers[w].state, State::kReady) << "worker " << w;
  }
  // Every pull was answered exactly once (the callback checks "once").
  EXPECT_EQ(answered, issued);
}

INSTANTIATE_TEST_SUITE_P(
    Taus, StalenessSimulationTest,
    ::testing::Combine(::testing::Values<int64_t>(0, 1, 4, kInfiniteTau),
                       ::testing::Values(3, 7)),
    [](const auto& info) {
      const int64_t tau = std::get<0>(info.param);
      return std::string(tau == kInfiniteTau ? "inf"
                                             : "tau" + std::to_string(tau)) +
             "_slow" + std::to_string(std::get<1>(info.param));
    });

// Issue 8: waits are bounded per worker; every way a wait ends (served,
// expired, cancelled) frees its slot.
TEST(ControllerTest, PendingWaitsPerWorkerAreBounded) {
  FakeClock clock;
  ConsistencyController c(2, 1, /*tau=*/0, &clock,
                          /*max_pending_per_worker=*/2);
  std::vector<Result> r(8);
  EXPECT_FALSE(c.WaitPull(0, 1, {}, clock.Now() + kTimeout, r[0].Callback()));
  EXPECT_FALSE(c.WaitPull(0, 1, {}, clock.Now() + kTimeout, r[1].Callback()));
  EXPECT_TRUE(c.WaitPull(0, 1, {}, clock.Now() + kTimeout, r[2].Callback()));
  ASSERT_TRUE(r[2].fired);
  EXPECT_EQ(r[2].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(r[2].status), proto::REASON_TOO_MANY_PENDING);
  // Worker 1 has its own allowance.
  EXPECT_FALSE(c.WaitPull(1, 1, {}, clock.Now() + kTimeout, r[3].Callback()));
  // Served: both of worker 0's slots free again.
  c.AdvanceClock(0, 0, {});
  c.AdvanceClock(1, 0, {});
  EXPECT_TRUE(r[0].fired && r[1].fired && r[3].fired);
  EXPECT_FALSE(
      c.WaitPull(0, 2, {}, clock.Now() + absl::Seconds(1), r[4].Callback()));
  EXPECT_FALSE(c.WaitPull(0, 2, {}, clock.Now() + kTimeout, r[5].Callback()));
  // Expired: one slot frees.
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(c.ExpireWaits(), 1);
  EXPECT_FALSE(c.WaitPull(0, 2, {}, clock.Now() + kTimeout, r[6].Callback()));
  // Cancelled: all free.
  c.CancelAll(absl::CancelledError("x"));
  EXPECT_FALSE(c.WaitPull(0, 2, {}, clock.Now() + kTimeout, r[7].Callback()));
  c.CancelAll(absl::CancelledError("end"));
}

}  // namespace
}  // namespace ps
