// WorkSource with a fake scheduler and a KVWorker over fake servers that
// hold every push until the test answers it: a unit is reported finished
// only once its pushes are acknowledged (held until then, without waiting
// unless no unit was free), a unit read but not yet pushed is reported as
// held, and a lost GetWork reply is resent with the same report.
#include "worker/work_source.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/routing.h"
#include "data/data.h"
#include "gtest/gtest.h"
#include "transport/fake_transport.h"

namespace ps {
namespace {

proto::ClusterView OneServerView() {
  proto::ClusterView v;
  v.set_epoch(1);
  *v.mutable_routing() = BuildHashRing({0}, 4, 1);
  proto::NodeInfo* s = v.mutable_routing()->add_servers();
  s->set_id(0);
  s->set_role(proto::ROLE_SERVER);
  s->set_address("fake:server:0");
  s->set_state(proto::NODE_ALIVE);
  proto::NodeInfo* w = v.add_workers();
  w->set_id(0);
  w->set_role(proto::ROLE_WORKER);
  w->set_state(proto::NODE_ALIVE);
  v.mutable_consistency()->set_mode(proto::MODE_BSP);
  proto::TableConfig* t = v.add_tables();
  t->set_id(0);
  t->set_dim(1);
  return v;
}

proto::GetWorkResponse Unit(int64_t id, int64_t rows) {
  proto::GetWorkResponse r;
  r.set_state(proto::WORK_UNIT);
  r.mutable_unit()->set_id(id);
  r.mutable_unit()->mutable_data()->set_row_begin(id * 100);
  r.mutable_unit()->mutable_data()->set_row_end(id * 100 + rows);
  return r;
}

proto::GetWorkResponse State(proto::WorkState s) {
  proto::GetWorkResponse r;
  r.set_state(s);
  return r;
}

class WorkSourceTest : public ::testing::Test {
 protected:
  WorkSourceTest() {
    KVWorkerOptions o;
    o.clock = &clock_;
    kv_ = std::make_unique<KVWorker>(o, OneServerView(), &clients_,
                                     clients_.scheduler());
    clients_.scheduler()->set_get_work_handler(
        [this](const proto::GetWorkRequest& req)
            -> absl::StatusOr<proto::GetWorkResponse> {
          absl::MutexLock l(&mu_);
          requests_.push_back(req);
          acked_when_asked_.push_back(acked_.load());
          if (answers_.empty()) return State(proto::WORK_DONE);
          auto a = answers_.front();
          answers_.erase(answers_.begin());
          return a;
        });
    work_ = std::make_unique<WorkSource>(
        WorkSourceOptions(), clients_.scheduler(), kv_.get(),
        [](const proto::WorkUnit& u) {
          const proto::DataShard& d = u.data();
          SyntheticConfig c;
          c.features = 100;
          c.nnz_per_row = 3;
          return OpenSynthetic(c, d.row_begin(), d.row_end(), false);
        });
  }
  void Answer(std::vector<absl::StatusOr<proto::GetWorkResponse>> a) {
    absl::MutexLock l(&mu_);
    answers_ = std::move(a);
  }
  // Pushes one key for the rows just read and ends the clock.
  int64_t PushAndClock(int64_t unit, int rows) {
    const std::vector<uint64_t> keys = {1};
    const std::vector<float> vals = {0.5f};
    kv_->Push(0, keys, vals, rows);
    const int64_t ts = kv_->Clock(rows);
    work_->Pushed(unit, ts);
    return ts;
  }

  FakeClock clock_;
  FakeClientFactory clients_;
  std::unique_ptr<KVWorker> kv_;
  std::unique_ptr<WorkSource> work_;
  std::atomic<bool> acked_{false};
  absl::Mutex mu_;
  std::vector<absl::StatusOr<proto::GetWorkResponse>> answers_
      ABSL_GUARDED_BY(mu_);
  std::vector<proto::GetWorkRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> acked_when_asked_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkSourceTest, UnitReportedOnlyAfterItsPushesAreAcknowledged) {
  Answer({Unit(0, 3), State(proto::WORK_WAIT), State(proto::WORK_DONE)});
  RowBlock b;
  int64_t unit = -1;
  auto got = work_->Next(10, &b, &unit);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, WorkSource::Got::kRows);
  EXPECT_EQ(unit, 0);
  EXPECT_EQ(b.rows(), 3u);
  const int64_t ts = PushAndClock(0, 3);
  // The next call finds the unit exhausted and its push not acknowledged:
  // it asks for the next unit at once, holding this one.
  got = work_->Next(10, &b, &unit);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, WorkSource::Got::kWait);
  EXPECT_FALSE(kv_->Done(ts));
  {
    absl::MutexLock l(&mu_);
    ASSERT_EQ(requests_.size(), 2u);
    EXPECT_EQ(requests_[1].finished_size(), 0);
    ASSERT_EQ(requests_[1].holding_size(), 1);
    EXPECT_EQ(requests_[1].holding(0), 0);
  }
  // No unit was free: the next ask waits for the push and reports it.
  absl::StatusOr<WorkSource::Got> next;
  std::thread t([&] {
    RowBlock b2;
    int64_t u2;
    next = work_->Next(10, &b2, &u2);
  });
  FakeServerClient* server = clients_.server("fake:server:0");
  std::optional<HeldPush> push;
  while (!(push = server->NextPush()).has_value()) std::this_thread::yield();
  acked_ = true;
  push->Reply(absl::OkStatus());
  std::optional<HeldClock> clock;
  while (!(clock = server->NextClock()).has_value()) std::this_thread::yield();
  clock->Reply(absl::OkStatus());
  t.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, WorkSource::Got::kDone);
  absl::MutexLock l(&mu_);
  ASSERT_EQ(requests_.size(), 3u);
  EXPECT_TRUE(acked_when_asked_[2]);
  ASSERT_EQ(requests_[2].finished_size(), 1);
  EXPECT_EQ(requests_[2].finished(0).id(), 0);
  EXPECT_EQ(requests_[2].finished(0).examples(), 3);
  EXPECT_EQ(requests_[2].holding_size(), 0);
}

// A unit whose pushes were acknowledged by the time of the next ask is
// reported then, without waiting; one whose pushes were not is reported by
// the ask after its acknowledgement, while the worker reads the next unit.
TEST_F(WorkSourceTest, AcknowledgedUnitIsReportedByTheNextAskWithoutWaiting) {
  Answer({Unit(0, 2), Unit(1, 2), Unit(2, 2), State(proto::WORK_DONE)});
  FakeServerClient* server = clients_.server("fake:server:0");
  RowBlock b;
  int64_t unit = -1;
  ASSERT_EQ(*work_->Next(10, &b, &unit), WorkSource::Got::kRows);
  PushAndClock(0, 2);
  // Unit 0's push not answered yet: unit 1 comes, unit 0 is held.
  ASSERT_EQ(*work_->Next(10, &b, &unit), WorkSource::Got::kRows);
  EXPECT_EQ(unit, 1);
  PushAndClock(1, 2);
  // Both acknowledged now (the fake answers in order).
  for (int i = 0; i < 2; ++i) {
    server->NextPush()->Reply(absl::OkStatus());
    server->NextClock()->Reply(absl::OkStatus());
  }
  ASSERT_EQ(*work_->Next(10, &b, &unit), WorkSource::Got::kRows);
  EXPECT_EQ(unit, 2);
  absl::MutexLock l(&mu_);
  ASSERT_EQ(requests_.size(), 3u);
  EXPECT_EQ(requests_[1].finished_size(), 0);
  ASSERT_EQ(requests_[1].holding_size(), 1);
  EXPECT_EQ(requests_[1].holding(0), 0);
  ASSERT_EQ(requests_[2].finished_size(), 2);
  EXPECT_EQ(requests_[2].finished(0).id(), 0);
  EXPECT_EQ(requests_[2].finished(1).id(), 1);
  EXPECT_EQ(requests_[2].holding_size(), 0);
}

TEST_F(WorkSourceTest, UnitReadButNotPushedIsHeldNotFinished) {
  Answer({Unit(4, 2), State(proto::WORK_WAIT)});
  RowBlock b;
  int64_t unit = -1;
  ASSERT_EQ(*work_->Next(10, &b, &unit), WorkSource::Got::kRows);
  // Read ahead before the batch was pushed: the unit is exhausted.
  ASSERT_EQ(*work_->Next(10, &b, &unit), WorkSource::Got::kWait);
  absl::MutexLock l(&mu_);
  ASSERT_EQ(requests_.size(), 2u);
  EXPECT_EQ(requests_[1].finished_size(), 0);
  ASSERT_EQ(requests_[1].holding_size(), 1);
  EXPECT_EQ(requests_[1].holding(0), 4);
}

TEST_F(WorkSourceTest, LostReplyIsResentWithTheSameReport) {
  Answer({Unit(1, 2), absl::UnavailableError("reply lost"),
          State(proto::WORK_DONE)});
  RowBlock b;
  int64_t unit = -1;
  ASSERT_EQ(*work_->Next(10, &b, &unit), WorkSource::Got::kRows);
  const int64_t ts = PushAndClock(1, 2);
  FakeServerClient* server = clients_.server("fake:server:0");
  server->NextPush()->Reply(absl::OkStatus());
  server->NextClock()->Reply(absl::OkStatus());
  ASSERT_TRUE(kv_->Wait(ts, absl::Now()).ok());
  auto got = work_->Next(10, &b, &unit);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, WorkSource::Got::kDone);
  absl::MutexLock l(&mu_);
  ASSERT_EQ(requests_.size(), 3u);
  for (int i : {1, 2}) {
    ASSERT_EQ(requests_[i].finished_size(), 1) << i;
    EXPECT_EQ(requests_[i].finished(0).id(), 1);
    EXPECT_EQ(requests_[i].finished(0).examples(), 2);
  }
}

TEST_F(WorkSourceTest, FinalSchedulerErrorIsReturned) {
  Answer({absl::FailedPreconditionError("W[0] was declared dead")});
  RowBlock b;
  int64_t unit = -1;
  EXPECT_EQ(work_->Next(10, &b, &unit).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ps
