// A ServerNode behind the real gRPC service on 127.0.0.1, reached with the
// real client (GrpcClientFactory): exactly-once pushes, authentication and
// validation as a remote client sees them.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/bytes.h"
#include "common/logging.h"
#include "common/routing.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server_node.h"
#include "server/server_service.h"
#include "tests/test_views.h"
#include "transport/data_plane.h"
#include "transport/grpc_transport.h"
#include "transport/shared_arena.h"

namespace ps {
namespace {

constexpr char kToken[] = "secret";

std::shared_ptr<proto::PushRequest> MakePush(uint64_t seq,
                                             std::vector<uint64_t> keys,
                                             std::vector<float> vals) {
  auto r = std::make_shared<proto::PushRequest>();
  r->set_worker_id(0);
  r->set_seq(seq);
  r->set_clock(0);
  r->set_epoch(1);
  r->set_table(0);
  PackTo<uint64_t>(r->mutable_keys(), keys);
  PackTo<float>(r->mutable_vals(), vals);
  r->set_num_examples(1);
  return r;
}

struct PushResult {
  absl::Status status = absl::InternalError("no answer");
  bool duplicate = false;
};

PushResult Push(ServerClient* c, std::shared_ptr<const proto::PushRequest> r) {
  PushResult out;
  absl::Notification done;
  c->Push(std::move(r), absl::Now() + absl::Seconds(10),
          [&](const absl::Status& s, proto::PushResponse* resp) {
            out.status = s;
            out.duplicate = resp != nullptr && resp->duplicate();
            done.Notify();
          });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  return out;
}

absl::StatusOr<std::vector<float>> Pull(ServerClient* c,
                                        std::vector<uint64_t> keys) {
  auto r = std::make_shared<proto::PullRequest>();
  r->set_worker_id(0);
  r->set_clock(0);
  r->set_epoch(1);
  r->set_table(0);
  r->set_wait_ms(5000);
  PackTo<uint64_t>(r->mutable_keys(), keys);
  absl::Status status = absl::InternalError("no answer");
  std::vector<float> vals;
  absl::Notification done;
  c->Pull(r, absl::Now() + absl::Seconds(10),
          [&](const absl::Status& s, proto::PullResponse* resp) {
            status = s;
            if (s.ok()) {
              absl::Span<const float> v = ViewAs<float>(resp->vals());
              vals.assign(v.begin(), v.end());
            }
            done.Notify();
          });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  if (!status.ok()) return status;
  return vals;
}

// A batch of replication entries from S[0] at epoch 1: empty, or naming
// range 0 (which a single-server job's S[0] does not back up).
std::shared_ptr<proto::ReplicateRequest> Batch(bool names_a_range) {
  auto r = std::make_shared<proto::ReplicateRequest>();
  r->set_from_server(0);
  r->set_epoch(1);
  if (names_a_range) {
    proto::ReplicaEntry* e = r->add_entries();
    e->set_range(0);
    e->set_index(1);
    e->set_dead_worker(0);
  }
  return r;
}

absl::Status ReplicateNow(ServerClient* c,
                          std::shared_ptr<const proto::ReplicateRequest> r,
                          absl::Duration deadline = absl::Seconds(10)) {
  absl::Status out = absl::InternalError("no answer");
  absl::Notification done;
  c->Replicate(std::move(r), absl::Now() + deadline,
               [&](const absl::Status& s, proto::ReplicateResponse*) {
                 out = s;
                 done.Notify();
               });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  return out;
}

// Builds and starts a server with `service` on 127.0.0.1 (a free port, in
// *port) with the project's settings (ConfigureServerBuilder).
std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service,
                                              int* port) {
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InitLogging("T", "warn");
    ASSERT_TRUE(node_.Configure(0, OneServerView()).ok());
    service_ = std::make_unique<ServerService>(&node_, kToken, [] {});
    server_ = ServeOnLoopback(service_.get(), &port_);
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    address_ = absl::StrCat("127.0.0.1:", port_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    node_.CancelAll(absl::CancelledError("test over"));
  }

  std::shared_ptr<ServerClient> Client(const std::string& token) {
    factories_.push_back(
        std::make_unique<GrpcClientFactory>(GrpcTransportOptions{token, 1}));
    return factories_.back()->Server(address_);
  }

  ServerNode node_;
  std::unique_ptr<ServerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::vector<std::unique_ptr<GrpcClientFactory>> factories_;
};

TEST_F(GrpcServerTest, ReplayedPushChangesNothing) {
  auto c = Client(kToken);
  auto req = MakePush(1, {3, 17}, {1, -4});
  PushResult first = Push(c.get(), req);
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_FALSE(first.duplicate);
  auto before = Pull(c.get(), {3, 17});
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, (std::vector<float>{-1.0f, 4.0f}));

  // The identical request again, as a client retrying after a lost reply.
  PushResult again = Push(c.get(), req);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_TRUE(again.duplicate);
  auto after = Pull(c.get(), {3, 17});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
  EXPECT_EQ(node_.Status().pushes(), 1);
}

// ZPush over gRPC (issue 10): values borrowed in pieces arrive as the
// request's values, keys borrowed as its keys, and the client lets go of
// both once the call is done.
TEST_F(GrpcServerTest, BorrowedKeysAndValuesArriveWhole) {
  auto c = Client(kToken);
  std::vector<uint64_t> keys(40000);  // 320 KB of keys, 160 KB of values: sent in place
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i + 1;
  auto vals = std::make_shared<std::vector<float>>(keys.size());
  for (size_t i = 0; i < vals->size(); ++i) (*vals)[i] = 0.5f * (i % 97);
  auto req = MakePush(1, {}, {});
  auto packed_keys = std::make_shared<std::string>();
  PackTo<uint64_t>(packed_keys.get(), keys);
  const absl::Span<const char> all(reinterpret_cast<const char*>(vals->data()),
                                   vals->size() * sizeof(float));
  // Cut inside a float, as a worker's pieces never are: the wire does not
  // care where pieces end.
  BorrowedValues b{vals,
                   {all.subspan(0, 70001), all.subspan(70001, 3),
                    all.subspan(70004)},
                   absl::Span<const char>(*packed_keys), packed_keys};
  std::weak_ptr<std::vector<float>> alive = vals;
  std::weak_ptr<std::string> keys_alive = packed_keys;
  packed_keys.reset();
  const std::vector<float> want_neg = [&] {
    std::vector<float> w(*vals);
    for (float& x : w) x = -x;
    return w;
  }();
  vals.reset();
  absl::Status status = absl::InternalError("no answer");
  absl::Notification done;
  c->PushBorrowed(req, std::move(b), absl::Now() + absl::Seconds(10),
                  [&](const absl::Status& s, proto::PushResponse*) {
                    status = s;
                    done.Notify();
                  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ASSERT_TRUE(status.ok()) << status;
  auto got = Pull(c.get(), keys);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want_neg);
  // gRPC frees the request's slices once it has sent them.
  for (int i = 0; i < 500 && !(alive.expired() && keys_alive.expired()); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(alive.expired());
  EXPECT_TRUE(keys_alive.expired());
}

// Issue 10: over the same-host socket with shared memory, a worker's large
// push is read by the real server from the arena, and a pull's answer is
// written by the node straight into the slot the worker offered; the values
// are those of the in-band path to the bit.
TEST_F(GrpcServerTest, SharedMemoryCarriesPushAndPullThroughTheRealServer) {
  DataService data(&node_);
  DataPlaneServerOptions o;
  o.token = kToken;
  auto dp = DataPlaneServer::Start(o, &data);
  ASSERT_TRUE(dp.ok()) << dp.status();
  auto arena = SharedArena::Create(size_t{8} << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto c = DataPlaneClient::ConnectLocal(
      (*dp)->local_name(), kToken, size_t{64} << 20,
      absl::Now() + absl::Seconds(5), absl::Seconds(5), std::move(*arena));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->shared());
  std::vector<uint64_t> keys(40000);  // 320 KB of keys, 160 KB of values
  std::vector<float> vals(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = FeatureKey(i * 7 + 1);
    vals[i] = 0.25f * static_cast<float>(i % 101);
  }
  std::sort(keys.begin(), keys.end());
  // The keys borrowed (as a worker sends them), the values in the request.
  auto push = MakePush(1, {}, vals);
  std::string packed_keys;
  PackTo<uint64_t>(&packed_keys, keys);
  BorrowedValues borrowed_keys;
  borrowed_keys.keys = absl::Span<const char>(packed_keys);
  absl::Notification pushed;
  (*c)->Push(*push, &borrowed_keys, absl::Now() + absl::Seconds(10),
             [&](const absl::Status& s, proto::PushResponse*) {
               EXPECT_TRUE(s.ok()) << s;
               pushed.Notify();
             });
  ASSERT_TRUE(pushed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ((*c)->shared_calls(), 1);
  // What the gRPC path pulls is the reference.
  auto want = Pull(Client(kToken).get(), keys);
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t i = 0; i < vals.size(); ++i) ASSERT_EQ((*want)[i], -vals[i]) << i;
  auto pull = std::make_shared<proto::PullRequest>();
  pull->set_worker_id(0);
  pull->set_epoch(1);
  pull->set_table(0);
  pull->set_wait_ms(5000);
  PackTo<uint64_t>(pull->mutable_keys(), keys);
  // Each pull's keys (320 KB) in the arena; its answer in the frame, then,
  // the table's answer size known, in the arena after the keys.
  for (int round = 0; round < 3; ++round) {
    absl::Notification pulled;
    (*c)->PullValues(*pull, absl::Now() + absl::Seconds(10),
                     [&](const absl::Status& s, proto::PullResponse*,
                         absl::Span<const char> got) {
                       EXPECT_TRUE(s.ok()) << s;
                       ASSERT_EQ(got.size(), want->size() * sizeof(float));
                       EXPECT_EQ(std::memcmp(got.data(), want->data(),
                                             got.size()),
                                 0);
                       pulled.Notify();
                     });
    ASSERT_TRUE(pulled.WaitForNotificationWithTimeout(absl::Seconds(20)));
  }
  EXPECT_EQ((*c)->shared_calls(), 4);
  c->reset();
  (*dp)->Stop();
}

// Issue 10: values a worker wrote in memory lent from its arena are applied
// by the real server where they lie (kSharedAt), to the same result as
// values sent in the request.
TEST_F(GrpcServerTest, LentValuesAreAppliedWhereTheyLie) {
  DataService data(&node_);
  DataPlaneServerOptions o;
  o.token = kToken;
  auto dp = DataPlaneServer::Start(o, &data);
  ASSERT_TRUE(dp.ok()) << dp.status();
  auto made = SharedArena::Create(size_t{8} << 20);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<SharedArena> arena = std::move(*made);
  auto c = DataPlaneClient::ConnectLocal(
      (*dp)->local_name(), kToken, size_t{64} << 20,
      absl::Now() + absl::Seconds(5), absl::Seconds(5), arena);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->shared());
  std::vector<uint64_t> keys(40000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = FeatureKey(i * 5 + 3);
  std::sort(keys.begin(), keys.end());
  std::shared_ptr<char> lent = SharedArena::Lend(arena, keys.size() * 4);
  ASSERT_NE(lent, nullptr);
  float* vals = reinterpret_cast<float*>(lent.get());
  for (size_t i = 0; i < keys.size(); ++i) {
    vals[i] = 0.125f * static_cast<float>(i % 97);
  }
  auto push = MakePush(1, {}, {});
  PackTo<uint64_t>(push->mutable_keys(), keys);
  BorrowedValues borrowed;
  borrowed.owner = lent;
  borrowed.pieces.emplace_back(lent.get(), keys.size() * 4);
  absl::Notification pushed;
  (*c)->Push(*push, &borrowed, absl::Now() + absl::Seconds(10),
             [&](const absl::Status& s, proto::PushResponse*) {
               EXPECT_TRUE(s.ok()) << s;
               pushed.Notify();
             });
  ASSERT_TRUE(pushed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ((*c)->lent_calls(), 1);
  auto got = Pull(Client(kToken).get(), keys);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ((*got)[i], -vals[i]) << i;
  c->reset();
  (*dp)->Stop();
}

// The client factory lends memory from the one arena its same-host
// connections offer, while the data plane and same-host sockets are on.
TEST(GrpcClientFactoryTest, LendsSharedMemoryWhileTheDataPlaneIsOn) {
  GrpcClientFactory f(GrpcTransportOptions{kToken, 1});
  std::shared_ptr<char> a = f.SharedMemory(size_t{1} << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 64, 0u);
  std::memset(a.get(), 1, size_t{1} << 20);
  EXPECT_EQ(f.SharedMemory(0), nullptr);
  // More than the arena (128 MiB by default): none.
  EXPECT_EQ(f.SharedMemory(data_plane::kDefaultArenaBytes + 1), nullptr);
  f.SetSharedMemory(0);
  EXPECT_EQ(f.SharedMemory(4096), nullptr);
  f.SetSharedMemory(size_t{2} << 20);
  EXPECT_NE(f.SharedMemory(4096), nullptr);
  EXPECT_NE(f.SharedMemory(size_t{2} << 20), nullptr);  // a new arena
  EXPECT_EQ(f.SharedMemory((size_t{2} << 20) + 1), nullptr);
  f.SetLocalSocket(false);
  EXPECT_EQ(f.SharedMemory(4096), nullptr);
  f.SetLocalSocket(true);
  f.SetDataPlane(false);
  EXPECT_EQ(f.SharedMemory(4096), nullptr);
  a.reset();  // its arena, no longer the factory's, goes with it
}

TEST_F(GrpcServerTest, MissingOrWrongTokenIsUnauthenticated) {
  for (const std::string token : {"", "wrong"}) {
    auto c = Client(token);
    PushResult r = Push(c.get(), MakePush(1, {3}, {1}));
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnauthenticated)
        << "token '" << token << "': " << r.status;
    auto p = Pull(c.get(), {3});
    EXPECT_EQ(p.status().code(), absl::StatusCode::kUnauthenticated);
    proto::FinishRequest f;
    f.set_worker_id(0);
    EXPECT_EQ(c->Finish(f, absl::Now() + absl::Seconds(10)).code(),
              absl::StatusCode::kUnauthenticated);
    proto::ServerControlRequest ctl;
    ctl.set_save_and_exit(true);
    EXPECT_EQ(c->Control(ctl, absl::Now() + absl::Seconds(10)).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(node_.Status().pushes(), 0);
  EXPECT_EQ(node_.table(0)->size(), 0u);
  // And the right token works, with the seq the rejected pushes carried.
  PushResult ok = Push(Client(kToken).get(), MakePush(1, {3}, {1}));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_FALSE(ok.duplicate);
}

TEST_F(GrpcServerTest, MalformedRequestIsInvalidArgument) {
  auto c = Client(kToken);
  auto bad_keys = MakePush(1, {3}, {1});
  bad_keys->mutable_keys()->resize(7);
  EXPECT_EQ(Push(c.get(), bad_keys).status.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Push(c.get(), MakePush(1, {9, 3}, {1, 1})).status.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Push(c.get(), MakePush(1, {3, 9}, {1})).status.code(),
            absl::StatusCode::kInvalidArgument);
  auto unknown_worker = MakePush(1, {3}, {1});
  unknown_worker->set_worker_id(5);
  EXPECT_EQ(Push(c.get(), unknown_worker).status.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Pull(c.get(), {9, 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A stale (older) epoch and a newer one keep their meaning across the
  // wire.
  auto stale = MakePush(1, {3}, {1});
  stale->set_epoch(0);
  absl::Status s = Push(c.get(), stale).status;
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsStaleEpoch(s)) << s;
  auto ahead = MakePush(1, {3}, {1});
  ahead->set_epoch(7);
  s = Push(c.get(), ahead).status;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(s), proto::REASON_VIEW_BEHIND) << s;
  EXPECT_EQ(node_.Status().pushes(), 0);
}

// Issue 9: a primary's batches share one ReplicateStream call; each gets
// its own answer, in the order sent, with its status and reason.
TEST_F(GrpcServerTest, ReplicationStreamAnswersEveryBatchInOrder) {
  auto c = Client(kToken);
  constexpr int kBatches = 16;
  absl::Mutex mu;
  std::vector<std::pair<int, absl::Status>> got;
  absl::Notification all;
  for (int i = 0; i < kBatches; ++i) {
    c->Replicate(Batch(i % 2 == 1), absl::Now() + absl::Seconds(10),
                 [&, i](const absl::Status& s, proto::ReplicateResponse*) {
                   absl::MutexLock l(&mu);
                   got.emplace_back(i, s);
                   if (got.size() == kBatches) all.Notify();
                 });
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(20)));
  absl::MutexLock l(&mu);
  for (int i = 0; i < kBatches; ++i) {
    EXPECT_EQ(got[i].first, i);
    if (i % 2 == 1) {
      EXPECT_TRUE(IsStaleEpoch(got[i].second)) << got[i].second;
    } else {
      EXPECT_TRUE(got[i].second.ok()) << got[i].second;
    }
  }
}

TEST_F(GrpcServerTest, ReplicationStreamNeedsTheToken) {
  absl::Status s = ReplicateNow(Client("wrong").get(), Batch(false));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
}

// A stream the server ended (EndStreams, as it does before shutting down)
// fails what was on it; the next batch opens a new call.
TEST_F(GrpcServerTest, ReplicationStreamReopensAfterTheServerEndedIt) {
  auto c = Client(kToken);
  ASSERT_TRUE(ReplicateNow(c.get(), Batch(false)).ok());
  service_->EndStreams();
  int failures = 0;
  absl::Status s;
  for (int attempt = 0; attempt < 3; ++attempt) {
    s = ReplicateNow(c.get(), Batch(false));
    if (s.ok()) break;
    ++failures;
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  }
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_LE(failures, 1);
}

// A backup that reads batches and never answers: the batch fails with
// DEADLINE_EXCEEDED at its deadline (as a unary call would), and the call
// is cancelled.
// Found by ElasticityTest: a joining server got the broadcast of a newer
// view before it had configured itself with its join's answer, refused it
// as "server id -1 not in the view", and the scheduler failed the job. Until
// it knows its id it answers UNAVAILABLE, which the scheduler retries.
TEST(GrpcServerJoinTest, ViewBeforeTheServerKnowsItsIdIsUnavailable) {
  InitLogging("T", "warn");
  ServerNode node;  // not configured: a server between JoinCluster and
                    // its Configure
  ServerService service(&node, kToken, [] {});
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeOnLoopback(&service, &port);
  ASSERT_NE(server, nullptr);
  GrpcClientFactory factory(GrpcTransportOptions{kToken, 1});
  auto client = factory.Server(absl::StrCat("127.0.0.1:", port));
  proto::ServerControlRequest req;
  *req.mutable_new_view() = OneServerView();
  auto early = client->Control(req, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable)
      << early.status();
  ASSERT_TRUE(node.Configure(0, OneServerView()).ok());
  auto later = client->Control(req, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(later.ok()) << later.status();
  server->Shutdown(std::chrono::system_clock::now());
  node.CancelAll(absl::CancelledError("test over"));
}

TEST(GrpcReplicationStreamTest, UnansweredBatchFailsAtItsDeadline) {
  class Silent : public proto::Server::CallbackService {
    grpc::ServerBidiReactor<proto::ReplicateRequest, proto::ReplicateResponse>*
    ReplicateStream(grpc::CallbackServerContext*) override {
      class Reader : public grpc::ServerBidiReactor<proto::ReplicateRequest,
                                                    proto::ReplicateResponse> {
       public:
        Reader() { StartRead(&req_); }
        void OnReadDone(bool ok) override {
          if (ok) {
            StartRead(&req_);
          } else {
            Finish(grpc::Status::OK);
          }
        }
        void OnDone() override { delete this; }

       private:
        proto::ReplicateRequest req_;
      };
      return new Reader;
    }
  } silent;
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeOnLoopback(&silent, &port);
  ASSERT_NE(server, nullptr);
  GrpcClientFactory factory(GrpcTransportOptions{"", 1});
  auto c = factory.Server(absl::StrCat("127.0.0.1:", port));
  const absl::Time t0 = absl::Now();
  absl::Status s = ReplicateNow(c.get(), Batch(false), absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(290));
  c.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

}  // namespace
}  // namespace ps
