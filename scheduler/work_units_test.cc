// WorkQueue and PlanWorkUnits alone: no scheduler, no clock.
#include "scheduler/work_units.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/data.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using absl::StatusCode;

proto::FinishedUnit Finished(int64_t id, int64_t examples) {
  proto::FinishedUnit f;
  f.set_id(id);
  f.set_examples(examples);
  return f;
}

// Takes units for `worker` from both queues until they run out: the same
// ids, in the same order.
void ExpectSameTakes(WorkQueue* a, WorkQueue* b, int worker) {
  for (;;) {
    std::optional<proto::WorkUnit> x = a->Take(worker), y = b->Take(worker);
    ASSERT_EQ(x.has_value(), y.has_value());
    if (!x.has_value()) return;
    EXPECT_EQ(x->id(), y->id());
  }
}

std::vector<proto::DataShard> Rows(int n) {
  std::vector<proto::DataShard> units(n);
  for (int i = 0; i < n; ++i) {
    units[i].set_row_begin(i * 10);
    units[i].set_row_end(i * 10 + 10);
  }
  return units;
}

TEST(WorkQueueTest, HandsOutInEpochOrderAndCountsPerEpoch) {
  WorkQueue q(Rows(3), 2, 1, /*steal=*/false);
  for (int64_t want = 0; want < 6; ++want) {
    std::optional<proto::WorkUnit> u = q.Take(0);
    ASSERT_TRUE(u.has_value());
    EXPECT_EQ(u->id(), want);
    EXPECT_EQ(u->epoch(), want / 3);
    EXPECT_EQ(u->data().row_begin(), (want % 3) * 10);
    ASSERT_TRUE(q.Finish(0, Finished(want, 10)).ok());
  }
  EXPECT_FALSE(q.Take(0).has_value());
  EXPECT_TRUE(q.AllDone());
  EXPECT_EQ(q.epoch_examples(), (std::vector<int64_t>{30, 30}));
  EXPECT_EQ(q.finished_by(0), 6);
}

// data.shuffle: each epoch's slots hold the plan's units in a seeded order,
// a permutation of the plan (every row once an epoch), the same for the
// same seed (BSP stays reproducible), another for another seed or epoch.
TEST(WorkQueueTest, StopAfterDropsTheLaterEpochsNotHandedOut) {
  // 3 units an epoch, 4 epochs, 2 workers; worker 0 holds unit 3 (epoch 1).
  WorkQueue q(Rows(3), 4, 2, /*steal=*/true);
  std::vector<int64_t> taken;
  for (int i = 0; i < 4; ++i) {
    std::optional<proto::WorkUnit> u = q.Take(i % 2);
    ASSERT_TRUE(u.has_value());
    taken.push_back(u->id());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(q.Finish(i % 2, Finished(taken[i], 10)).ok());
  }
  // Everything of epochs 1..3 not handed out: 12 - 3 (epoch 0) - 1 (held).
  EXPECT_EQ(q.StopAfter(1), 8);
  EXPECT_FALSE(q.AllDone());  // the unit in progress still counts
  EXPECT_FALSE(q.Take(0).has_value());
  EXPECT_FALSE(q.Take(1).has_value());
  ASSERT_TRUE(q.Finish(1, Finished(taken[3], 10)).ok());
  EXPECT_TRUE(q.AllDone());
  EXPECT_EQ(q.epoch_examples()[0], 30);
  EXPECT_EQ(q.epoch_examples()[1], 10);
  EXPECT_EQ(q.StopAfter(1), 0);  // again: nothing left to drop
}

TEST(WorkQueueTest, ProgressIsTheLowestEpochNotDone) {
  WorkQueue q(std::vector<proto::DataShard>(4), 3, 1, /*steal=*/false);
  JobProgress p = q.Progress();
  EXPECT_EQ(p.epoch, 0);
  EXPECT_EQ(p.epochs, 3);
  EXPECT_EQ(p.total, 12);
  for (int i = 0; i < 5; ++i) {
    std::optional<proto::WorkUnit> u = q.Take(0);
    ASSERT_TRUE(u.has_value());
    proto::FinishedUnit f;
    f.set_id(u->id());
    f.set_examples(1);
    ASSERT_TRUE(q.Finish(0, f).ok());
  }
  p = q.Progress();
  EXPECT_EQ(p.epoch, 1);
  EXPECT_EQ(p.epoch_done, 1);
  EXPECT_EQ(p.done, 5);
  EXPECT_EQ(q.done_in_epoch(0), 4);
  EXPECT_EQ(q.done_in_epoch(7), 0);
}

TEST(FormatProgressTest, EtasAtTheRate) {
  JobProgress p;
  p.epoch = 2;
  p.epochs = 20;
  p.epoch_done = 14;
  p.units_per_epoch = 34;
  p.done = 82;
  p.total = 680;
  EXPECT_EQ(FormatProgress(p, 10),
            "epoch 3/20 41% (14/34 units), job 12%, ETA epoch 2s, "
            "job 1m00s");
  EXPECT_EQ(FormatProgress(p, 0.1),
            "epoch 3/20 41% (14/34 units), job 12%, ETA epoch 3m20s, "
            "job 1h39m");
  EXPECT_EQ(FormatProgress(p, 0),
            "epoch 3/20 41% (14/34 units), job 12%, ETA unknown");
}

TEST(WorkQueueTest, ShuffleSeedPermutesEachEpochsUnits) {
  constexpr int kUnits = 40, kEpochs = 3, kWorkers = 4;
  // What each worker takes, in order, as the plan units' first rows.
  auto run = [](std::optional<uint64_t> seed) {
    WorkQueue q(Rows(kUnits), kEpochs, kWorkers, /*steal=*/false, seed);
    std::vector<std::vector<int64_t>> taken(kWorkers);
    for (bool any = true; any;) {
      any = false;
      for (int w = 0; w < kWorkers; ++w) {
        std::optional<proto::WorkUnit> u = q.Take(w);
        if (!u.has_value()) continue;
        any = true;
        taken[w].push_back(u->data().row_begin() / 10);
        EXPECT_EQ(q.PlanIndex(u->id()), u->data().row_begin() / 10);
        EXPECT_TRUE(q.Finish(w, Finished(u->id(), 10)).ok());
      }
    }
    EXPECT_TRUE(q.AllDone());
    return taken;
  };
  const auto plain = run(std::nullopt);
  const auto a = run(1);
  EXPECT_EQ(run(1), a);
  EXPECT_NE(run(2), a);
  EXPECT_NE(a, plain);
  // Without a seed, worker w reads its contiguous quarter of the plan in
  // order every epoch; with one, each epoch is a permutation of the plan.
  EXPECT_EQ(plain[1], (std::vector<int64_t>{10, 11, 12, 13, 14, 15, 16, 17,
                                            18, 19, 10, 11, 12, 13, 14, 15,
                                            16, 17, 18, 19, 10, 11, 12, 13,
                                            14, 15, 16, 17, 18, 19}));
  WorkQueue q(Rows(kUnits), kEpochs, kWorkers, /*steal=*/false, 1);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < kEpochs; ++e) {
    std::vector<int64_t> order;
    for (int i = 0; i < kUnits; ++i) order.push_back(q.PlanIndex(e * kUnits + i));
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < kUnits; ++i) ASSERT_EQ(sorted[i], i) << "epoch " << e;
    epochs.push_back(order);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  // A worker trains other parts of the data in different epochs.
  EXPECT_NE(std::vector<int64_t>(a[0].begin(), a[0].begin() + 10),
            std::vector<int64_t>(a[0].begin() + 10, a[0].begin() + 20));
}

// Scheduler restart (issue 9): a queue restored from a saved state hands
// out, loses and counts exactly as the original would have.
TEST(WorkQueueTest, SavedStateRestoresTheSameQueue) {
  WorkQueue a(Rows(4), 3, 2, /*steal=*/true);
  ASSERT_TRUE(a.Take(0).has_value());                  // assigned to W0
  std::optional<proto::WorkUnit> u = a.Take(1);        // W1 finishes it
  ASSERT_TRUE(u.has_value());
  ASSERT_TRUE(a.Finish(1, Finished(u->id(), 7)).ok());
  ASSERT_TRUE(a.Take(1).has_value());
  a.Release(1);                                        // W1 died
  proto::WorkQueueState st;
  a.SaveTo(&st);
  WorkQueue b(Rows(4), 3, 2, /*steal=*/true);
  ASSERT_TRUE(b.RestoreFrom(st).ok());
  EXPECT_EQ(b.epoch_examples(), a.epoch_examples());
  EXPECT_EQ(b.finished_by(1), 1);
  EXPECT_EQ(b.Lost(0, {}).size(), a.Lost(0, {}).size());
  ExpectSameTakes(&a, &b, 0);
  // A state that does not fit the plan is refused.
  WorkQueue c(Rows(5), 3, 2, /*steal=*/true);
  EXPECT_EQ(c.RestoreFrom(st).code(), StatusCode::kInvalidArgument);
  st.add_pool(1000);
  WorkQueue d(Rows(4), 3, 2, /*steal=*/true);
  EXPECT_EQ(d.RestoreFrom(st).code(), StatusCode::kInvalidArgument);
}

// The units are saved packed (one GetWork saves the whole state: one message
// per unit made that quadratic in the job); a state of an older build, one
// Unit message per unit, still restores, and arrays of unequal length are
// refused.
TEST(WorkQueueTest, PackedAndOlderUnitStatesRestoreAlike) {
  WorkQueue a(Rows(4), 3, 2, /*steal=*/true);
  ASSERT_TRUE(a.Finish(0, Finished(a.Take(0)->id(), 7)).ok());
  ASSERT_TRUE(a.Take(1).has_value());
  proto::WorkQueueState packed;
  a.SaveTo(&packed);
  EXPECT_EQ(packed.units_size(), 0);
  ASSERT_EQ(packed.unit_worker_size(), 12);
  proto::WorkQueueState old = packed;
  old.clear_unit_worker();
  old.clear_unit_done();
  for (int i = 0; i < packed.unit_worker_size(); ++i) {
    proto::WorkQueueState::Unit* u = old.add_units();
    u->set_worker(packed.unit_worker(i));
    u->set_done(packed.unit_done(i));
  }
  WorkQueue b(Rows(4), 3, 2, /*steal=*/true), c(Rows(4), 3, 2, true);
  ASSERT_TRUE(b.RestoreFrom(packed).ok());
  ASSERT_TRUE(c.RestoreFrom(old).ok());
  EXPECT_EQ(b.finished_by(0), 1);
  EXPECT_EQ(c.finished_by(0), 1);
  ExpectSameTakes(&b, &c, 1);
  WorkQueue r(Rows(4), 3, 2, /*steal=*/true);
  EXPECT_EQ(r.ResumeFrom(old).value_or(-1), 1);
  packed.mutable_unit_done()->RemoveLast();
  WorkQueue d(Rows(4), 3, 2, /*steal=*/true);
  EXPECT_EQ(d.RestoreFrom(packed).code(), StatusCode::kInvalidArgument);
}

// Issue 9: a worker joining takes an even share of every queue, BSP too,
// and the grown queue survives a scheduler restart.
TEST(WorkQueueTest, JoinedWorkerGetsAnEvenShareOfEachQueue) {
  WorkQueue q(Rows(6), 2, 2, /*steal=*/false);  // W0: 0-2, 6-8; W1: 3-5, 9-11
  EXPECT_EQ(q.Take(0)->id(), 0);  // in progress: stays with W0
  EXPECT_EQ(q.AddWorker(), 3);    // every third of W0's 5 and W1's 6 queued
  EXPECT_EQ(q.num_queues(), 3);
  std::vector<int64_t> got;
  while (std::optional<proto::WorkUnit> u = q.Take(2)) got.push_back(u->id());
  EXPECT_EQ(got, (std::vector<int64_t>{5, 6, 11}));  // of 1,2,6,7,8 and 3-5,9-11
  proto::WorkQueueState st;
  q.SaveTo(&st);
  WorkQueue r(Rows(6), 2, 2, /*steal=*/false);
  ASSERT_TRUE(r.RestoreFrom(st).ok());
  EXPECT_EQ(r.num_queues(), 3);
  int64_t left = 0;
  for (int w = 0; w < 3; ++w) {
    while (r.Take(w).has_value()) ++left;
  }
  EXPECT_EQ(left, 8);  // 12 units, less 1 taken by W0 and 3 by W2
}

TEST(WorkQueueTest, ResumeKeepsDoneUnitsAndRequeuesTheRest) {
  WorkQueue a(Rows(4), 2, 2, /*steal=*/true);
  ASSERT_TRUE(a.Finish(0, Finished(a.Take(0)->id(), 10)).ok());  // unit 0
  ASSERT_TRUE(a.Take(1).has_value());                            // unit 2
  proto::WorkQueueState st;
  a.SaveTo(&st);
  WorkQueue b(Rows(4), 2, 3, /*steal=*/false);
  absl::StatusOr<int64_t> done = b.ResumeFrom(st);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, 1);
  EXPECT_EQ(b.epoch_examples(), (std::vector<int64_t>{10, 0}));
  int64_t left = 0;
  for (int w = 0; w < 3; ++w) {
    while (std::optional<proto::WorkUnit> u = b.Take(w)) {
      EXPECT_NE(u->id(), 0);
      ++left;
    }
  }
  EXPECT_EQ(left, 7);
  WorkQueue c(Rows(4), 3, 2, /*steal=*/true);  // other epochs: refused
  EXPECT_EQ(c.ResumeFrom(st).status().code(), StatusCode::kInvalidArgument);
}

TEST(WorkQueueTest, PreferredWorkersGetContiguousBlocks) {
  EXPECT_EQ(PreferredWorker(0, 10, 3), 0);
  EXPECT_EQ(PreferredWorker(3, 10, 3), 0);
  EXPECT_EQ(PreferredWorker(4, 10, 3), 1);
  EXPECT_EQ(PreferredWorker(9, 10, 3), 2);
  EXPECT_EQ(PreferredWorker(0, 1, 4), 0);
}

// BSP: each worker reads only its own queue, so runs are reproducible.
TEST(WorkQueueTest, WithoutStealingEachWorkerKeepsItsQueue) {
  WorkQueue q(Rows(4), 1, 2, /*steal=*/false);
  EXPECT_EQ(q.Take(0)->id(), 0);
  EXPECT_EQ(q.Take(0)->id(), 1);
  EXPECT_FALSE(q.Take(0).has_value());
  EXPECT_EQ(q.Take(1)->id(), 2);
  EXPECT_EQ(q.Take(1)->id(), 3);
}

// SSP/ASP: a fast worker takes the last unit of the longest other queue.
TEST(WorkQueueTest, StealingTakesTheTailOfTheLongestQueue) {
  WorkQueue q(Rows(6), 1, 3, /*steal=*/true);  // {0,1} {2,3} {4,5}
  EXPECT_EQ(q.Take(0)->id(), 0);
  EXPECT_EQ(q.Take(0)->id(), 1);
  EXPECT_EQ(q.Take(2)->id(), 4);
  EXPECT_EQ(q.Take(0)->id(), 3);  // W[1]'s queue is the longest
  EXPECT_EQ(q.Take(0)->id(), 2);  // a tie: the lowest worker's
  EXPECT_EQ(q.Take(1)->id(), 5);  // its own queue is empty: steals too
  EXPECT_FALSE(q.Take(1).has_value());
}

TEST(WorkQueueTest, ReleasedUnitsGoFirstAndCountOnce) {
  WorkQueue q(Rows(4), 2, 2, /*steal=*/false);  // W0 {0,1,4,5} W1 {2,3,6,7}
  ASSERT_EQ(q.Take(0)->id(), 0);
  ASSERT_EQ(q.Take(1)->id(), 2);
  ASSERT_EQ(q.Take(1)->id(), 3);
  ASSERT_TRUE(q.Finish(1, Finished(2, 10)).ok());
  EXPECT_EQ(q.Release(1), 1);  // unit 3 (unit 2 is done), and {6, 7}
  EXPECT_EQ(q.Finish(1, Finished(3, 10)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(q.Take(0)->id(), 3);  // the pool first, even without stealing
  EXPECT_EQ(q.Take(0)->id(), 6);
  EXPECT_EQ(q.Take(0)->id(), 7);
  EXPECT_EQ(q.Take(0)->id(), 1);
  ASSERT_TRUE(q.Finish(0, Finished(3, 10)).ok());
  ASSERT_TRUE(q.Finish(0, Finished(3, 10)).ok());  // a resent report
  EXPECT_EQ(q.epoch_examples()[0], 20);
  EXPECT_FALSE(q.AllDone());
}

TEST(WorkQueueTest, LostHandOutsAreFoundFromWhatTheWorkerHolds) {
  WorkQueue q(Rows(4), 1, 1, /*steal=*/false);
  ASSERT_EQ(q.Take(0)->id(), 0);
  ASSERT_EQ(q.Take(0)->id(), 1);
  std::vector<proto::WorkUnit> lost = q.Lost(0, {0});
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].id(), 1);
  EXPECT_TRUE(q.Lost(0, {0, 1}).empty());
  EXPECT_TRUE(q.Lost(3, {}).empty());
}

TEST(WorkQueueTest, BadReportsAreRefused) {
  WorkQueue q(Rows(2), 1, 1, /*steal=*/false);
  ASSERT_TRUE(q.Take(0).has_value());
  EXPECT_EQ(q.Finish(0, Finished(2, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Finish(0, Finished(-1, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Finish(0, Finished(0, -1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Finish(1, Finished(0, 1)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(q.Finish(0, Finished(1, 1)).code(),
            StatusCode::kFailedPrecondition);  // never handed out
}

TEST(PlanWorkUnitsTest, SyntheticRowRanges) {
  JobConfig c;
  c.data.format = "synthetic";
  c.data.synthetic.train_rows = 1050;
  c.fault_tolerance.work_unit_rows = 100;
  c.cluster.num_workers = 3;
  std::vector<proto::DataShard> u = PlanWorkUnits(c);
  // 11 units of 100 rows rounded up to a multiple of the 3 workers: 12 of
  // 88 rows (the last 82), contiguous.
  ASSERT_EQ(u.size(), 12u);
  for (size_t i = 0; i < u.size(); ++i) {
    EXPECT_EQ(u[i].row_begin(), static_cast<int64_t>(i) * 88);
    EXPECT_EQ(u[i].part(), static_cast<int>(i));
    EXPECT_EQ(u[i].num_parts(), 12);
  }
  EXPECT_EQ(u[11].row_end(), 1050);
}

// The units of a file cover it exactly once, whatever the line lengths.
TEST(PlanWorkUnitsTest, FileUnitsCoverEveryLineOnce) {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) /
       absl::StrCat("work_units_test_", getpid(), ".libsvm"))
          .string();
  {
    std::ofstream out(path);
    for (int i = 0; i < 997; ++i) {
      out << (i % 2) << " " << (i % 13 + 1) << ":1";
      for (int j = 0; j < i % 7; ++j) out << " " << (20 + j) << ":0.5";
      out << "\n";
    }
  }
  JobConfig c;
  c.data.format = "libsvm";
  c.data.train = path;
  c.fault_tolerance.work_unit_rows = 50;
  // The estimate training.minibatch auto is sized from (issue 12): the
  // file's size over the average length of its first lines.
  const int64_t estimate = EstimateTrainRows(c);
  EXPECT_GE(estimate, 900);
  EXPECT_LE(estimate, 1100);
  JobConfig unseen = c;
  unseen.data.train = path + ".missing";
  EXPECT_EQ(EstimateTrainRows(unseen), -1);
  std::vector<proto::DataShard> units = PlanWorkUnits(c);
  EXPECT_GE(units.size(), 15u);
  EXPECT_LE(units.size(), 25u);
  int64_t rows = 0, expect_begin = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(units[i].begin_byte(), expect_begin);
    expect_begin = units[i].end_byte();
    EXPECT_EQ(units[i].end_byte() == -1, i + 1 == units.size());
    auto r = OpenLibsvm(path, units[i].begin_byte(), units[i].end_byte(),
                        false);
    ASSERT_TRUE(r.ok()) << r.status();
    RowBlock b;
    for (;;) {
      auto n = (*r)->Next(1000, &b);
      ASSERT_TRUE(n.ok());
      if (*n == 0) break;
    }
    rows += static_cast<int64_t>(b.rows());
  }
  EXPECT_EQ(rows, 997);
  std::filesystem::remove(path);
}

TEST(PlanWorkUnitsTest, FileTheSchedulerCannotSeeIsCutByTheWorkers) {
  JobConfig c;
  c.data.format = "libsvm";
  c.data.train = "/nonexistent/train.libsvm";
  c.cluster.num_workers = 3;
  std::vector<proto::DataShard> units = PlanWorkUnits(c);
  ASSERT_EQ(units.size(), 24u);
  EXPECT_EQ(units[5].begin_byte(), -1);
  EXPECT_EQ(units[5].part(), 5);
  EXPECT_EQ(units[5].num_parts(), 24);
}

}  // namespace
}  // namespace ps
