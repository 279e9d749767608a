// The server process's catch-up with a view it missed (CatchUpView), against
// a fake scheduler client whose GetView reply the test sets.
#include "server/server_runner.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/routing.h"
#include "gtest/gtest.h"
#include "server/server_node.h"
#include "transport/errors.h"

namespace ps {
namespace {

using absl::StatusCode;

proto::ClusterView MakeView(int64_t epoch, int64_t tau) {
  proto::ClusterView v;
  v.set_epoch(epoch);
  *v.mutable_routing() = BuildHashRing({0}, 8, epoch);
  proto::NodeInfo* s = v.mutable_routing()->add_servers();
  s->set_id(0);
  s->set_role(proto::ROLE_SERVER);
  s->set_address("fake:server:0");
  s->set_state(proto::NODE_ALIVE);
  proto::NodeInfo* w = v.add_workers();
  w->set_id(0);
  w->set_role(proto::ROLE_WORKER);
  w->set_state(proto::NODE_ALIVE);
  v.mutable_consistency()->set_mode(proto::MODE_SSP);
  v.mutable_consistency()->set_tau(tau);
  proto::TableConfig* t = v.add_tables();
  t->set_id(0);
  t->set_dim(1);
  t->mutable_optimizer()->set_name("sgd");
  t->mutable_optimizer()->set_learning_rate(1.0f);
  return v;
}

// Answers GetView with `view` (ready) or `error`; records the requests.
class FakeScheduler : public SchedulerClient {
 public:
  proto::ClusterView view;
  absl::Status error;
  std::vector<proto::GetViewRequest> asked;

  absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time) override {
    asked.push_back(req);
    if (!error.ok()) return error;
    proto::GetViewResponse r;
    r.set_ready(true);
    *r.mutable_view() = view;
    return r;
  }
  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest&, absl::Time) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest&, absl::Time) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest&, absl::Time) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status Barrier(const proto::BarrierRequest&, absl::Time) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status WorkerDone(const proto::WorkerDoneRequest&, absl::Time) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status ServerDone(const proto::ServerDoneRequest&, absl::Time) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest&, absl::Time) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<proto::StatusResponse> Status(const proto::StatusRequest&,
                                               absl::Time) override {
    return absl::UnimplementedError("fake");
  }
};

absl::Status PushAt(ServerNode* node, int64_t epoch, uint64_t seq) {
  proto::PushRequest r;
  r.set_worker_id(0);
  r.set_seq(seq);
  r.set_epoch(epoch);
  PackTo<uint64_t>(r.mutable_keys(), std::vector<uint64_t>{1});
  PackTo<float>(r.mutable_vals(), std::vector<float>{1});
  r.set_num_examples(1);
  proto::PushResponse resp;
  absl::Status out = absl::InternalError("no answer");
  node->Push(r, &resp, [&](const absl::Status& s) { out = s; });
  return out;
}

class CatchUpViewTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(node_.Configure(0, MakeView(1, 2)).ok()); }
  FakeClock clock_;
  ServerNode node_{&clock_};
  FakeScheduler scheduler_;
};

// Bug "A server that misses one view broadcast": the worker's newer epoch
// is UNAVAILABLE VIEW_BEHIND until the server, told the newer epoch by a
// heartbeat reply, fetches and installs the view itself.
TEST_F(CatchUpViewTest, ServerThatMissedABroadcastCatchesUp) {
  scheduler_.view = MakeView(2, 5);
  absl::Status behind = PushAt(&node_, 2, 1);
  EXPECT_EQ(behind.code(), StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(behind), proto::REASON_VIEW_BEHIND);

  ASSERT_TRUE(CatchUpView(&node_, &scheduler_, 0, 2, absl::InfiniteFuture()).ok());
  EXPECT_EQ(node_.epoch(), 2);
  ASSERT_EQ(scheduler_.asked.size(), 1u);
  EXPECT_EQ(scheduler_.asked[0].known_epoch(), 1);
  EXPECT_EQ(scheduler_.asked[0].role(), proto::ROLE_SERVER);
  EXPECT_TRUE(PushAt(&node_, 2, 1).ok());  // the same request, resent
  absl::Status old = PushAt(&node_, 1, 2);
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsStaleEpoch(old));
}

TEST_F(CatchUpViewTest, NothingToDoWhenNotBehind) {
  EXPECT_TRUE(CatchUpView(&node_, &scheduler_, 0, 1, absl::InfiniteFuture()).ok());
  EXPECT_TRUE(scheduler_.asked.empty());
}

TEST_F(CatchUpViewTest, ErrorsAreReturned) {
  scheduler_.error = absl::UnavailableError("scheduler away");
  EXPECT_EQ(CatchUpView(&node_, &scheduler_, 0, 2, absl::InfiniteFuture()).code(),
            StatusCode::kUnavailable);
  scheduler_.error = absl::OkStatus();
  scheduler_.view = MakeView(1, 2);  // not newer after all
  EXPECT_EQ(CatchUpView(&node_, &scheduler_, 0, 2, absl::InfiniteFuture()).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(node_.epoch(), 1);
}

}  // namespace
}  // namespace ps
