// Unit tests of ServerNode: no network, no threads, a FakeClock. Every
// callback runs on the test thread (synchronously, or from the ClockTick /
// Finish / Tick call that releases it), so the tests can check exactly when
// a waiting pull is answered.
#include "server/server_node.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/routing.h"
#include "common/value_codec.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "server/server_runner.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "transport/errors.h"
#include "transport/transport.h"

namespace ps {
namespace {

using absl::StatusCode;

constexpr int kVnodes = 8;

// A view with `servers` servers on a hash ring, `workers` workers and one
// table {id 0, dim 1, sgd lr 1}, so a pushed gradient g over n examples
// moves a fresh value to exactly -g/n.
proto::ClusterView MakeView(int servers, int workers,
                            proto::ConsistencyMode mode, int64_t tau = 0,
                            int64_t epoch = 1) {
  proto::ClusterView v;
  v.set_epoch(epoch);
  std::vector<int> ids;
  for (int i = 0; i < servers; ++i) ids.push_back(i);
  *v.mutable_routing() = BuildHashRing(ids, kVnodes, epoch);
  for (int i = 0; i < servers; ++i) {
    proto::NodeInfo* s = v.mutable_routing()->add_servers();
    s->set_id(i);
    s->set_role(proto::ROLE_SERVER);
    s->set_address("inproc:server:" + std::to_string(i));
    s->set_state(proto::NODE_ALIVE);
  }
  for (int i = 0; i < workers; ++i) {
    proto::NodeInfo* w = v.add_workers();
    w->set_id(i);
    w->set_role(proto::ROLE_WORKER);
    w->set_state(proto::NODE_ALIVE);
  }
  v.mutable_consistency()->set_mode(mode);
  v.mutable_consistency()->set_tau(tau);
  proto::TableConfig* t = v.add_tables();
  t->set_id(0);
  t->set_name("weights");
  t->set_dim(1);
  t->mutable_optimizer()->set_name("sgd");
  t->mutable_optimizer()->set_learning_rate(1.0f);
  return v;
}

std::string Keys(const std::vector<uint64_t>& k) {
  std::string s;
  PackTo<uint64_t>(&s, k);
  return s;
}

std::string Vals(const std::vector<float>& v) {
  std::string s;
  PackTo<float>(&s, v);
  return s;
}

proto::PushRequest MakePush(int worker, uint64_t seq, int64_t clock,
                            const std::vector<uint64_t>& keys,
                            const std::vector<float>& grads, int examples,
                            int64_t epoch = 1) {
  proto::PushRequest r;
  r.set_worker_id(worker);
  r.set_seq(seq);
  r.set_clock(clock);
  r.set_epoch(epoch);
  r.set_table(0);
  r.set_keys(Keys(keys));
  r.set_vals(Vals(grads));
  r.set_num_examples(examples);
  return r;
}

proto::ClockRequest MakeClock(int worker, int64_t clock, int64_t pushes,
                              int examples, uint64_t settled = 0) {
  proto::ClockRequest r;
  r.set_worker_id(worker);
  r.set_clock(clock);
  r.set_epoch(1);
  r.set_pushes(pushes);
  r.set_num_examples(examples);
  r.set_settled_seq(settled);
  return r;
}

proto::FinishRequest MakeFinish(int worker, int64_t final_clock) {
  proto::FinishRequest r;
  r.set_worker_id(worker);
  r.set_final_clock(final_clock);
  return r;
}

// Pushes and returns the status; the callback must run before Push returns
// (nothing in a push waits).
absl::Status PushNow(ServerNode* node, const proto::PushRequest& req,
                     proto::PushResponse* resp = nullptr) {
  proto::PushResponse local;
  if (resp == nullptr) resp = &local;
  bool called = false;
  absl::Status out = absl::InternalError("done not called");
  node->Push(req, resp, [&](const absl::Status& s) {
    EXPECT_FALSE(called) << "done called twice";
    called = true;
    out = s;
  });
  EXPECT_TRUE(called) << "push did not answer synchronously";
  return out;
}

// A pull whose answer may come later: request and response stay alive here
// (the node requires that) until the test is over.
struct PendingPull {
  proto::PullRequest req;
  proto::PullResponse resp;
  int calls = 0;
  absl::Status status = absl::InternalError("not answered");

  bool done() const { return calls > 0; }
  std::vector<float> values() const {
    absl::Span<const float> v = ViewAs<float>(resp.vals());
    return std::vector<float>(v.begin(), v.end());
  }
};

std::unique_ptr<PendingPull> StartPull(ServerNode* node, int worker,
                                       int64_t clock,
                                       const std::vector<uint64_t>& keys,
                                       int64_t wait_ms = 60000,
                                       int64_t epoch = 1, int table = 0) {
  auto p = std::make_unique<PendingPull>();
  p->req.set_worker_id(worker);
  p->req.set_clock(clock);
  p->req.set_epoch(epoch);
  p->req.set_table(table);
  p->req.set_keys(Keys(keys));
  p->req.set_wait_ms(wait_ms);
  PendingPull* raw = p.get();
  node->Pull(raw->req, &raw->resp, [raw](const absl::Status& s) {
    ++raw->calls;
    raw->status = s;
  });
  return p;
}

// Pulls keys that must be answered at once; returns their values.
std::vector<float> PullNow(ServerNode* node, int worker, int64_t clock,
                           const std::vector<uint64_t>& keys) {
  auto p = StartPull(node, worker, clock, keys);
  EXPECT_TRUE(p->done()) << "pull at clock " << clock << " waited";
  EXPECT_TRUE(p->status.ok()) << p->status;
  return p->values();
}

class ServerNodeTest : public ::testing::Test {
 protected:
  void Configure(int servers, int workers, proto::ConsistencyMode mode,
                 int64_t tau = 0) {
    ASSERT_TRUE(node_.Configure(0, MakeView(servers, workers, mode, tau)).ok());
  }
  // Whatever a test sent, every range's consistency state is consistent.
  void TearDown() override {
    EXPECT_TRUE(node_.CheckInvariants().ok()) << node_.CheckInvariants();
  }

  FakeClock clock_;
  ServerNode node_{&clock_};
};

// UNAVAILABLE with reason VIEW_BEHIND: a worker resends and does not name
// the server a suspect (it answered). A server is sent requests from the
// moment the cluster is ready, which may be a little before it configured
// itself; plain UNAVAILABLE had a worker name a live server to the
// scheduler at start-up (MultiProcessTest.BspStragglerGetsNoServerFailedOver
// on a loaded machine).
TEST_F(ServerNodeTest, NotConfiguredIsUnavailable) {
  auto behind = [](const absl::Status& s) {
    return s.code() == StatusCode::kUnavailable &&
           ReasonOf(s) == proto::REASON_VIEW_BEHIND;
  };
  EXPECT_TRUE(behind(PushNow(&node_, MakePush(0, 1, 0, {1}, {1}, 1))));
  auto p = StartPull(&node_, 0, 0, {1});
  ASSERT_TRUE(p->done());
  EXPECT_TRUE(behind(p->status)) << p->status;
  EXPECT_TRUE(behind(node_.ClockTick(MakeClock(0, 0, 0, 1))));
  EXPECT_TRUE(behind(node_.Finish(MakeFinish(0, 1))));
  proto::ConsistencyConfig c;
  c.set_mode(proto::MODE_ASP);
  EXPECT_EQ(node_.SetConsistency(c).code(), StatusCode::kUnavailable);
  EXPECT_EQ(node_.table(0), nullptr);
  node_.Tick();  // harmless
}

TEST_F(ServerNodeTest, ConfigureRejectsMalformedView) {
  proto::ClusterView v = MakeView(1, 1, proto::MODE_ASP);
  v.clear_workers();
  EXPECT_EQ(node_.Configure(0, v).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(node_.Configure(5, MakeView(1, 1, proto::MODE_ASP)).code(),
            StatusCode::kInvalidArgument);
  proto::ClusterView no_routing = MakeView(1, 1, proto::MODE_ASP);
  no_routing.clear_routing();
  EXPECT_EQ(node_.Configure(0, no_routing).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(node_.Configure(0, MakeView(1, 1, proto::MODE_ASP)).ok());
}

TEST_F(ServerNodeTest, PushThenPullGivesMinusGradOverExamples) {
  Configure(1, 1, proto::MODE_ASP);
  proto::PushResponse resp;
  ASSERT_TRUE(
      PushNow(&node_, MakePush(0, 1, 0, {3, 10, 99}, {3, -1, 8}, 2), &resp)
          .ok());
  EXPECT_FALSE(resp.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 0, {3, 10, 42, 99}),
            (std::vector<float>{-1.5f, 0.5f, 0.0f, -4.0f}));
  // A key never pushed reads as 0 and is not stored.
  EXPECT_EQ(node_.table(0)->size(), 3u);
  EXPECT_EQ(node_.Status().pushes(), 1);
}

TEST_F(ServerNodeTest, ReplayedPushIsDuplicateAndChangesNothing) {
  Configure(1, 1, proto::MODE_ASP);
  const proto::PushRequest req = MakePush(0, 1, 0, {5}, {4}, 1);
  proto::PushResponse first, second;
  ASSERT_TRUE(PushNow(&node_, req, &first).ok());
  EXPECT_FALSE(first.duplicate());
  ASSERT_EQ(PullNow(&node_, 0, 0, {5}), std::vector<float>{-4.0f});

  ASSERT_TRUE(PushNow(&node_, req, &second).ok());
  EXPECT_TRUE(second.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 0, {5}), std::vector<float>{-4.0f});
  EXPECT_EQ(node_.Status().pushes(), 1);

  // The next seq is a new push.
  proto::PushResponse third;
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 0, {5}, {1}, 1), &third).ok());
  EXPECT_FALSE(third.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 0, {5}), std::vector<float>{-5.0f});
}

TEST_F(ServerNodeTest, DedupIsPerWorker) {
  Configure(1, 2, proto::MODE_ASP);
  proto::PushResponse a, b;
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {5}, {1}, 1), &a).ok());
  ASSERT_TRUE(PushNow(&node_, MakePush(1, 1, 0, {5}, {2}, 1), &b).ok());
  EXPECT_FALSE(a.duplicate());
  EXPECT_FALSE(b.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 0, {5}), std::vector<float>{-3.0f});
}

TEST_F(ServerNodeTest, OutOfOrderSeqsAreEachAppliedOnce) {
  Configure(1, 1, proto::MODE_ASP);
  for (uint64_t seq : {3, 1, 2}) {
    proto::PushResponse r;
    ASSERT_TRUE(PushNow(&node_, MakePush(0, seq, 0, {7}, {1}, 1), &r).ok());
    EXPECT_FALSE(r.duplicate()) << seq;
  }
  for (uint64_t seq : {1, 2, 3}) {
    proto::PushResponse r;
    ASSERT_TRUE(PushNow(&node_, MakePush(0, seq, 0, {7}, {1}, 1), &r).ok());
    EXPECT_TRUE(r.duplicate()) << seq;
  }
  EXPECT_EQ(PullNow(&node_, 0, 0, {7}), std::vector<float>{-3.0f});
}

TEST_F(ServerNodeTest, MalformedRequestsAreInvalidArgument) {
  Configure(1, 1, proto::MODE_ASP);
  auto expect_push = [&](proto::PushRequest r, const char* what) {
    EXPECT_EQ(PushNow(&node_, r).code(), StatusCode::kInvalidArgument) << what;
  };
  proto::PushRequest r = MakePush(0, 1, 0, {1, 2}, {1, 1}, 1);
  r.mutable_keys()->resize(15);
  expect_push(r, "keys not a multiple of 8");
  expect_push(MakePush(0, 1, 0, {5, 3}, {1, 1}, 1), "unsorted keys");
  expect_push(MakePush(0, 1, 0, {3, 3}, {1, 1}, 1), "repeated keys");
  expect_push(MakePush(0, 1, 0, {1, 2}, {1}, 1), "too few vals");
  expect_push(MakePush(0, 1, 0, {1, 2}, {1, 1, 1}, 1), "too many vals");
  r = MakePush(0, 1, 0, {1, 2}, {1, 1}, 1);
  r.mutable_vals()->resize(7);
  expect_push(r, "vals not a multiple of 4");
  r = MakePush(0, 1, 0, {1}, {1}, 1);
  r.set_table(1);
  expect_push(r, "unknown table");
  r.set_table(-1);
  expect_push(r, "negative table");
  expect_push(MakePush(1, 1, 0, {1}, {1}, 1), "unknown worker");
  expect_push(MakePush(-1, 1, 0, {1}, {1}, 1), "negative worker");
  expect_push(MakePush(0, 1, -1, {1}, {1}, 1), "negative clock");

  auto expect_pull = [&](std::unique_ptr<PendingPull> p, const char* what) {
    ASSERT_TRUE(p->done()) << what;
    EXPECT_EQ(p->status.code(), StatusCode::kInvalidArgument) << what;
  };
  expect_pull(StartPull(&node_, 0, 0, {5, 3}), "unsorted pull keys");
  expect_pull(StartPull(&node_, 1, 0, {1}), "pull: unknown worker");
  expect_pull(StartPull(&node_, 0, 0, {1}, 1000, 1, 3), "pull: unknown table");
  {
    auto p = std::make_unique<PendingPull>();
    p->req.set_epoch(1);
    p->req.set_keys(std::string(9, 'x'));
    PendingPull* raw = p.get();
    node_.Pull(raw->req, &raw->resp, [raw](const absl::Status& s) {
      ++raw->calls;
      raw->status = s;
    });
    expect_pull(std::move(p), "pull keys not a multiple of 8");
  }

  EXPECT_EQ(node_.ClockTick(MakeClock(3, 0, 0, 1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(node_.ClockTick(MakeClock(0, -1, 0, 1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(node_.ClockTick(MakeClock(0, 0, -2, 1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(node_.Finish(MakeFinish(-4, 1)).code(),
            StatusCode::kInvalidArgument);

  // Nothing was applied, and no rejected push used up its seq.
  EXPECT_EQ(node_.Status().pushes(), 0);
  EXPECT_EQ(node_.table(0)->size(), 0u);
  proto::PushResponse ok;
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {1}, {2}, 1), &ok).ok());
  EXPECT_FALSE(ok.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 0, {1}), std::vector<float>{-2.0f});
}

TEST_F(ServerNodeTest, OlderEpochIsStaleEpoch) {
  Configure(1, 1, proto::MODE_ASP);
  auto p = StartPull(&node_, 0, 0, {1}, 1000, /*epoch=*/0);
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->status.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsStaleEpoch(p->status)) << p->status;
}

// Bug "A server that misses one view broadcast": a request sliced with a
// newer view than the server's is not stale (re-slicing would not help): the
// server is behind, the worker resends the same request later.
TEST_F(ServerNodeTest, NewerEpochIsViewBehind) {
  Configure(1, 1, proto::MODE_ASP);
  absl::Status s = PushNow(&node_, MakePush(0, 1, 0, {1}, {1}, 1, /*epoch=*/2));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(s), proto::REASON_VIEW_BEHIND) << s;
  EXPECT_FALSE(IsStaleEpoch(s));
  // The rejected push did not use up its seq.
  proto::PushResponse r;
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {1}, {1}, 1), &r).ok());
  EXPECT_FALSE(r.duplicate());
  // Once the server installed epoch 2, the same request is admitted.
  ASSERT_TRUE(node_.Configure(0, MakeView(1, 1, proto::MODE_ASP, 0, 2)).ok());
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 0, {1}, {1}, 1, 2), &r).ok());
}

// Gives every range of `v` the same chain at `epoch`: `owner`, then
// `backup` as its one backup (none when -1).
void SetEveryChain(proto::ClusterView* v, int64_t epoch, int owner,
                   int backup) {
  v->set_epoch(epoch);
  proto::RoutingTable* t = v->mutable_routing();
  t->set_epoch(epoch);
  t->set_replicas(backup >= 0 ? 1 : 0);
  t->clear_range_backup();
  for (int r = 0; r < t->range_server_size(); ++r) {
    t->set_range_server(r, owner);
    if (backup >= 0) t->add_range_backup(backup);
  }
}

// Issue 9: a server made the owner of a range it never got a copy of
// (a backup new to the range whose primary died before copying) holds
// nothing of the range's state; it refuses every push and pull with
// DATA_LOSS naming the range rather than serve an emptied range.
TEST_F(ServerNodeTest, OwnerWithoutACopyRefusesWithDataLoss) {
  // Epoch 1: S[0] owns every range and has no backup; S[1] (this node)
  // holds nothing.
  proto::ClusterView v = MakeView(2, 1, proto::MODE_ASP);
  SetEveryChain(&v, 1, 0, -1);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  // Epoch 2: S[1] becomes the backup of every range: it awaits copies.
  SetEveryChain(&v, 2, 0, 1);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  proto::HeartbeatRequest hb;
  node_.FillHeartbeat(&hb);
  EXPECT_EQ(hb.view_epoch(), 2);
  EXPECT_EQ(hb.incomplete_ranges_size(), v.routing().range_server_size());
  // Epoch 3: S[0] died before copying; S[1] is made the owner anyway.
  SetEveryChain(&v, 3, 1, -1);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  absl::Status s = PushNow(&node_, MakePush(0, 1, 0, {42}, {-1}, 1, 3));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("without a complete copy"), std::string::npos)
      << s;
  auto p = StartPull(&node_, 0, 0, {42}, 60000, 3);
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->status.code(), StatusCode::kDataLoss) << p->status;
}

// A backup since the job's start holds every range it backs up: promoted,
// it serves; its heartbeat names no incomplete range.
TEST_F(ServerNodeTest, BackupSinceTheStartIsPromotedWhole) {
  proto::ClusterView v = MakeView(2, 1, proto::MODE_ASP);
  SetEveryChain(&v, 1, 0, 1);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  proto::HeartbeatRequest hb;
  node_.FillHeartbeat(&hb);
  EXPECT_EQ(hb.view_epoch(), 1);
  EXPECT_EQ(hb.incomplete_ranges_size(), 0);
  SetEveryChain(&v, 2, 1, -1);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  EXPECT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {42}, {-1}, 1, 2)).ok());
}

// A pull reads values only as the ranges' owner: when the view changes
// while it reads (here from its value buffer's allocation, between the
// release and the copy), it answers STALE_EPOCH instead of values that
// may be a backup's, and the worker asks the new owner. Without the
// check, a range moved away under load was read from the old owner's
// lagging state (a BSP model off by ~1e-4 in 1 of ~40 runs with a move).
TEST_F(ServerNodeTest, PullWhoseViewChangesWhileReadIsStaleEpoch) {
  proto::ClusterView v = MakeView(2, 1, proto::MODE_ASP);
  SetEveryChain(&v, 1, 1, -1);
  ASSERT_TRUE(node_.Configure(1, v).ok());  // S[1] owns every range
  std::vector<float> buffer(1);
  auto pull = [&](bool move) {
    proto::PullRequest req;
    req.set_worker_id(0);
    req.set_clock(0);
    req.set_epoch(1);
    req.set_table(0);
    req.set_keys(Keys({42}));
    proto::PullResponse resp;
    absl::Status out = absl::UnknownError("not answered");
    bool lock_free = false;
    absl::Notification filled;
    std::thread heartbeat;
    node_.Pull(
        req, &resp,
        [&](const absl::Status& s) {
          out = s;
          // The answer goes out (a socket write, which may block) with the
          // node's lock free: a heartbeat can be filled meanwhile.
          heartbeat = std::thread([&] {
            proto::HeartbeatRequest r;
            node_.FillHeartbeat(&r);
            filled.Notify();
          });
          lock_free = filled.WaitForNotificationWithTimeout(absl::Seconds(10));
        },
        absl::Seconds(60), [&](size_t floats) {
          if (move) {
            SetEveryChain(&v, 2, 0, 1);  // the ranges move to S[0]
            EXPECT_TRUE(node_.Configure(1, v).ok());
          }
          buffer.resize(floats);
          return buffer.data();
        });
    if (heartbeat.joinable()) heartbeat.join();
    EXPECT_TRUE(lock_free) << "answered under the node's lock";
    return out;
  };
  EXPECT_TRUE(pull(false).ok());
  absl::Status s = pull(true);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(ReasonOf(s), proto::REASON_STALE_EPOCH) << s;
}

// Issue 9: a clock's announcements reach a backup as one entry for all
// the ranges (ReplicaAnnounces); each range applies its index in order,
// a resend is skipped, a gap or mismatched arrays are refused.
TEST_F(ServerNodeTest, BackupAppliesOneClocksAnnouncementsForEveryRange) {
  proto::ClusterView v = MakeView(2, 1, proto::MODE_BSP);
  SetEveryChain(&v, 1, 0, 1);
  ASSERT_TRUE(node_.Configure(1, v).ok());  // S[1]: backup of every range
  const int ranges = v.routing().range_server_size();
  auto announce = [&](int64_t index) {
    proto::ReplicateRequest req;
    req.set_from_server(0);
    req.set_epoch(1);
    proto::ReplicaAnnounces* a = req.add_entries()->mutable_announces();
    a->set_worker(0);
    a->set_clock(0);
    a->set_examples(1);
    for (int r = 0; r < ranges; ++r) {
      a->add_ranges(r);
      a->add_indexes(index);
      a->add_segments(0);
      a->add_settled_seqs(0);
    }
    return req;
  };
  proto::ReplicateRequest bad = announce(1);
  bad.mutable_entries(0)->mutable_announces()->mutable_segments()->RemoveLast();
  EXPECT_EQ(node_.Replicate(bad).code(), StatusCode::kInvalidArgument);
  proto::ReplicateRequest gap = announce(2);
  EXPECT_EQ(node_.Replicate(gap).code(), StatusCode::kDataLoss);
  ASSERT_TRUE(node_.Replicate(announce(1)).ok());
  ASSERT_TRUE(node_.Replicate(announce(1)).ok());  // a resend: skipped
  // Promoted, the node holds worker 0's clock 0 as complete on every
  // range: a BSP pull of clock 1 is answered at once.
  SetEveryChain(&v, 2, 1, -1);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  auto p = StartPull(&node_, 0, 1, {42, 1ULL << 63}, 60000, 2);
  ASSERT_TRUE(p->done());
  EXPECT_TRUE(p->status.ok()) << p->status;
}

// A backup applies a replicated push segment by segment (parallel arrays
// per segment); arrays of different lengths are refused whole.
TEST_F(ServerNodeTest, BackupAppliesAReplicaPushBySegments) {
  proto::ClusterView v = MakeView(2, 1, proto::MODE_ASP);
  SetEveryChain(&v, 1, 0, 1);
  ASSERT_TRUE(node_.Configure(1, v).ok());  // S[1]: backup of every range
  auto routing = Routing::FromProto(v.routing());
  ASSERT_TRUE(routing.ok());
  // Two ranges, in key order.
  int a = 0, b = 1;
  if (routing->RangeBegin(b) < routing->RangeBegin(a)) std::swap(a, b);
  const uint64_t ka = routing->RangeBegin(a);
  const uint64_t kb = routing->RangeBegin(b);
  proto::ReplicateRequest req;
  req.set_from_server(0);
  req.set_epoch(1);
  proto::ReplicaPush* p = req.add_entries()->mutable_push();
  p->set_worker(0);
  p->set_clock(0);
  p->set_table(0);
  p->set_num_examples(1);
  p->set_keys(Keys({ka, kb}));
  p->set_vals(Vals({0.5f, 2.0f}));
  for (int r : {a, b}) {
    p->add_seg_ranges(r);
    p->add_seg_indexes(1);
    p->add_seg_seqs(1);
    p->add_seg_num_keys(1);
  }
  proto::ReplicateRequest bad = req;
  bad.mutable_entries(0)->mutable_push()->mutable_seg_seqs()->RemoveLast();
  EXPECT_EQ(node_.Replicate(bad).code(), StatusCode::kInvalidArgument);
  bad = req;
  bad.mutable_entries(0)->mutable_push()->set_seg_num_keys(1, 2);
  EXPECT_EQ(node_.Replicate(bad).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(node_.Replicate(req).ok());
  ASSERT_TRUE(node_.Replicate(req).ok());  // a resend: skipped
  SetEveryChain(&v, 2, 1, -1);  // promoted
  ASSERT_TRUE(node_.Configure(1, v).ok());
  auto pull = StartPull(&node_, 0, 0, {ka, kb}, 60000, 2);
  ASSERT_TRUE(pull->done());
  ASSERT_TRUE(pull->status.ok()) << pull->status;
  EXPECT_EQ(pull->values(), (std::vector<float>{-0.5f, -2.0f}));
}

// Replication after aggregation: the BSP clocks a primary applied reach
// a backup as one entry of packed arrays (per clock its counts, then the
// segments, announcements and sums of every clock in turn). The backup
// applies each clock's sums on its range; a resend is skipped; counts
// that do not match the arrays are refused whole.
TEST_F(ServerNodeTest, BackupAppliesPackedBspClocks) {
  proto::ClusterView v = MakeView(2, 1, proto::MODE_BSP);
  SetEveryChain(&v, 1, 0, 1);
  ASSERT_TRUE(node_.Configure(1, v).ok());  // S[1]: backup of every range
  auto routing = Routing::FromProto(v.routing());
  ASSERT_TRUE(routing.ok());
  const int a = 0, b = 1;
  const uint64_t ka = routing->RangeBegin(a);
  const uint64_t kb = routing->RangeBegin(b);
  proto::ReplicateRequest req;
  req.set_from_server(0);
  req.set_epoch(1);
  proto::ReplicaBspClocks* c = req.add_entries()->mutable_bsp();
  for (int r : {a, b}) {
    c->add_ranges(r);
    c->add_indexes(1);
    c->add_clocks(0);
    c->add_examples(1);
    c->add_num_segs(1);
    c->add_num_anns(1);
    c->add_num_sums(1);
    c->add_seg_workers(0);
    c->add_seg_seqs(1);
    c->add_ann_workers(0);
    c->add_ann_segments(1);
    c->add_ann_examples(1);
    c->add_ann_settled(0);
    c->add_sum_tables(0);
    c->add_sum_num_keys(1);
  }
  c->set_sum_keys(Keys({ka, kb}));
  c->set_sum_vals(Vals({0.5f, 2.0f}));
  auto refused = [&](auto change) {
    proto::ReplicateRequest bad = req;
    change(bad.mutable_entries(0)->mutable_bsp());
    return node_.Replicate(bad).code() == StatusCode::kInvalidArgument;
  };
  using Clocks = proto::ReplicaBspClocks;
  EXPECT_TRUE(refused([](Clocks* x) { x->mutable_seg_seqs()->RemoveLast(); }));
  EXPECT_TRUE(refused([](Clocks* x) { x->mutable_examples()->RemoveLast(); }));
  EXPECT_TRUE(refused([](Clocks* x) { x->set_num_segs(1, 2); }));
  EXPECT_TRUE(refused([](Clocks* x) { x->set_num_anns(0, -1); }));
  EXPECT_TRUE(refused([](Clocks* x) { x->set_sum_num_keys(0, 2); }));
  EXPECT_TRUE(refused([](Clocks* x) { x->set_sum_tables(1, 7); }));
  EXPECT_TRUE(refused([](Clocks* x) { x->mutable_sum_vals()->pop_back(); }));
  EXPECT_TRUE(refused([&](Clocks* x) {
    x->set_sum_keys(Keys({kb, ka}));  // range b's key in range a's sum
  }));
  ASSERT_TRUE(node_.Replicate(req).ok());
  ASSERT_TRUE(node_.Replicate(req).ok());  // a resend: skipped
  SetEveryChain(&v, 2, 1, -1);  // promoted
  ASSERT_TRUE(node_.Configure(1, v).ok());
  auto pull = StartPull(&node_, 0, 1, {ka, kb}, 60000, 2);
  ASSERT_TRUE(pull->done());
  ASSERT_TRUE(pull->status.ok()) << pull->status;
  EXPECT_EQ(pull->values(), (std::vector<float>{-0.5f, -2.0f}));
}

// A batch through the data plane's shared memory (issue 9): a copy's or
// delta's rows name their entries in the values the request came with
// (RangeCopy.Rows.vals_offset), and the backup reads them from there. Rows
// that name bytes outside those values, at an offset that is no float's,
// as many bytes as do not match their keys, or that have entries of their
// own as well, are refused whole; so are rows naming values that a request
// without any (over gRPC) does not have.
TEST_F(ServerNodeTest, BackupReadsRowsEntriesFromTheRequestsValues) {
  proto::ClusterView v = MakeView(2, 1, proto::MODE_ASP);
  SetEveryChain(&v, 1, 0, 1);
  ASSERT_TRUE(node_.Configure(1, v).ok());  // S[1]: backup of every range
  auto routing = Routing::FromProto(v.routing());
  ASSERT_TRUE(routing.ok());
  const int a = 0;
  const uint64_t ka = routing->RangeBegin(a);
  ASSERT_GT(routing->RangeLast(a), ka);
  proto::ReplicateRequest req;
  req.set_from_server(0);
  req.set_epoch(1);
  proto::ReplicaEntry* e = req.add_entries();
  e->set_range(a);
  e->set_index(1);
  e->mutable_copy()->mutable_state()->add_workers();  // W[0], nothing yet
  proto::RangeCopy::Rows* rows = e->mutable_copy()->add_tables();
  rows->set_table(0);
  rows->set_keys(Keys({ka, ka + 1}));
  rows->set_vals_offset(8);
  rows->set_vals_bytes(8);
  const float floats[4] = {9.0f, 9.0f, 1.5f, -2.0f};
  const absl::Span<const char> vals(reinterpret_cast<const char*>(floats),
                                    sizeof(floats));
  auto refused = [&](auto change, absl::Span<const char> with) {
    proto::ReplicateRequest bad = req;
    change(bad.mutable_entries(0)->mutable_copy()->mutable_tables(0));
    return node_.Replicate(bad, with).code() == StatusCode::kInvalidArgument;
  };
  using Rows = proto::RangeCopy::Rows;
  EXPECT_TRUE(refused([](Rows* r) { r->set_vals_offset(12); }, vals));
  EXPECT_TRUE(refused([](Rows* r) { r->set_vals_offset(6); }, vals));
  EXPECT_TRUE(
      refused([](Rows* r) { r->set_vals_offset(~uint64_t{0} - 3); }, vals));
  EXPECT_TRUE(refused([](Rows* r) { r->set_vals_bytes(~uint64_t{0}); }, vals));
  EXPECT_TRUE(refused([](Rows* r) { r->set_vals_bytes(4); }, vals));
  EXPECT_TRUE(refused(
      [](Rows* r) {
        r->set_entries(Vals({1.0f, 2.0f}));
      },
      vals));
  EXPECT_TRUE(refused([](Rows*) {}, {}));  // over gRPC: no values
  const absl::Status s = node_.Replicate(req, vals);
  ASSERT_TRUE(s.ok()) << s;
  SetEveryChain(&v, 2, 1, -1);  // promoted
  ASSERT_TRUE(node_.Configure(1, v).ok());
  auto pull = StartPull(&node_, 0, 1, {ka, ka + 1}, 60000, 2);
  ASSERT_TRUE(pull->done());
  ASSERT_TRUE(pull->status.ok()) << pull->status;
  EXPECT_EQ(pull->values(), (std::vector<float>{1.5f, -2.0f}));
}

TEST_F(ServerNodeTest, KeyOfAnotherServerIsStaleEpoch) {
  Configure(2, 1, proto::MODE_ASP);  // this node is server 0 of 2
  auto routing = Routing::FromProto(MakeView(2, 1, proto::MODE_ASP).routing());
  ASSERT_TRUE(routing.ok());
  uint64_t mine = 0, theirs = 0;
  bool have_mine = false, have_theirs = false;
  for (uint64_t k = 1; !(have_mine && have_theirs);
       k += 0x0123456789abcdefULL) {
    if (routing->ServerOf(k) == 0 && !have_mine) {
      mine = k;
      have_mine = true;
    } else if (routing->ServerOf(k) == 1 && !have_theirs) {
      theirs = k;
      have_theirs = true;
    }
  }
  std::vector<uint64_t> both = {std::min(mine, theirs), std::max(mine, theirs)};
  absl::Status s = PushNow(&node_, MakePush(0, 1, 0, both, {1, 1}, 1));
  EXPECT_TRUE(IsStaleEpoch(s)) << s;
  auto p = StartPull(&node_, 0, 0, {theirs});
  ASSERT_TRUE(p->done());
  EXPECT_TRUE(IsStaleEpoch(p->status)) << p->status;
  EXPECT_EQ(node_.table(0)->size(), 0u);
  // Its own key is fine.
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {mine}, {1}, 1)).ok());
  EXPECT_EQ(PullNow(&node_, 0, 0, {mine}), std::vector<float>{-1.0f});
}

TEST_F(ServerNodeTest, BspAppliesAClockOnlyWhenEveryWorkerCompletedIt) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {1, 2}, {1, 2}, 1)).ok());
  ASSERT_TRUE(PushNow(&node_, MakePush(1, 1, 0, {2, 3}, {6, 8}, 3)).ok());
  // Pulls at clock 0 need nothing, and see nothing yet.
  EXPECT_EQ(PullNow(&node_, 0, 0, {1, 2, 3}), (std::vector<float>{0, 0, 0}));
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 1, 1)).ok());
  EXPECT_EQ(PullNow(&node_, 1, 0, {1, 2, 3}), (std::vector<float>{0, 0, 0}));
  ASSERT_TRUE(node_.ClockTick(MakeClock(1, 0, 1, 3)).ok());
  // Summed in worker order and divided by the clock's 1 + 3 examples.
  EXPECT_EQ(PullNow(&node_, 0, 1, {1, 2, 3}),
            (std::vector<float>{-0.25f, -2.0f, -2.0f}));
  EXPECT_EQ(PullNow(&node_, 1, 1, {1, 2, 3}),
            (std::vector<float>{-0.25f, -2.0f, -2.0f}));
}

TEST_F(ServerNodeTest, BspPullOfNextClockWaitsForEveryWorker) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {4}, {2}, 2)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 1, 2)).ok());
  auto p = StartPull(&node_, 0, 1, {4});
  EXPECT_FALSE(p->done()) << "worker 1 has not completed clock 0";
  node_.Tick();
  EXPECT_FALSE(p->done());
  clock_.Advance(absl::Milliseconds(7));  // held this long for worker 1
  ASSERT_TRUE(PushNow(&node_, MakePush(1, 1, 0, {4}, {6}, 2)).ok());
  EXPECT_FALSE(p->done()) << "a push does not complete a clock";
  ASSERT_TRUE(node_.ClockTick(MakeClock(1, 0, 1, 2)).ok());
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->calls, 1);
  ASSERT_TRUE(p->status.ok()) << p->status;
  EXPECT_EQ(p->values(), std::vector<float>{-2.0f});
  EXPECT_EQ(p->resp.held_us(), 7000);  // the consistency wait, reported
  // A replayed ClockTick is harmless.
  EXPECT_TRUE(node_.ClockTick(MakeClock(1, 0, 1, 2)).ok());
  EXPECT_EQ(PullNow(&node_, 1, 1, {4}), std::vector<float>{-2.0f});
}

TEST_F(ServerNodeTest, BspPushForACompletedClockIsRejected) {
  Configure(1, 1, proto::MODE_BSP);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  absl::Status s = PushNow(&node_, MakePush(0, 1, 0, {4}, {2}, 2));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(IsStaleEpoch(s));
  EXPECT_EQ(PullNow(&node_, 0, 1, {4}), std::vector<float>{0.0f});
}

TEST_F(ServerNodeTest, SspBoundsStalenessByTau) {
  Configure(1, 2, proto::MODE_SSP, /*tau=*/1);
  // SSP applies a push on arrival.
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {9}, {1}, 1)).ok());
  EXPECT_EQ(PullNow(&node_, 1, 0, {9}), std::vector<float>{-1.0f});

  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 1, 1)).ok());
  // Worker 0 at clock 1 may run 1 ahead of worker 1 (still at 0).
  EXPECT_EQ(PullNow(&node_, 0, 1, {9}), std::vector<float>{-1.0f});
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 1, 0, 1)).ok());
  // At clock 2 it would be 2 ahead: waits.
  auto p = StartPull(&node_, 0, 2, {9});
  EXPECT_FALSE(p->done());
  ASSERT_TRUE(PushNow(&node_, MakePush(1, 1, 0, {9}, {2}, 1)).ok());
  EXPECT_FALSE(p->done());
  ASSERT_TRUE(node_.ClockTick(MakeClock(1, 0, 1, 1)).ok());
  ASSERT_TRUE(p->done());
  ASSERT_TRUE(p->status.ok()) << p->status;
  EXPECT_EQ(p->values(), std::vector<float>{-3.0f});
  EXPECT_EQ(node_.Status().worker_clocks(0), 2);
  EXPECT_EQ(node_.Status().worker_clocks(1), 1);
}

TEST_F(ServerNodeTest, AspNeverWaits) {
  Configure(1, 2, proto::MODE_ASP);
  for (int c = 0; c < 5; ++c) {
    ASSERT_TRUE(node_.ClockTick(MakeClock(0, c, 0, 1)).ok());
  }
  EXPECT_EQ(PullNow(&node_, 0, 5, {1}), std::vector<float>{0.0f});
}

TEST_F(ServerNodeTest, SetConsistencyChangesTauAndReleasesWaits) {
  Configure(1, 2, proto::MODE_SSP, /*tau=*/0);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  auto p = StartPull(&node_, 0, 1, {1});
  EXPECT_FALSE(p->done());
  proto::ConsistencyConfig c;
  c.set_mode(proto::MODE_SSP);
  c.set_tau(1);
  ASSERT_TRUE(node_.SetConsistency(c).ok());
  ASSERT_TRUE(p->done());
  EXPECT_TRUE(p->status.ok());
  c.set_mode(proto::MODE_BSP);
  EXPECT_EQ(node_.SetConsistency(c).code(), StatusCode::kFailedPrecondition);
  c.set_mode(proto::MODE_UNKNOWN);
  EXPECT_EQ(node_.SetConsistency(c).code(), StatusCode::kInvalidArgument);
}

TEST_F(ServerNodeTest, TickExpiresAWaitingPullAfterItsWait) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  auto p = StartPull(&node_, 0, 1, {4}, /*wait_ms=*/1000);
  node_.Tick();
  EXPECT_FALSE(p->done());
  clock_.Advance(absl::Milliseconds(999));
  node_.Tick();
  EXPECT_FALSE(p->done());
  clock_.Advance(absl::Milliseconds(2));
  node_.Tick();
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->calls, 1);
  EXPECT_EQ(p->status.code(), StatusCode::kDeadlineExceeded);
  // Answered once: a later clock does not call it again.
  ASSERT_TRUE(node_.ClockTick(MakeClock(1, 0, 0, 1)).ok());
  node_.Tick();
  EXPECT_EQ(p->calls, 1);
}

TEST_F(ServerNodeTest, CancelAllAnswersWaitingPulls) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  auto p = StartPull(&node_, 0, 1, {4});
  EXPECT_FALSE(p->done());
  node_.CancelAll(absl::OkStatus());
  ASSERT_TRUE(p->done());
  EXPECT_FALSE(p->status.ok()) << "a cancelled pull must not look answered";
}

// After CancelAll the server is going away: a pull that would wait, and a
// push, are refused at once with the closing status. (A pull admitted then
// waited for a clock nobody would tick, and its gRPC call held the server's
// Shutdown: a cancelled job's server once ran on for 120 s.)
TEST_F(ServerNodeTest, CancelAllRefusesLaterRequests) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  node_.CancelAll(absl::CancelledError("server shutting down"));
  auto p = StartPull(&node_, 0, 1, {4});
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->status.code(), absl::StatusCode::kCancelled) << p->status;
  EXPECT_EQ(PushNow(&node_, MakePush(1, 1, 0, {4}, {6}, 3)).code(),
            absl::StatusCode::kCancelled);
}

TEST_F(ServerNodeTest, FinishedWorkerReleasesOthersInBsp) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {4}, {6}, 3)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 1, 3)).ok());
  auto p = StartPull(&node_, 0, 1, {4});
  EXPECT_FALSE(p->done());
  // Worker 1 ran out of data before clock 0.
  ASSERT_TRUE(node_.Finish(MakeFinish(1, 0)).ok());
  ASSERT_TRUE(p->done());
  ASSERT_TRUE(p->status.ok()) << p->status;
  // Clock 0 was applied with worker 0's examples only.
  EXPECT_EQ(p->values(), std::vector<float>{-2.0f});
  // And later clocks do not wait for it either.
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 1, {4}, {1}, 1)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 1, 1, 1)).ok());
  EXPECT_EQ(PullNow(&node_, 0, 2, {4}), std::vector<float>{-3.0f});
}

// SSP catch-up: a pull answer says how far the other workers still
// training have got here, so a straggler learns it with every pull.
TEST_F(ServerNodeTest, PullAnswerCarriesTheOtherWorkersLowestClock) {
  Configure(1, 3, proto::MODE_SSP, /*tau=*/8);
  for (int64_t c = 0; c < 5; ++c) {
    ASSERT_TRUE(node_.ClockTick(MakeClock(1, c, 0, 1)).ok());
  }
  for (int64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(node_.ClockTick(MakeClock(2, c, 0, 1)).ok());
  }
  auto p = StartPull(&node_, 0, 0, {4});
  ASSERT_TRUE(p->done());
  ASSERT_TRUE(p->status.ok()) << p->status;
  EXPECT_EQ(p->resp.others_min_clock(), 3);  // W[2]; W[0] is the asker
  auto q = StartPull(&node_, 2, 3, {4});
  ASSERT_TRUE(q->done());
  EXPECT_EQ(q->resp.others_min_clock(), 0);  // W[0] completed none
  // A finished worker no longer counts.
  ASSERT_TRUE(node_.Finish(MakeFinish(2, 3)).ok());
  auto r = StartPull(&node_, 0, 0, {4});
  ASSERT_TRUE(r->done());
  EXPECT_EQ(r->resp.others_min_clock(), 5);
}

// SSP catch-up watch (PullRequest.others_at): held until every other worker
// still training completed that many clocks, whatever the asker's own clock
// and tau; answered with where they were then. Its wait ends it OK.
TEST_F(ServerNodeTest, CatchUpWatchWaitsForTheOthersNotTheBound) {
  Configure(1, 3, proto::MODE_SSP, /*tau=*/8);
  auto watch = [&](int worker, int64_t others_at, int64_t wait_ms) {
    auto p = std::make_unique<PendingPull>();
    p->req.set_worker_id(worker);
    p->req.set_clock(0);
    p->req.set_epoch(1);
    p->req.set_table(0);
    p->req.set_keys(Keys({4}));
    p->req.set_wait_ms(wait_ms);
    p->req.set_others_at(others_at);
    PendingPull* raw = p.get();
    node_.Pull(raw->req, &raw->resp, [raw](const absl::Status& s) {
      ++raw->calls;
      raw->status = s;
    });
    return p;
  };
  // W[0] completed nothing: a plain pull at its clock is answered at once,
  // the watch for 2 clocks of the others is held.
  auto w = watch(0, 2, 60000);
  EXPECT_FALSE(w->done());
  for (int64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(node_.ClockTick(MakeClock(1, c, 0, 1)).ok());
  }
  EXPECT_FALSE(w->done());  // W[2] still at 0
  ASSERT_TRUE(node_.ClockTick(MakeClock(2, 0, 0, 1)).ok());
  EXPECT_FALSE(w->done());
  ASSERT_TRUE(node_.ClockTick(MakeClock(2, 1, 0, 1)).ok());
  ASSERT_TRUE(w->done());
  ASSERT_TRUE(w->status.ok()) << w->status;
  EXPECT_EQ(w->resp.others_min_clock(), 2);  // as answered, not as asked
  EXPECT_EQ(w->values(), std::vector<float>{0.0f});

  // Nobody gets ahead: the wait answers it, OK, with where they are.
  auto idle = watch(0, 10, 500);
  node_.Tick();
  EXPECT_FALSE(idle->done());
  clock_.Advance(absl::Milliseconds(600));
  node_.Tick();
  ASSERT_TRUE(idle->done());
  EXPECT_TRUE(idle->status.ok()) << idle->status;
  EXPECT_EQ(idle->resp.others_min_clock(), 2);
  EXPECT_EQ(idle->resp.vals().size(), sizeof(float));

  // The watcher finishing releases its watch.
  auto last = watch(0, 10, 60000);
  EXPECT_FALSE(last->done());
  ASSERT_TRUE(node_.Finish(MakeFinish(0, 0)).ok());
  ASSERT_TRUE(last->done());
  EXPECT_TRUE(last->status.ok()) << last->status;
}

TEST_F(ServerNodeTest, FinishWaitsForTheWorkersOwnClocks) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  auto p = StartPull(&node_, 0, 1, {4});
  // Worker 1 says it did 1 clock, but its ClockTick has not arrived.
  ASSERT_TRUE(node_.Finish(MakeFinish(1, 1)).ok());
  EXPECT_FALSE(p->done());
  ASSERT_TRUE(node_.ClockTick(MakeClock(1, 0, 0, 1)).ok());
  ASSERT_TRUE(p->done());
  EXPECT_TRUE(p->status.ok());
}

TEST_F(ServerNodeTest, ClockWaitsForAllAnnouncedPushes) {
  Configure(1, 1, proto::MODE_SSP, /*tau=*/0);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {2}, {1}, 1)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, /*pushes=*/2, 2)).ok());
  auto p = StartPull(&node_, 0, 1, {2});
  EXPECT_FALSE(p->done()) << "the second push of clock 0 is missing";
  EXPECT_EQ(node_.Status().worker_clocks(0), 0);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 0, {2}, {1}, 1)).ok());
  ASSERT_TRUE(p->done());
  ASSERT_TRUE(p->status.ok()) << p->status;
  EXPECT_EQ(p->values(), std::vector<float>{-2.0f});
  EXPECT_EQ(node_.Status().worker_clocks(0), 1);
}

TEST_F(ServerNodeTest, BspClockArrivingBeforeItsPushes) {
  Configure(1, 1, proto::MODE_BSP);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, /*pushes=*/2, 4)).ok());
  auto p = StartPull(&node_, 0, 1, {2});
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 0, {2}, {1}, 2)).ok());
  EXPECT_FALSE(p->done());
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {2}, {3}, 2)).ok());
  ASSERT_TRUE(p->done());
  ASSERT_TRUE(p->status.ok()) << p->status;
  EXPECT_EQ(p->values(), std::vector<float>{-1.0f});  // (1 + 3) / 4
}

// PushAndClock: the clock rides on the push and is processed after it.
TEST_F(ServerNodeTest, PushCarryingItsClockEndsTheClock) {
  Configure(1, 2, proto::MODE_BSP);
  proto::PushRequest a = MakePush(0, 1, 0, {2}, {1}, 2);
  *a.mutable_end_clock() = MakeClock(0, 0, /*pushes=*/1, 2);
  ASSERT_TRUE(PushNow(&node_, a).ok());
  auto p = StartPull(&node_, 0, 1, {2});
  EXPECT_FALSE(p->done()) << "worker 1 has not completed clock 0";
  // A resend after a lost answer: the push is a duplicate, the clock a
  // replay, and nothing moves twice.
  proto::PushResponse r;
  ASSERT_TRUE(PushNow(&node_, a, &r).ok());
  EXPECT_TRUE(r.duplicate());
  proto::PushRequest b = MakePush(1, 1, 0, {2}, {3}, 2);
  *b.mutable_end_clock() = MakeClock(1, 0, /*pushes=*/1, 2);
  ASSERT_TRUE(PushNow(&node_, b).ok());
  ASSERT_TRUE(p->done());
  ASSERT_TRUE(p->status.ok()) << p->status;
  // Answered only once both clocks were processed: (1 + 3) / 4.
  EXPECT_EQ(p->values(), std::vector<float>{-1.0f});
  // A push may end only its own worker's clock.
  proto::PushRequest c = MakePush(0, 2, 1, {2}, {1}, 1);
  *c.mutable_end_clock() = MakeClock(1, 1, 1, 1);
  EXPECT_EQ(PushNow(&node_, c).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(node_.Status().worker_clocks(1), 1);
}

// Issue 9: a BSP push made while its range had a backup, whose last backup
// then fails over (no backup left), is answered once nothing is left to
// acknowledge it. With replication after aggregation (replicate_deltas
// false) it waits for its clock's sum, so it is answered when the clock
// applies; before, it waited for the next view, and a BSP job stalled until
// a pull's wait expired (2 minutes) after its last backup's failover. By
// deltas (the default) it waits for the delta holding it buffered, so it is
// answered at the failover. Either way its clock applies once, when the
// other worker completes it.
class BspPushWithoutBackupsTest : public ServerNodeTest,
                                  public ::testing::WithParamInterface<bool> {};

TEST_P(BspPushWithoutBackupsTest, AnsweredOnceNothingIsLeftToAcknowledgeIt) {
  const bool deltas = GetParam();
  node_.SetReplicationDeltas(deltas);
  // S[1] (this node) owns every range; S[0], the backup, never answers
  // (this node has no peers).
  proto::ClusterView v = MakeView(2, 2, proto::MODE_BSP);
  SetEveryChain(&v, 1, 1, 0);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  proto::PushRequest b = MakePush(1, 1, 0, {2}, {3}, 2);
  *b.mutable_end_clock() = MakeClock(1, 0, /*pushes=*/1, 2);
  proto::PushResponse br;
  int answers = 0;
  absl::Status answer = absl::UnknownError("not answered");
  node_.Push(b, &br, [&](const absl::Status& s) {
    ++answers;
    answer = s;
  });
  clock_.RunDue();
  EXPECT_EQ(answers, 0) << (deltas ? "answered before any backup holds it"
                                   : "W[0] has not completed clock 0");
  // S[0] fails over: S[1] keeps every range, with no backup.
  SetEveryChain(&v, 2, 1, -1);
  v.mutable_routing()->mutable_servers(0)->set_state(proto::NODE_DEAD);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  clock_.RunDue();
  EXPECT_EQ(answers, deltas ? 1 : 0)
      << (deltas ? "nothing left to acknowledge it"
                 : "clock 0 is not applied yet");
  proto::PushRequest a = MakePush(0, 1, 0, {2}, {1}, 2, /*epoch=*/2);
  *a.mutable_end_clock() = MakeClock(0, 0, /*pushes=*/1, 2);
  a.mutable_end_clock()->set_epoch(2);
  ASSERT_TRUE(PushNow(&node_, a).ok());
  clock_.RunDue();
  EXPECT_EQ(answers, 1);
  EXPECT_TRUE(answer.ok()) << answer;
  // The clock was applied once: (1 + 3) / 4.
  auto p = StartPull(&node_, 0, 1, {2}, 60000, /*epoch=*/2);
  ASSERT_TRUE(p->done());
  ASSERT_TRUE(p->status.ok()) << p->status;
  EXPECT_EQ(p->values(), std::vector<float>{-1.0f});
}

INSTANTIATE_TEST_SUITE_P(Replication, BspPushWithoutBackupsTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "ByDeltas" : "AfterAggregation";
                         });

// A push whose update would overflow a weight is answered OK with those
// elements left as they were (optimizer.h); the server counts them and
// warns, once per 30 s at most while the count grows.
TEST_F(ServerNodeTest, UpdatesThatWouldNotBeFiniteAreCountedAndLogged) {
  std::ostringstream logged;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(logged)));
  Configure(1, 1, proto::MODE_ASP);
  // sgd, lr 1, one example: w = -3e38, then -6e38 would be -inf.
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {1, 2}, {3e38f, 1}, 1)).ok());
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 0, {1, 2}, {3e38f, 1}, 1)).ok());
  EXPECT_EQ(PullNow(&node_, 0, 0, {1, 2}),
            (std::vector<float>{-3e38f, -2.0f}));
  EXPECT_EQ(node_.Status().non_finite_updates(), 1);
  node_.Tick();
  const std::string first = logged.str();
  EXPECT_NE(first.find("table 0: 1 value elements were not updated"),
            std::string::npos)
      << first;
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 3, 0, {1}, {3e38f}, 1)).ok());
  clock_.Advance(absl::Seconds(5));
  node_.Tick();
  EXPECT_EQ(logged.str(), first) << "warned again within 30 s";
  clock_.Advance(absl::Seconds(26));
  node_.Tick();
  EXPECT_NE(logged.str().find("1 value elements were not updated (now 2 "),
            std::string::npos)
      << logged.str();
  spdlog::set_default_logger(previous);
}

// An answer that waits for its replication for 30 s (a backup that stays
// silent without being failed over, or a bug such as the BSP one above)
// is logged with what it waits for, at most once per 30 s: a worker sees
// only a server that answers its status but not its push.
TEST_F(ServerNodeTest, AnswerStuckWaitingForItsReplicationIsLogged) {
  std::ostringstream logged;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(logged)));
  // S[1] (this node) owns every range; S[0], the backup, never answers
  // (this node has no peers).
  proto::ClusterView v = MakeView(2, 1, proto::MODE_ASP);
  SetEveryChain(&v, 1, 1, 0);
  ASSERT_TRUE(node_.Configure(1, v).ok());
  proto::PushRequest a = MakePush(0, 1, 0, {42}, {1}, 1);
  proto::PushResponse ar;
  int answers = 0;
  node_.Push(a, &ar, [&](const absl::Status&) { ++answers; });
  clock_.Advance(absl::Seconds(29));
  node_.Tick();
  EXPECT_EQ(logged.str(), "");
  clock_.Advance(absl::Seconds(2));
  node_.Tick();
  const std::string first = logged.str();
  EXPECT_NE(first.find("S[1] epoch 1: an answer has waited 31s for its "
                       "replication (1 waiting): range "),
            std::string::npos)
      << first;
  EXPECT_NE(first.find("index 1, acked by { S[0]: 0 }"), std::string::npos)
      << first;
  clock_.Advance(absl::Seconds(10));
  node_.Tick();
  EXPECT_EQ(logged.str(), first) << "warned again within 30 s";
  clock_.Advance(absl::Seconds(21));
  node_.Tick();
  EXPECT_NE(logged.str().find("waited 1m2s"), std::string::npos)
      << logged.str();
  EXPECT_EQ(answers, 0);
  node_.CancelAll(absl::CancelledError("the test is over"));
  EXPECT_EQ(answers, 1);
  spdlog::set_default_logger(previous);
}

// A worker that names at most key_lists lists at a time gets no more of
// them kept: older lists go, least recently used first, and the newest
// still serve by name.
TEST_F(ServerNodeTest, KeepsNoMoreListsThanTheWorkerNames) {
  Configure(1, 1, proto::MODE_ASP);
  for (uint64_t list = 1; list <= 6; ++list) {
    proto::PushRequest a =
        MakePush(0, static_cast<int64_t>(list), 0, {2, 7}, {1, 2}, 1);
    a.set_key_list(list);
    a.set_key_lists(2);
    ASSERT_TRUE(PushNow(&node_, a).ok());
  }
  EXPECT_EQ(node_.key_cache().lists_of(0), 2u);
  proto::PushRequest b = MakePush(0, 7, 0, {}, {1, 2}, 1);
  b.set_num_keys(2);
  b.set_key_lists(2);
  for (uint64_t list : {5, 6}) {
    b.set_key_list(list);
    EXPECT_TRUE(PushNow(&node_, b).ok()) << "list " << list;
    b.set_seq(b.seq() + 1);
  }
  b.set_key_list(4);
  absl::Status gone = PushNow(&node_, b);
  EXPECT_EQ(ReasonOf(gone), proto::REASON_KEYS_NOT_CACHED) << gone;
}

// A list kept for a table other than 0 by a push that resolved no slots (in
// BSP a push is only buffered until its clock completes) keeps its table: a
// later push or pull naming it was refused as another table's list (the
// server fuzz target found this, 2026-12-03).
TEST_F(ServerNodeTest, ListKeptUnresolvedKeepsItsTable) {
  proto::ClusterView v = MakeView(1, 1, proto::MODE_BSP);
  proto::TableConfig* t = v.add_tables();
  t->set_id(1);
  t->set_name("second");
  t->set_dim(1);
  t->mutable_optimizer()->set_name("sgd");
  t->mutable_optimizer()->set_learning_rate(1.0f);
  ASSERT_TRUE(node_.Configure(0, v).ok());
  proto::PushRequest a = MakePush(0, 1, 0, {2, 7}, {1, 2}, 1);
  a.set_table(1);
  a.set_key_list(5);
  ASSERT_TRUE(PushNow(&node_, a).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 1, 1, 1)).ok());
  proto::PushRequest b = MakePush(0, 2, 1, {}, {1, 2}, 1);
  b.set_table(1);
  b.set_key_list(5);
  b.set_num_keys(2);
  ASSERT_TRUE(PushNow(&node_, b).ok()) << "by the list kept for table 1";
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 1, 1, 1, 2)).ok());
  auto p = StartPull(&node_, 0, 2, {});
  ASSERT_TRUE(p->done());
  p->req.set_table(1);
  p->req.set_key_list(5);
  p->req.set_num_keys(2);
  proto::PullResponse r;
  absl::Status st = absl::InternalError("not called");
  node_.Pull(p->req, &r, [&](const absl::Status& s) { st = s; });
  ASSERT_TRUE(st.ok()) << st;
  absl::Span<const float> got = ViewAs<float>(r.vals());
  EXPECT_EQ(std::vector<float>(got.begin(), got.end()),
            (std::vector<float>{-2.0f, -4.0f}));
}

// Key caching: a list kept under a name serves later pushes and pulls that
// name it, exactly as their keys would.
TEST_F(ServerNodeTest, NamedKeyListWorksAsItsKeys) {
  Configure(1, 1, proto::MODE_ASP);
  proto::PushRequest a = MakePush(0, 1, 0, {2, 7}, {1, 2}, 1);
  a.set_key_list(5);
  ASSERT_TRUE(PushNow(&node_, a).ok());
  proto::PushRequest b = MakePush(0, 2, 0, {}, {1, 2}, 1);
  b.set_key_list(5);
  b.set_num_keys(2);
  ASSERT_TRUE(PushNow(&node_, b).ok());  // by the kept slots
  auto p = StartPull(&node_, 0, 0, {});
  ASSERT_TRUE(p->done());
  p->req.set_key_list(5);
  p->req.set_num_keys(2);
  proto::PullResponse r;
  absl::Status st = absl::InternalError("not called");
  node_.Pull(p->req, &r, [&](const absl::Status& s) { st = s; });
  ASSERT_TRUE(st.ok()) << st;
  absl::Span<const float> v = ViewAs<float>(r.vals());
  EXPECT_EQ(std::vector<float>(v.begin(), v.end()),
            (std::vector<float>{-2.0f, -4.0f}));
  EXPECT_EQ(PullNow(&node_, 0, 0, {2, 7}), (std::vector<float>{-2.0f, -4.0f}));
  // Not kept: resend with keys. Another size or table: a client bug.
  b.set_key_list(6);
  b.set_seq(3);
  absl::Status miss = PushNow(&node_, b);
  EXPECT_EQ(miss.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(miss), proto::REASON_KEYS_NOT_CACHED);
  b.set_key_list(5);
  b.set_num_keys(3);
  b.set_vals(Vals({1, 2, 3}));
  EXPECT_EQ(PushNow(&node_, b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PullNow(&node_, 0, 0, {2, 7}), (std::vector<float>{-2.0f, -4.0f}))
      << "nothing applied by the refused pushes";
  // The metrics count the named requests: found (b, the pull, b with three
  // keys) and not (list 6).
  ExpositionWriter w;
  WriteServerMetrics(node_, &w);
  const std::string text = w.Take();
  EXPECT_NE(text.find("\nps_server_key_cache_hits_total 3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nps_server_key_cache_misses_total 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("\nps_server_key_cache_lists 1\n"), std::string::npos);
}

// A list first named by a pull that did not find all its keys is kept with
// those keys unresolved: its pushes create them (only a list every key of
// which has a slot skips PushSlots' bounds check).
TEST_F(ServerNodeTest, ListNamedByAPullOfNewKeysCreatesThemOnPush) {
  Configure(1, 1, proto::MODE_ASP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {2}, {1}, 1)).ok());
  auto p = StartPull(&node_, 0, 0, {});
  ASSERT_TRUE(p->done());
  PackTo<uint64_t>(p->req.mutable_keys(), std::vector<uint64_t>{2, 7});
  p->req.set_key_list(5);
  proto::PullResponse r;
  absl::Status st = absl::InternalError("not called");
  node_.Pull(p->req, &r, [&](const absl::Status& s) { st = s; });
  ASSERT_TRUE(st.ok()) << st;
  absl::Span<const float> v = ViewAs<float>(r.vals());
  EXPECT_EQ(std::vector<float>(v.begin(), v.end()),
            (std::vector<float>{-1.0f, 0.0f}));
  proto::PushRequest b = MakePush(0, 2, 0, {}, {1, 2}, 1);
  b.set_key_list(5);
  b.set_num_keys(2);
  ASSERT_TRUE(PushNow(&node_, b).ok());  // creates 7
  EXPECT_EQ(PullNow(&node_, 0, 0, {2, 7}), (std::vector<float>{-2.0f, -2.0f}));
  b.set_seq(3);
  ASSERT_TRUE(PushNow(&node_, b).ok());  // finds it
  EXPECT_EQ(PullNow(&node_, 0, 0, {2, 7}), (std::vector<float>{-3.0f, -4.0f}));
}

// A kept list's runs are marked consecutive when their keys were made in
// order by one push (a cached push then reads no slot but the first), and
// not when its keys are another list's with new ones among them; both push
// by name exactly as by keys.
TEST_F(ServerNodeTest, KeptListsMarkConsecutiveSlotsOnlyWhereTheyAre) {
  Configure(1, 1, proto::MODE_ASP);
  std::vector<uint64_t> evens, all;
  for (uint64_t k = 1; k <= 400; ++k) {
    all.push_back(k);
    if (k % 2 == 0) evens.push_back(k);
  }
  std::map<uint64_t, float> want;  // sgd, lr 1: minus the sum of gradients
  uint64_t seq = 0;
  auto push = [&](uint64_t list, const std::vector<uint64_t>& keys,
                  bool by_name) {
    std::vector<float> g(keys.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = static_cast<float>((keys[i] * 7 + seq) % 13) - 6.0f;
      want[keys[i]] -= g[i];
    }
    proto::PushRequest r =
        MakePush(0, static_cast<int64_t>(++seq), 0,
                 by_name ? std::vector<uint64_t>{} : keys, g, 1);
    r.set_key_list(list);
    r.set_num_keys(static_cast<uint32_t>(keys.size()));
    ASSERT_TRUE(PushNow(&node_, r).ok()) << "list " << list;
  };
  push(1, evens, false);  // makes the evens, in order
  push(2, all, false);    // finds the evens, makes the odds after them
  auto consecutive = [&](uint64_t list) {
    std::shared_ptr<const KeyList> l = node_.key_cache().Peek(0, list);
    EXPECT_NE(l, nullptr);
    EXPECT_TRUE(l->complete);
    size_t marked = 0;
    for (uint8_t c : l->consecutive) marked += c;
    return std::make_pair(marked, l->runs.size());
  };
  const auto [evens_marked, evens_runs] = consecutive(1);
  EXPECT_EQ(evens_marked, evens_runs) << "made in order, one push";
  EXPECT_EQ(consecutive(2).first, 0u) << "evens' slots with odds' between";
  for (int round = 0; round < 3; ++round) {
    push(1, evens, true);
    push(2, all, true);
  }
  const std::vector<float> got = PullNow(&node_, 0, 0, all);
  ASSERT_EQ(got.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(got[i], want[all[i]]) << "key " << all[i];
  }
  EXPECT_TRUE(node_.CheckInvariants().ok());
}

// A push or pull large enough to be split across threads (by range) gives
// exactly what one thread gives, by keys and by a named (cached) list.
TEST(ServerNodeParallelTest, SplitApplyEqualsOneThread) {
  FakeClock clock;
  ServerNode serial(&clock, ServerLimits(), 1);
  ServerNode parallel(&clock, ServerLimits(), 3);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(100000);
  for (uint64_t& k : keys) k = rng();
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<float> grads(keys.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i] = static_cast<float>(static_cast<int>(i % 97) - 48) / 16.0f;
  }
  std::vector<std::vector<float>> pulled;
  for (ServerNode* node : {&serial, &parallel}) {
    // Eight ranges, 12k keys each: 6 parts of a push, 3 of a pull (each at
    // least kMinParallelApplyValues or kMinParallelPullValues), for 3
    // threads.
    ASSERT_TRUE(node->Configure(0, MakeView(1, 1, proto::MODE_ASP)).ok());
    proto::PushRequest a = MakePush(0, 1, 0, keys, grads, 1);
    a.set_key_list(9);
    ASSERT_TRUE(PushNow(node, a).ok());
    // By the slots the first push resolved and kept.
    proto::PushRequest b = MakePush(0, 2, 0, {}, grads, 4);
    b.set_key_list(9);
    b.set_num_keys(static_cast<uint32_t>(keys.size()));
    ASSERT_TRUE(PushNow(node, b).ok());
    pulled.push_back(PullNow(node, 0, 0, keys));
    auto p = StartPull(node, 0, 0, {});
    ASSERT_TRUE(p->done());
    p->req.set_key_list(9);
    p->req.set_num_keys(static_cast<uint32_t>(keys.size()));
    proto::PullResponse r;
    absl::Status st = absl::InternalError("not called");
    node->Pull(p->req, &r, [&](const absl::Status& s) { st = s; });
    ASSERT_TRUE(st.ok()) << st;
    absl::Span<const float> v = ViewAs<float>(r.vals());
    EXPECT_EQ(std::vector<float>(v.begin(), v.end()), pulled.back());
    EXPECT_TRUE(node->CheckInvariants().ok());
  }
  ASSERT_EQ(pulled[0].size(), keys.size());
  EXPECT_EQ(pulled[0], pulled[1]);
  // -g - g/4 per key (sgd, lr 1).
  EXPECT_EQ(pulled[0][5], -grads[5] - grads[5] / 4);
}

TEST(ServerNodeKeyCacheTest, BudgetZeroKeepsNothing) {
  FakeClock clock;
  ServerLimits limits;
  limits.key_cache_bytes = 0;
  ServerNode node(&clock, limits);
  ASSERT_TRUE(node.Configure(0, MakeView(1, 1, proto::MODE_ASP)).ok());
  proto::PushRequest a = MakePush(0, 1, 0, {2}, {1}, 1);
  a.set_key_list(5);
  ASSERT_TRUE(PushNow(&node, a).ok());
  proto::PushRequest b = MakePush(0, 2, 0, {}, {1}, 1);
  b.set_key_list(5);
  b.set_num_keys(1);
  EXPECT_EQ(ReasonOf(PushNow(&node, b)), proto::REASON_KEYS_NOT_CACHED);
}

TEST_F(ServerNodeTest, SettledSeqBoundsDedupState) {
  Configure(1, 1, proto::MODE_ASP);
  for (uint64_t seq : {1, 2, 5}) {
    ASSERT_TRUE(PushNow(&node_, MakePush(0, seq, 0, {1}, {1}, 1)).ok());
  }
  // The worker says every seq <= 4 has its final answer (3 and 4 were
  // rejected and resent under new seqs, say): the server forgets them.
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 3, 3, /*settled=*/4)).ok());
  for (uint64_t seq : {1, 3, 4, 5}) {
    proto::PushResponse r;
    ASSERT_TRUE(PushNow(&node_, MakePush(0, seq, 1, {1}, {1}, 1), &r).ok());
    EXPECT_TRUE(r.duplicate()) << "seq " << seq;
  }
  // A settled_seq below the watermark changes nothing.
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 1, 0, 1, /*settled=*/2)).ok());
  proto::PushResponse r;
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 6, 2, {1}, {1}, 1), &r).ok());
  EXPECT_FALSE(r.duplicate());
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 6, 2, {1}, {1}, 1), &r).ok());
  EXPECT_TRUE(r.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 2, {1}), std::vector<float>{-4.0f});
  EXPECT_EQ(node_.Status().pushes(), 4);
}

TEST_F(ServerNodeTest, NewViewWithDeadWorkerReleasesBsp) {
  Configure(1, 2, proto::MODE_BSP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {4}, {2}, 2)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 1, 2)).ok());
  auto p = StartPull(&node_, 0, 1, {4});
  EXPECT_FALSE(p->done());
  proto::ClusterView v = MakeView(1, 2, proto::MODE_BSP, 0, /*epoch=*/2);
  v.mutable_workers(1)->set_state(proto::NODE_DEAD);
  ASSERT_TRUE(node_.Configure(0, v).ok());
  EXPECT_EQ(node_.epoch(), 2);
  ASSERT_TRUE(p->done());
  // The pull was sliced with epoch 1; its wait was admitted before the
  // change, so it is answered.
  EXPECT_TRUE(p->status.ok()) << p->status;
  EXPECT_EQ(p->values(), std::vector<float>{-1.0f});
  // Requests with the old epoch are now stale.
  EXPECT_TRUE(IsStaleEpoch(PushNow(&node_, MakePush(0, 2, 1, {4}, {1}, 1))));
  // An older view, told late, changes nothing (OK: the newer one it
  // already has holds everything the older one does).
  EXPECT_TRUE(node_.Configure(0, MakeView(1, 2, proto::MODE_BSP)).ok());
  EXPECT_EQ(node_.epoch(), 2);
  EXPECT_TRUE(IsStaleEpoch(PushNow(&node_, MakePush(0, 2, 1, {4}, {1}, 1))));
}

// Issue 9: a worker declared dead had its work units handed to the others;
// if it was only hung or cut off, what it sends at the new epoch (having
// caught up with the view) must not be applied on top of their redoing.
// Its pushes are refused (FAILED_PRECONDITION, not a stale epoch it would
// resend on); a replay of one applied before is still a duplicate; the
// live worker is unaffected.
TEST_F(ServerNodeTest, PushesOfADeadWorkerAreRefused) {
  Configure(1, 2, proto::MODE_ASP);
  ASSERT_TRUE(PushNow(&node_, MakePush(1, 1, 0, {4}, {2}, 1)).ok());
  proto::ClusterView v = MakeView(1, 2, proto::MODE_ASP, 0, /*epoch=*/2);
  v.mutable_workers(1)->set_state(proto::NODE_DEAD);
  ASSERT_TRUE(node_.Configure(0, v).ok());
  absl::Status s = PushNow(&node_, MakePush(1, 2, 0, {4}, {5}, 1, 2));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_FALSE(IsStaleEpoch(s));
  EXPECT_NE(s.message().find("declared dead"), std::string::npos) << s;
  proto::PushResponse r;
  ASSERT_TRUE(PushNow(&node_, MakePush(1, 1, 0, {4}, {2}, 1, 2), &r).ok());
  EXPECT_TRUE(r.duplicate());
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {4}, {1}, 1, 2)).ok());
  // Only the dead worker's first push and the live one's are in the value.
  auto p = StartPull(&node_, 0, 0, {4}, 60000, /*epoch=*/2);
  ASSERT_TRUE(p->done() && p->status.ok()) << p->status;
  EXPECT_EQ(p->values(), std::vector<float>{-3.0f});
}

// Bug (server_node.cc, Configure): a newer view's consistency section is
// ignored, although the header says a later Configure "replaces routing and
// consistency settings". Enable once Configure applies it.
TEST_F(ServerNodeTest, NewViewReplacesConsistency) {
  Configure(1, 2, proto::MODE_SSP, /*tau=*/0);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  ASSERT_TRUE(node_
                  .Configure(0, MakeView(1, 2, proto::MODE_SSP, /*tau=*/1,
                                         /*epoch=*/2))
                  .ok());
  // With tau 1, worker 0 at clock 1 need not wait for worker 1 at 0.
  auto p = StartPull(&node_, 0, 1, {4}, 60000, /*epoch=*/2);
  EXPECT_TRUE(p->done());
}

TEST_F(ServerNodeTest, SaveModelWritesBinaryShard) {
  Configure(1, 1, proto::MODE_ASP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {3, 8}, {1, 0}, 1)).ok());
  const std::string dir = ::testing::TempDir() + "/server_node_test_model";
  proto::ServerControlResponse resp;
  ASSERT_TRUE(node_.SaveModel(dir, &resp).ok());
  EXPECT_EQ(resp.keys(), 2);
  EXPECT_EQ(resp.nonzeros(), 1);
  auto loaded = Table::LoadBinary(dir + "/table-0.server-0.bin");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].first, 3u);
  EXPECT_EQ((*loaded)[0].second, std::vector<float>{-1.0f});
  EXPECT_EQ((*loaded)[1].second, std::vector<float>{0.0f});
}

// Issue 12 (early stopping): the copy KeepModelCopy kept is what a save
// from the copy writes, whatever was pushed since; without a copy nothing
// is saved from one.
TEST_F(ServerNodeTest, KeptModelCopyIsSavedAsItWas) {
  Configure(1, 1, proto::MODE_ASP);
  proto::ServerControlResponse none;
  ASSERT_TRUE(node_.SaveKeptCopy(&none).ok());
  EXPECT_FALSE(none.saved_kept_copy());
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {3, 8}, {1, 0}, 1)).ok());
  node_.KeepModelCopy();
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 0, {3, 9}, {1, 1}, 1)).ok());
  const std::string dir = ::testing::TempDir() + "/server_node_test_copy";
  proto::ServerControlResponse resp;
  ASSERT_TRUE(node_.SaveModel(dir, &resp, /*kept_copy=*/true).ok());
  EXPECT_TRUE(resp.saved_kept_copy());
  EXPECT_EQ(resp.keys(), 2);  // key 9 came after the copy
  EXPECT_EQ(resp.nonzeros(), 1);
  auto loaded = Table::LoadBinary(dir + "/table-0.server-0.bin");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].first, 3u);
  EXPECT_EQ((*loaded)[0].second, std::vector<float>{-1.0f});  // not -2
  proto::ServerControlResponse live;
  ASSERT_TRUE(node_.SaveModel(dir, &live).ok());
  EXPECT_FALSE(live.saved_kept_copy());
  EXPECT_EQ(live.keys(), 3);
}

// Issue 8: "a full disk leaves a partial model". A save that fails on its
// second table leaves no file of the first behind, and says which file.
TEST_F(ServerNodeTest, RegressionFullDiskLeavesPartialModel) {
  Configure(1, 1, proto::MODE_ASP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {3, 8}, {1, 0}, 1)).ok());
  const std::string dir =
      ::testing::TempDir() + "/server_node_test_partial_model";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The text file's temporary name is taken by a folder: the write fails
  // after the binary file was complete.
  std::filesystem::create_directories(dir + "/table-0.server-0.txt.partial.tmp");
  proto::ServerControlResponse resp;
  absl::Status s = node_.SaveModel(dir, &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("table-0.server-0.txt"), std::string::npos) << s;
  EXPECT_NE(s.message().find("no file of it kept"), std::string::npos) << s;
  std::filesystem::remove_all(dir + "/table-0.server-0.txt.partial.tmp");
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    left.push_back(e.path().filename().string());
  }
  EXPECT_TRUE(left.empty()) << left.size() << " file(s) left, e.g. "
                            << (left.empty() ? "" : left[0]);

  // Once the obstacle is gone the same save succeeds and leaves only the
  // final files.
  ASSERT_TRUE(node_.SaveModel(dir, &resp).ok());
  left.clear();
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"table-0.server-0.bin",
                                            "table-0.server-0.txt"}));
  std::filesystem::remove_all(dir);
}

// ---- Limits and hostile input (issue 8, item 7) ----

// Regression: one Clock with settled_seq = 2^64-1 made every later push of
// that worker look like a replay and be dropped.
TEST_F(ServerNodeTest, HugeSettledSeqDoesNotDropLaterPushes) {
  Configure(1, 1, proto::MODE_ASP);
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {1}, {1}, 1)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 1, 1,
                                        std::numeric_limits<uint64_t>::max()))
                  .ok());
  proto::PushResponse r;
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 2, 1, {1}, {1}, 1), &r).ok());
  EXPECT_FALSE(r.duplicate()) << "a push the server never saw was dropped";
  // Seq 1 was received, so it is settled and stays a replay.
  ASSERT_TRUE(PushNow(&node_, MakePush(0, 1, 1, {1}, {1}, 1), &r).ok());
  EXPECT_TRUE(r.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 1, {1}), std::vector<float>{-2.0f});
}

// Regression: NaN/Inf gradients were applied and poisoned the weights.
TEST_F(ServerNodeTest, NonFiniteGradientIsRejectedAndCounted) {
  Configure(1, 1, proto::MODE_ASP);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    absl::Status s = PushNow(&node_, MakePush(0, 1, 0, {1, 2}, {1, bad}, 1));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(ReasonOf(s), proto::REASON_NON_FINITE) << s;
  }
  EXPECT_EQ(node_.Status().non_finite_pushes(), 3);
  EXPECT_EQ(node_.Status().pushes(), 0);
  EXPECT_EQ(PullNow(&node_, 0, 0, {1, 2}), (std::vector<float>{0.0f, 0.0f}));
  // The same seq with finite values is still accepted (never marked seen).
  EXPECT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {1, 2}, {1, 1}, 1)).ok());
  // Wherever the bad value sits in a longer push (the check reads 16
  // values at a time, then the rest one by one); the largest finite values
  // and subnormals pass.
  std::vector<uint64_t> keys(37);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 100 + i;
  for (size_t at : {0, 5, 15, 16, 31, 32, 36}) {
    std::vector<float> g(keys.size(), std::numeric_limits<float>::max());
    g[3] = std::numeric_limits<float>::denorm_min();
    g[at] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(ReasonOf(PushNow(&node_, MakePush(0, 2, 0, keys, g, 1))),
              proto::REASON_NON_FINITE)
        << "NaN at " << at;
  }
  std::vector<float> fine(keys.size(), -std::numeric_limits<float>::max());
  EXPECT_TRUE(PushNow(&node_, MakePush(0, 2, 0, keys, fine, 1)).ok());
}

// A large push's values are checked in parts on the apply threads: a NaN
// in any part, at its ends included, is refused with nothing applied.
TEST(ServerNodeParallelTest, NonFiniteValueInAnyPartIsRejected) {
  FakeClock clock;
  ServerNode node(&clock, ServerLimits(), 3);
  ASSERT_TRUE(node.Configure(0, MakeView(1, 1, proto::MODE_ASP)).ok());
  std::vector<uint64_t> keys(300000);  // 1.2 MB of values: 4 parts
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + i;
  const size_t n = keys.size();
  for (size_t at : {size_t{0}, n / 4 - 1, n / 4, n / 2, n - 1}) {
    std::vector<float> g(n, 1.0f);
    g[at] = std::numeric_limits<float>::infinity();
    absl::Status s = PushNow(&node, MakePush(0, 1, 0, keys, g, 1));
    EXPECT_EQ(ReasonOf(s), proto::REASON_NON_FINITE) << "inf at " << at;
  }
  EXPECT_EQ(node.Status().pushes(), 0);
  std::vector<float> fine(n, 1.0f);
  EXPECT_TRUE(PushNow(&node, MakePush(0, 1, 0, keys, fine, 1)).ok());
  EXPECT_EQ(PullNow(&node, 0, 0, {keys[0], keys[n - 1]}),
            (std::vector<float>{-1.0f, -1.0f}));
}

// A push of a dense table's long rows to one range has each row updated
// in parts by the apply threads (Table::Push's `rows`): every element gets
// its update once, whatever part it falls in; a push with a NaN in any
// part changes nothing.
TEST(ServerNodeParallelTest, LongRowOfOneRangeIsUpdatedWhole) {
  FakeClock clock;
  ServerNode node(&clock, ServerLimits(), 3);
  proto::ClusterView v = MakeView(1, 1, proto::MODE_ASP);
  const size_t dim = Table::kParallelRowFloats * 2 + 21;
  v.mutable_tables(0)->set_dim(static_cast<int>(dim));
  ASSERT_TRUE(node.Configure(0, v).ok());
  const std::vector<uint64_t> keys = {7, 8};  // one range (ring of 1)
  std::vector<float> g(2 * dim);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(i % 1000) / 8.0f;  // exact in binary
  }
  ASSERT_TRUE(PushNow(&node, MakePush(0, 1, 0, keys, g, 1)).ok());
  std::vector<float> bad = g;
  bad[dim + dim / 2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ReasonOf(PushNow(&node, MakePush(0, 2, 0, keys, bad, 1))),
            proto::REASON_NON_FINITE);
  ASSERT_TRUE(PushNow(&node, MakePush(0, 2, 0, keys, g, 1)).ok());
  const std::vector<float> got = PullNow(&node, 0, 0, keys);
  ASSERT_EQ(got.size(), g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(got[i], -2.0f * g[i]) << "element " << i;
  }
}

// A dense push of one range by a current client (segments) has its values
// checked by the table as it applies them (Table::ChecksFiniteWhileApplying,
// where the CPU has AVX2 or AVX-512): refused whole, as when checked first, and
// its seq withdrawn, so that a resend is refused again (never answered as a
// duplicate) and the same seq with finite values is applied.
TEST(ServerNodeParallelTest, DensePushCheckedByItsApplyIsRefusedWhole) {
  for (const size_t dim : {size_t{300}, Table::kParallelRowFloats * 2 + 21}) {
    SCOPED_TRACE(absl::StrCat("dim ", dim));
    FakeClock clock;
    ServerNode node(&clock, ServerLimits(), 3);
    proto::ClusterView v = MakeView(1, 1, proto::MODE_ASP);
    v.mutable_tables(0)->set_dim(static_cast<int>(dim));
    ASSERT_TRUE(node.Configure(0, v).ok());
    const Routing routing = *Routing::FromProto(v.routing());
    const std::vector<uint64_t> keys = {7, 8};
    ASSERT_EQ(routing.RangeOf(7), routing.RangeOf(8));
    auto push = [&](uint64_t seq, const std::vector<float>& g,
                    proto::PushResponse* resp = nullptr) {
      proto::PushRequest r = MakePush(0, seq, 0, keys, g, 1);
      proto::PushSegment* seg = r.add_segments();
      seg->set_range(routing.RangeOf(7));
      seg->set_seq(seq);
      seg->set_num_keys(2);
      return PushNow(&node, r, resp);
    };
    std::vector<float> g(2 * dim);
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = static_cast<float>(i % 1000) / 8.0f;  // exact in binary
    }
    auto expect_times = [&](float times) {
      const std::vector<float> got = PullNow(&node, 0, 0, keys);
      ASSERT_EQ(got.size(), g.size());
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_EQ(got[i], -times * g[i]) << "element " << i;
      }
    };
    ASSERT_TRUE(push(1, g).ok());
    for (size_t at : {size_t{0}, dim - 1, dim + dim / 2, 2 * dim - 1}) {
      std::vector<float> bad = g;
      bad[at] = std::numeric_limits<float>::quiet_NaN();
      for (int attempt = 0; attempt < 2; ++attempt) {  // then a resend
        absl::Status s = push(2, bad);
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(ReasonOf(s), proto::REASON_NON_FINITE)
            << "NaN at " << at << ": " << s;
      }
      expect_times(1.0f);
    }
    EXPECT_EQ(node.Status().non_finite_pushes(), 8);
    EXPECT_EQ(node.Status().pushes(), 1);
    proto::PushResponse resp;
    ASSERT_TRUE(push(2, g, &resp).ok());
    EXPECT_FALSE(resp.duplicate());
    expect_times(2.0f);
    resp.Clear();
    ASSERT_TRUE(push(2, g, &resp).ok());
    EXPECT_TRUE(resp.duplicate());
    expect_times(2.0f);
    EXPECT_EQ(node.Status().pushes(), 2);
  }
}

// A resend that arrives while its original is being checked by the apply
// is answered ABORTED (resendable): the original may yet be refused, so the
// resend can be neither answered as a duplicate nor applied again. Once the
// original is answered, a resend is a duplicate (applied) or applied
// (refused original, finite values now).
TEST(ServerNodeParallelTest, ResendDuringACheckedApplyIsAborted) {
  FakeClock clock;
  ServerNode node(&clock, ServerLimits(), 3);
  proto::ClusterView v = MakeView(1, 1, proto::MODE_ASP);
  const size_t dim = 300;
  v.mutable_tables(0)->set_dim(static_cast<int>(dim));
  ASSERT_TRUE(node.Configure(0, v).ok());
  const Routing routing = *Routing::FromProto(v.routing());
  const std::vector<uint64_t> keys = {7, 8};
  ASSERT_EQ(routing.RangeOf(7), routing.RangeOf(8));
  auto push = [&](uint64_t seq, const std::vector<float>& g,
                  proto::PushResponse* resp = nullptr) {
    proto::PushRequest r = MakePush(0, seq, 0, keys, g, 1);
    proto::PushSegment* seg = r.add_segments();
    seg->set_range(routing.RangeOf(7));
    seg->set_seq(seq);
    seg->set_num_keys(2);
    return PushNow(&node, r, resp);
  };
  std::vector<float> g(2 * dim);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(i % 1000) / 8.0f;  // exact in binary
  }
  std::vector<float> bad = g;
  bad[dim + 3] = std::numeric_limits<float>::infinity();
  auto expect_times = [&](float times) {
    const std::vector<float> got = PullNow(&node, 0, 0, keys);
    ASSERT_EQ(got.size(), g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(got[i], -times * g[i]) << "element " << i;
    }
  };
  // The resend, sent (and answered) from another thread while the
  // original waits to be applied; once per armed hook.
  bool armed = false;
  absl::Status during;
  proto::PushResponse during_resp;
  uint64_t resent_seq = 0;
  std::vector<float> resent;
  node.SetBeforeApplyForTest([&] {
    if (!armed) return;
    armed = false;
    std::thread t([&] { during = push(resent_seq, resent, &during_resp); });
    t.join();
  });
  // An original that is applied.
  armed = true;
  resent_seq = 1;
  resent = g;
  proto::PushResponse resp;
  ASSERT_TRUE(push(1, g, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  EXPECT_EQ(during.code(), StatusCode::kAborted) << during;
  EXPECT_FALSE(during_resp.duplicate());
  expect_times(1.0f);
  resp.Clear();
  ASSERT_TRUE(push(1, g, &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  expect_times(1.0f);
  // An original that is refused: its resend during the apply is ABORTED
  // too, the one after it refused again, and finite values then applied.
  armed = true;
  resent_seq = 2;
  resent = bad;
  EXPECT_EQ(push(2, bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(during.code(), StatusCode::kAborted) << during;
  expect_times(1.0f);
  EXPECT_EQ(push(2, bad).code(), StatusCode::kInvalidArgument);
  resp.Clear();
  ASSERT_TRUE(push(2, g, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  expect_times(2.0f);
  EXPECT_EQ(node.Status().pushes(), 2);
  node.SetBeforeApplyForTest(nullptr);
}

// Any push, not only one checked by its apply: a resend that arrives while
// the original is being applied is ABORTED, since an acknowledgement means
// applied (a worker that lent the values' memory writes it again once the
// push is answered, while the original's apply may still read it). Here a
// sparse push of one key in each of two ranges (not checked in the apply).
TEST(ServerNodeParallelTest, ResendDuringAnyApplyIsAborted) {
  FakeClock clock;
  ServerNode node(&clock, ServerLimits(), 3);
  const proto::ClusterView v = MakeView(1, 1, proto::MODE_ASP);
  ASSERT_TRUE(node.Configure(0, v).ok());
  const Routing routing = *Routing::FromProto(v.routing());
  // Ranges are arcs of the key space: another one lies far from key 7.
  uint64_t other = 7;
  while (routing.RangeOf(other) == routing.RangeOf(7)) {
    other += uint64_t{1} << 56;
  }
  const std::vector<uint64_t> keys = {7, other};
  const std::vector<float> g = {0.5f, 0.25f};
  auto push = [&](proto::PushResponse* resp) {
    proto::PushRequest r = MakePush(0, 1, 0, keys, g, 1);
    for (size_t i = 0; i < keys.size(); ++i) {
      proto::PushSegment* seg = r.add_segments();
      seg->set_range(routing.RangeOf(keys[i]));
      seg->set_seq(1);
      seg->set_num_keys(1);
    }
    return PushNow(&node, r, resp);
  };
  bool armed = true;
  absl::Status during;
  proto::PushResponse during_resp;
  node.SetBeforeApplyForTest([&] {
    if (!armed) return;
    armed = false;
    std::thread t([&] { during = push(&during_resp); });
    t.join();
  });
  proto::PushResponse resp;
  ASSERT_TRUE(push(&resp).ok());
  EXPECT_FALSE(resp.duplicate());
  EXPECT_EQ(during.code(), StatusCode::kAborted) << during;
  EXPECT_FALSE(during_resp.duplicate());
  resp.Clear();
  ASSERT_TRUE(push(&resp).ok());
  EXPECT_TRUE(resp.duplicate());
  const std::vector<float> got = PullNow(&node, 0, 0, keys);
  EXPECT_EQ(got, (std::vector<float>{-g[0], -g[1]}));
  EXPECT_EQ(node.Status().pushes(), 1);
  node.SetBeforeApplyForTest(nullptr);
}

TEST_F(ServerNodeTest, BspNonFiniteGradientIsRejectedBeforeBuffering) {
  Configure(1, 1, proto::MODE_BSP);
  absl::Status s = PushNow(
      &node_, MakePush(0, 1, 0, {1}, {std::numeric_limits<float>::quiet_NaN()},
                       1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(s), proto::REASON_NON_FINITE);
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  EXPECT_EQ(PullNow(&node_, 0, 1, {1}), std::vector<float>{0.0f});
}

// Issue 10: filters and compression. Values in f16 or int8, compressed
// with zstd or lz4 or not, are decoded before anything else.
class EncodedPushTest : public ServerNodeTest {
 protected:
  // 256 keys of one range (small keys: the first range of the ring), with
  // zero-heavy gradients so the codecs have something to save.
  static constexpr int kKeys = 256;
  std::vector<uint64_t> keys_ = [] {
    std::vector<uint64_t> k;
    for (int i = 1; i <= kKeys; ++i) k.push_back(static_cast<uint64_t>(i));
    return k;
  }();
  std::vector<float> grads_ = [] {
    std::vector<float> g(kKeys, 0.0f);
    for (int i = 0; i < kKeys; i += 4) g[i] = 0.25f * (i % 8 + 1) - 0.6f;
    return g;
  }();

  int Range() const {
    absl::StatusOr<Routing> r =
        Routing::FromProto(MakeView(1, 1, proto::MODE_ASP).routing());
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->RangeOf(keys_.front()), r->RangeOf(keys_.back()));
    return r->RangeOf(keys_.front());
  }

  // A push of grads_ in `enc`, compressed with `codec` (which must help).
  proto::PushRequest Encoded(uint64_t seq, proto::ValueEncoding enc,
                             proto::ValueCodec codec) {
    proto::PushRequest r = MakePush(0, seq, 0, keys_, {}, 1);
    proto::PushSegment* seg = r.add_segments();
    seg->set_range(Range());
    seg->set_seq(seq);
    seg->set_num_keys(kKeys);
    const float scale = Int8Scale(grads_.data(), grads_.size());
    if (enc == proto::VALUES_INT8) seg->set_scale(scale);
    std::string v;
    EncodeValues(enc, grads_.data(), grads_.size(), scale, &v, nullptr);
    r.set_value_encoding(enc);
    if (codec != proto::CODEC_NONE) {
      std::string packed;
      EXPECT_TRUE(Compress(codec, v, &packed));
      r.set_vals_raw_bytes(v.size());
      r.set_vals_codec(codec);
      v = packed;
    }
    r.set_vals(v);
    return r;
  }
};

TEST_F(EncodedPushTest, EveryEncodingAndCodecAppliesTheDecodedValues) {
  Configure(1, 1, proto::MODE_ASP);
  std::vector<float> want(kKeys, 0.0f);
  uint64_t seq = 0;
  for (proto::ValueEncoding enc :
       {proto::VALUES_F32, proto::VALUES_F16, proto::VALUES_INT8}) {
    for (proto::ValueCodec codec :
         {proto::CODEC_NONE, proto::CODEC_ZSTD, proto::CODEC_LZ4}) {
      const proto::PushRequest req = Encoded(++seq, enc, codec);
      ASSERT_TRUE(PushNow(&node_, req).ok()) << enc << " " << codec;
      // What the worker meant, as the encoding carries it (sgd, lr 1).
      std::vector<float> d(kKeys);
      ASSERT_TRUE(DecodeValues(enc, Encoded(seq, enc, proto::CODEC_NONE)
                                        .vals()
                                        .data(),
                               kKeys, req.segments(0).scale(), d.data())
                      .ok());
      for (int i = 0; i < kKeys; ++i) want[i] -= d[i];
      const std::vector<float> got = PullNow(&node_, 0, 0, keys_);
      for (int i = 0; i < kKeys; ++i) {
        ASSERT_FLOAT_EQ(got[i], want[i]) << enc << " " << codec << " " << i;
      }
    }
  }
  EXPECT_EQ(node_.Status().pushes(), 9);
}

// What a hostile or broken client can send: each is INVALID_ARGUMENT and
// changes nothing.
TEST_F(EncodedPushTest, MalformedEncodedPushesAreRefused) {
  Configure(1, 1, proto::MODE_ASP);
  auto refused = [&](proto::PushRequest req, const char* what) {
    EXPECT_EQ(PushNow(&node_, req).code(), StatusCode::kInvalidArgument)
        << what;
  };
  proto::PushRequest r = Encoded(1, proto::VALUES_F16, proto::CODEC_NONE);
  r.mutable_vals()->pop_back();
  refused(r, "f16 values one byte short");
  r = Encoded(1, proto::VALUES_INT8, proto::CODEC_NONE);
  r.clear_segments();
  refused(r, "int8 without segments");
  r = Encoded(1, proto::VALUES_INT8, proto::CODEC_NONE);
  r.mutable_segments(0)->set_scale(-1);
  refused(r, "negative int8 scale");
  r = Encoded(1, proto::VALUES_INT8, proto::CODEC_NONE);
  r.mutable_segments(0)->set_num_keys(kKeys + 1);
  refused(r, "int8 segments with more keys than the request");
  r = Encoded(1, proto::VALUES_F16, proto::CODEC_ZSTD);
  r.set_vals_raw_bytes(r.vals_raw_bytes() * 2);
  refused(r, "zstd raw size that is not the keys'");
  r = Encoded(1, proto::VALUES_F16, proto::CODEC_LZ4);
  (*r.mutable_vals())[r.vals().size() / 2] ^= 0x55;
  (*r.mutable_vals())[1] ^= 0x33;
  refused(r, "corrupt lz4");
  r = Encoded(1, proto::VALUES_F16, proto::CODEC_NONE);
  r.set_value_encoding(static_cast<proto::ValueEncoding>(7));
  refused(r, "unknown encoding");
  r = Encoded(1, proto::VALUES_F16, proto::CODEC_ZSTD);
  r.set_vals_codec(static_cast<proto::ValueCodec>(9));
  refused(r, "unknown codec");
  EXPECT_EQ(node_.table(0)->size(), 0u);
  EXPECT_EQ(node_.Status().pushes(), 0);
}

// A half-precision infinity decodes to infinity: refused as any other.
TEST_F(EncodedPushTest, HalfInfinityIsNonFinite) {
  Configure(1, 1, proto::MODE_ASP);
  proto::PushRequest r = Encoded(1, proto::VALUES_F16, proto::CODEC_NONE);
  (*r.mutable_vals())[0] = '\x00';
  (*r.mutable_vals())[1] = '\x7c';  // 0x7c00: +inf
  absl::Status s = PushNow(&node_, r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(s), proto::REASON_NON_FINITE);
}

// A decompression bomb: a few bytes that claim, and would expand to, more
// float32 values than the server takes in one message.
TEST(EncodedPushLimitTest, DecodingBeyondTheLimitIsRefusedUpFront) {
  FakeClock clock;
  ServerLimits limits;
  limits.max_decoded_value_bytes = 1024;  // 256 floats
  ServerNode node(&clock, limits);
  ASSERT_TRUE(node.Configure(0, MakeView(1, 1, proto::MODE_ASP)).ok());
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; i <= 257; ++i) keys.push_back(i);
  proto::PushRequest r = MakePush(0, 1, 0, keys, {}, 1);
  const std::string zeros(257 * 2, '\0');
  std::string packed;
  ASSERT_TRUE(Compress(proto::CODEC_ZSTD, zeros, &packed));
  r.set_value_encoding(proto::VALUES_F16);
  r.set_vals_codec(proto::CODEC_ZSTD);
  r.set_vals_raw_bytes(zeros.size());
  r.set_vals(packed);
  absl::Status s = PushNow(&node, r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("decode to more than 1024 bytes"),
            std::string::npos)
      << s;
  // 256 keys are within it.
  keys.pop_back();
  r = MakePush(0, 1, 0, keys, {}, 1);
  const std::string fewer(256 * 2, '\0');
  ASSERT_TRUE(Compress(proto::CODEC_ZSTD, fewer, &packed));
  r.set_value_encoding(proto::VALUES_F16);
  r.set_vals_codec(proto::CODEC_ZSTD);
  r.set_vals_raw_bytes(fewer.size());
  r.set_vals(packed);
  EXPECT_TRUE(PushNow(&node, r).ok());
}

// Regression: consistency mode 42 was accepted.
TEST_F(ServerNodeTest, UnknownConsistencyModeIsInvalidArgument) {
  proto::ClusterView v = MakeView(1, 1, proto::MODE_ASP);
  v.mutable_consistency()->set_mode(static_cast<proto::ConsistencyMode>(42));
  EXPECT_EQ(node_.Configure(0, v).code(), StatusCode::kInvalidArgument);
  Configure(1, 1, proto::MODE_SSP, 1);
  proto::ConsistencyConfig c;
  c.set_mode(static_cast<proto::ConsistencyMode>(42));
  EXPECT_EQ(node_.SetConsistency(c).code(), StatusCode::kInvalidArgument);
  c.set_mode(static_cast<proto::ConsistencyMode>(-1));
  EXPECT_EQ(node_.SetConsistency(c).code(), StatusCode::kInvalidArgument);
}

TEST_F(ServerNodeTest, NegativeFinalClockIsInvalidArgument) {
  Configure(1, 1, proto::MODE_ASP);
  EXPECT_EQ(node_.Finish(MakeFinish(0, -5)).code(),
            StatusCode::kInvalidArgument);
}

class ServerNodeLimitsTest : public ::testing::Test {
 protected:
  static ServerLimits Small() {
    ServerLimits l;
    l.max_pending_pulls_per_worker = 3;
    l.max_clock_ahead = 10;
    l.max_wait_ms = 5000;
    l.max_unsettled_seqs = 4;
    return l;
  }
  void SetUp() override {
    ASSERT_TRUE(node_.Configure(0, MakeView(1, 2, proto::MODE_BSP)).ok());
  }
  void TearDown() override {
    EXPECT_TRUE(node_.CheckInvariants().ok()) << node_.CheckInvariants();
  }

  FakeClock clock_;
  ServerNode node_{&clock_, Small()};
};

// Regression: 80k abandoned pulls held 1.38 GB; waits per worker are now
// bounded.
TEST_F(ServerNodeLimitsTest, TooManyWaitingPullsIsResourceExhausted) {
  std::vector<std::unique_ptr<PendingPull>> waiting;
  for (int i = 0; i < 3; ++i) {
    waiting.push_back(StartPull(&node_, 0, 1, {1}));
    EXPECT_FALSE(waiting.back()->done());
  }
  auto p = StartPull(&node_, 0, 1, {1});
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(p->status), proto::REASON_TOO_MANY_PENDING);
  // Another worker has its own allowance.
  auto other = StartPull(&node_, 1, 1, {1});
  EXPECT_FALSE(other->done());
  // Once the waits are answered the worker may wait again.
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 0, 1)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(1, 0, 0, 1)).ok());
  for (auto& w : waiting) EXPECT_TRUE(w->done() && w->status.ok());
  auto again = StartPull(&node_, 0, 2, {1});
  EXPECT_FALSE(again->done());
  node_.CancelAll(absl::CancelledError("test over"));  // before they die
}

TEST_F(ServerNodeLimitsTest, ExpiredWaitsFreeTheirSlots) {
  std::vector<std::unique_ptr<PendingPull>> waiting;
  for (int i = 0; i < 3; ++i) {
    waiting.push_back(StartPull(&node_, 0, 1, {1}, /*wait_ms=*/100));
  }
  clock_.Advance(absl::Milliseconds(100));
  node_.Tick();
  for (auto& w : waiting) {
    EXPECT_EQ(w->status.code(), StatusCode::kDeadlineExceeded);
  }
  auto p = StartPull(&node_, 0, 1, {1});
  EXPECT_FALSE(p->done());
  node_.CancelAll(absl::CancelledError("test over"));
}

TEST_F(ServerNodeLimitsTest, HugeWaitMsIsClamped) {
  auto p = StartPull(&node_, 0, 1, {1},
                     /*wait_ms=*/std::numeric_limits<int64_t>::max());
  clock_.Advance(absl::Milliseconds(4999));
  node_.Tick();
  EXPECT_FALSE(p->done());
  clock_.Advance(absl::Milliseconds(1));
  node_.Tick();
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->status.code(), StatusCode::kDeadlineExceeded);
}

TEST_F(ServerNodeLimitsTest, CallerDeadlineBoundsTheWait) {
  PendingPull p;
  p.req.set_worker_id(0);
  p.req.set_clock(1);
  p.req.set_epoch(1);
  p.req.set_keys(Keys({1}));
  p.req.set_wait_ms(4000);
  node_.Pull(
      p.req, &p.resp,
      [&p](const absl::Status& s) {
        ++p.calls;
        p.status = s;
      },
      absl::Milliseconds(50));
  clock_.Advance(absl::Milliseconds(50));
  node_.Tick();
  ASSERT_TRUE(p.done());
  EXPECT_EQ(p.status.code(), StatusCode::kDeadlineExceeded);
}

// Regression: a pull or clock far in the future grew server state without
// bound.
TEST_F(ServerNodeLimitsTest, ClockTooFarAheadIsOutOfRange) {
  absl::Status s = node_.ClockTick(MakeClock(0, 11, 0, 1));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(s), proto::REASON_CLOCK_TOO_FAR);
  EXPECT_EQ(node_.ClockTick(MakeClock(0, std::numeric_limits<int64_t>::max(),
                                      0, 1))
                .code(),
            StatusCode::kOutOfRange);
  EXPECT_TRUE(node_.ClockTick(MakeClock(0, 10, 0, 1)).ok());

  s = PushNow(&node_, MakePush(0, 1, 11, {1}, {1}, 1));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(s), proto::REASON_CLOCK_TOO_FAR);
  EXPECT_TRUE(PushNow(&node_, MakePush(0, 1, 10, {1}, {1}, 1)).ok());

  auto p = StartPull(&node_, 0, 11, {1});
  ASSERT_TRUE(p->done());
  EXPECT_EQ(p->status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(p->status), proto::REASON_CLOCK_TOO_FAR);
  auto q = StartPull(&node_, 0, 10, {1});
  EXPECT_FALSE(q->done()) << "within the bound it waits as usual";
  node_.CancelAll(absl::CancelledError("test over"));
}

// A server drained of every range (it owns none at the new view) answers a
// worker's clock or pull with a stale epoch, which the worker regroups by
// the newest view, however far the clock is past the "0" it completed on
// no range: before, it answered CLOCK_TOO_FAR, which the worker took as
// final and exited (chaos mix seed 908 SSP: clock 1021 to a drained S[1]).
TEST(ServerNodeDrainedTest, OwningNoRangeIsAStaleEpochNotAClockTooFar) {
  FakeClock clock;
  ServerLimits limits;
  limits.max_clock_ahead = 10;
  ServerNode node(&clock, limits);
  proto::ClusterView v = MakeView(2, 1, proto::MODE_ASP);
  ASSERT_TRUE(node.Configure(0, v).ok());
  // Epoch 2: every range on S[1], S[0] left owning nothing.
  v.set_epoch(2);
  v.mutable_routing()->set_epoch(2);
  for (int& owner : *v.mutable_routing()->mutable_range_server()) owner = 1;
  ASSERT_TRUE(node.Configure(0, v).ok());
  proto::ClockRequest c = MakeClock(0, 1021, 0, 1);
  c.set_epoch(1);
  c.add_range_ids(0);
  c.add_range_segments(0);
  c.add_range_settled_seqs(0);
  absl::Status s = node.ClockTick(c);
  EXPECT_EQ(ReasonOf(s), proto::REASON_STALE_EPOCH) << s;
  auto p = StartPull(&node, 0, 1021, {1});
  ASSERT_TRUE(p->done());
  EXPECT_NE(ReasonOf(p->status), proto::REASON_CLOCK_TOO_FAR) << p->status;
  EXPECT_EQ(ReasonOf(p->status), proto::REASON_STALE_EPOCH) << p->status;
}

TEST_F(ServerNodeLimitsTest, UnsettledSeqsAreBounded) {
  // Seqs 2, 4, 6, 8 leave gaps: four remembered above the watermark.
  for (uint64_t seq : {2, 4, 6, 8}) {
    ASSERT_TRUE(PushNow(&node_, MakePush(0, seq, 0, {1}, {1}, 1)).ok());
  }
  absl::Status s = PushNow(&node_, MakePush(0, 10, 0, {1}, {1}, 1));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(s), proto::REASON_TOO_MANY_PENDING);
  // The next contiguous seq still goes through, and so do later ones once
  // a clock settles them.
  EXPECT_TRUE(PushNow(&node_, MakePush(0, 1, 0, {1}, {1}, 1)).ok());
  ASSERT_TRUE(node_.ClockTick(MakeClock(0, 0, 5, 5, /*settled=*/8)).ok());
  EXPECT_TRUE(PushNow(&node_, MakePush(0, 10, 1, {1}, {1}, 1)).ok());
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// Per-range exactly-once (issue 9): a push carries (range, seq) segments;
// the seq space is per (worker, range), so the same seq in two ranges is
// two pushes, and a segment resent after a re-slice is a duplicate.
class ServerNodeSegmentTest : public ServerNodeTest {
 protected:
  void SetUp() override {
    Configure(1, 1, proto::MODE_ASP);
    routing_ = *Routing::FromProto(MakeView(1, 1, proto::MODE_ASP).routing());
    // Two keys in different ranges.
    a_ = 1;
    b_ = routing_.RangeBegin(routing_.num_ranges() - 1);
    ASSERT_NE(routing_.RangeOf(a_), routing_.RangeOf(b_));
  }
  proto::PushRequest Segmented(const std::vector<uint64_t>& keys,
                               const std::vector<float>& grads,
                               const std::vector<uint64_t>& seqs,
                               int64_t clock = 0) {
    proto::PushRequest r = MakePush(0, 0, clock, keys, grads, 1);
    size_t i = 0;
    routing_.ForEachRangeRun(
        absl::MakeConstSpan(keys), [&](int range, size_t first, size_t last) {
          proto::PushSegment* seg = r.add_segments();
          seg->set_range(range);
          seg->set_seq(seqs[i++]);
          seg->set_num_keys(static_cast<uint32_t>(last - first));
        });
    return r;
  }
  Routing routing_;
  uint64_t a_ = 0, b_ = 0;
};

TEST_F(ServerNodeSegmentTest, SeqsArePerRange) {
  ASSERT_TRUE(PushNow(&node_, Segmented({a_, b_}, {1, 2}, {1, 1})).ok());
  // Seq 1 again in range(a) is a duplicate; seq 2 in range(b) is new.
  proto::PushResponse resp;
  ASSERT_TRUE(PushNow(&node_, Segmented({a_}, {5}, {1}), &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  ASSERT_TRUE(PushNow(&node_, Segmented({b_}, {4}, {2})).ok());
  EXPECT_EQ(PullNow(&node_, 0, 0, {a_, b_}), (std::vector<float>{-1, -6}));
}

// A push re-sliced after an epoch change keeps its segments' seqs: a
// segment the server already applied is dropped, the other applied.
TEST_F(ServerNodeSegmentTest, ResentSegmentsAreAppliedOnce) {
  ASSERT_TRUE(PushNow(&node_, Segmented({a_}, {1}, {1})).ok());
  proto::PushResponse resp;
  ASSERT_TRUE(PushNow(&node_, Segmented({a_, b_}, {1, 2}, {1, 1}), &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  EXPECT_EQ(PullNow(&node_, 0, 0, {a_, b_}), (std::vector<float>{-1, -2}));
}

TEST_F(ServerNodeSegmentTest, SegmentsThatDoNotCutTheKeysAreRefused) {
  proto::PushRequest r = Segmented({a_, b_}, {1, 2}, {1, 1});
  r.mutable_segments(0)->set_num_keys(2);
  EXPECT_EQ(PushNow(&node_, r).code(), StatusCode::kInvalidArgument);
  r = Segmented({a_, b_}, {1, 2}, {1, 1});
  r.mutable_segments()->RemoveLast();
  EXPECT_EQ(PushNow(&node_, r).code(), StatusCode::kInvalidArgument);
  r = Segmented({a_, b_}, {1, 2}, {1, 1});
  r.mutable_segments(1)->set_range(r.segments(0).range());
  EXPECT_EQ(PushNow(&node_, r).code(), StatusCode::kInvalidArgument);
  r = Segmented({a_}, {1}, {0});
  EXPECT_EQ(PushNow(&node_, r).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(node_.Status().pushes(), 0);
}

// Per-range announcements: each range completes the worker's clock when
// its own segments are in, independently of the others.
TEST_F(ServerNodeSegmentTest, RangesCompleteClocksIndependently) {
  ASSERT_TRUE(PushNow(&node_, Segmented({a_}, {1}, {1})).ok());
  proto::ClockRequest c = MakeClock(0, 0, 0, 1);
  for (int r : routing_.RangesOf(0)) {
    c.add_range_ids(r);
    c.add_range_segments(r == routing_.RangeOf(b_) ? 1
                                                   : r == routing_.RangeOf(a_));
    c.add_range_settled_seqs(0);
  }
  ASSERT_TRUE(node_.ClockTick(c).ok());
  // range(a) completed clock 0; range(b) waits for its segment.
  proto::ServerStatus st = node_.Status();
  ASSERT_EQ(st.worker_clocks_size(), 1);
  EXPECT_EQ(st.worker_clocks(0), 0);  // the minimum over ranges
  ASSERT_TRUE(PushNow(&node_, Segmented({b_}, {1}, {1})).ok());
  EXPECT_EQ(node_.Status().worker_clocks(0), 1);
  // A range this server does not own is a stale epoch.
  proto::ClockRequest bad = MakeClock(0, 1, 0, 1);
  bad.add_range_ids(routing_.num_ranges());
  bad.add_range_segments(0);
  bad.add_range_settled_seqs(0);
  EXPECT_EQ(node_.ClockTick(bad).code(), StatusCode::kInvalidArgument);
  // Arrays of different lengths are refused.
  proto::ClockRequest uneven = MakeClock(0, 1, 0, 1);
  uneven.add_range_ids(routing_.RangeOf(a_));
  uneven.add_range_segments(0);
  EXPECT_EQ(node_.ClockTick(uneven).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
