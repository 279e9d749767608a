// Tests of the in-process, fault-injecting and fake transports, against a
// counting ServerHandler (no server/ code) and a FakeClock.
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "transport/fake_transport.h"
#include "transport/faulty_transport.h"
#include "transport/inproc_transport.h"

namespace ps {
namespace {

using absl::StatusCode;

// Applies nothing, counts what reached it, answers OK.
class CountingHandler : public ServerHandler {
 public:
  void Push(const proto::PushRequest&, proto::PushResponse* resp,
            Done done) override {
    ++pushes;
    resp->set_duplicate(pushes > 1);
    done(absl::OkStatus());
  }
  void Pull(const proto::PullRequest&, proto::PullResponse*,
            Done done) override {
    ++pulls;
    done(absl::OkStatus());
  }
  absl::Status Clock(const proto::ClockRequest&) override {
    ++clocks;
    return absl::OkStatus();
  }
  absl::Status Finish(const proto::FinishRequest&) override {
    ++finishes;
    return absl::OkStatus();
  }
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest&) override {
    return proto::ServerControlResponse();
  }
  absl::StatusOr<proto::ServerStatus> GetStatus() override {
    return proto::ServerStatus();
  }
  int pushes = 0, pulls = 0, clocks = 0, finishes = 0;
};

struct Answer {
  bool done = false;
  absl::Status status;
  bool duplicate = false;
};

void PushTo(ServerClient* c, Answer* a) {
  c->Push(std::make_shared<proto::PushRequest>(), absl::InfiniteFuture(),
          [a](const absl::Status& s, proto::PushResponse* r) {
            a->done = true;
            a->status = s;
            a->duplicate = r->duplicate();
          });
}

class FaultyTransportTest : public ::testing::Test {
 protected:
  // A FaultyClientFactory whose pushes follow `plan`, then kNone.
  std::unique_ptr<FaultyClientFactory> Faulty(std::vector<Fault> plan) {
    inproc_.AddServer(0, &handler_);
    FaultOptions f;
    f.timers = &clock_;
    f.schedule = [plan](RpcMethod m, int64_t i) {
      return m == RpcMethod::kPush && i < static_cast<int64_t>(plan.size())
                 ? plan[i]
                 : Fault::kNone;
    };
    return std::make_unique<FaultyClientFactory>(&inproc_, f);
  }

  FakeClock clock_;
  CountingHandler handler_;
  InProcClientFactory inproc_;
};

TEST_F(FaultyTransportTest, InProcCallsTheHandlerAtOnce) {
  inproc_.AddServer(0, &handler_);
  std::shared_ptr<ServerClient> c = inproc_.Server(InProcServerAddress(0));
  Answer a;
  PushTo(c.get(), &a);
  EXPECT_TRUE(a.done);
  EXPECT_TRUE(a.status.ok());
  EXPECT_EQ(handler_.pushes, 1);
  EXPECT_TRUE(c->Finish(proto::FinishRequest(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(handler_.finishes, 1);
}

TEST_F(FaultyTransportTest, InProcUnknownAddressIsUnavailable) {
  Answer a;
  PushTo(inproc_.Server("inproc:server:9").get(), &a);
  EXPECT_EQ(a.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(inproc_.Scheduler(kInProcSchedulerAddress)
                ->Register(proto::RegisterRequest(), absl::InfiniteFuture())
                .status()
                .code(),
            StatusCode::kUnavailable);
}

TEST_F(FaultyTransportTest, LostRequestNeverReachesTheServer) {
  auto faulty = Faulty({Fault::kDropRequest});
  Answer a;
  PushTo(faulty->Server(InProcServerAddress(0)).get(), &a);
  EXPECT_EQ(a.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(handler_.pushes, 0);
  EXPECT_EQ(faulty->stats().dropped_requests.load(), 1);
}

TEST_F(FaultyTransportTest, LostReplyWasAppliedByTheServer) {
  auto faulty = Faulty({Fault::kDropReply});
  Answer a;
  PushTo(faulty->Server(InProcServerAddress(0)).get(), &a);
  EXPECT_EQ(a.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(handler_.pushes, 1);
  EXPECT_EQ(faulty->stats().dropped_replies.load(), 1);
}

TEST_F(FaultyTransportTest, DelayedCallArrivesWhenTheClockMoves) {
  auto faulty = Faulty({Fault::kDelay});
  Answer a;
  PushTo(faulty->Server(InProcServerAddress(0)).get(), &a);
  EXPECT_FALSE(a.done);
  EXPECT_EQ(handler_.pushes, 0);
  clock_.Advance(FaultOptions().delay);
  EXPECT_TRUE(a.done);
  EXPECT_TRUE(a.status.ok());
  EXPECT_EQ(handler_.pushes, 1);
}

TEST_F(FaultyTransportTest, DestroyingTheFactoryDeliversDelayedCalls) {
  auto faulty = Faulty({Fault::kDelay});
  Answer a;
  PushTo(faulty->Server(InProcServerAddress(0)).get(), &a);
  faulty.reset();
  EXPECT_TRUE(a.done);
  EXPECT_EQ(handler_.pushes, 1);
  EXPECT_EQ(clock_.pending_timers(), 0u);
}

TEST(FakeTransportTest, HeldCallIsAnsweredWhenTheTestSays) {
  FakeClientFactory f;
  std::shared_ptr<ServerClient> c = f.Server("a");
  Answer a;
  PushTo(c.get(), &a);
  EXPECT_FALSE(a.done);
  EXPECT_EQ(f.server("a")->held_pushes(), 1u);
  std::optional<HeldPush> p = f.server("a")->NextPush();
  ASSERT_TRUE(p.has_value());
  proto::PushResponse resp;
  resp.set_duplicate(true);
  p->Reply(absl::AbortedError("x"), resp);
  EXPECT_TRUE(a.done);
  EXPECT_EQ(a.status.code(), StatusCode::kAborted);
  EXPECT_TRUE(a.duplicate);
  EXPECT_FALSE(f.server("a")->NextPush().has_value());
}

TEST(FakeTransportTest, SchedulerAnswersTheViewItWasGiven) {
  FakeSchedulerClient s;
  EXPECT_EQ(s.GetView(proto::GetViewRequest(), absl::InfiniteFuture())
                .status()
                .code(),
            StatusCode::kUnavailable);
  proto::ClusterView v;
  v.set_epoch(3);
  s.set_view(v);
  auto r = s.GetView(proto::GetViewRequest(), absl::InfiniteFuture());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->ready());
  EXPECT_EQ(r->view().epoch(), 3);
  EXPECT_EQ(s.get_view_calls(), 2);
}

}  // namespace
}  // namespace ps
