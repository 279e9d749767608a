// Fuzz target for the server's request handlers (server/server_node.h):
// a configured ServerNode on a fake clock gets the Push/Pull/ClockTick/
// Finish/SetConsistency/Replicate calls of a ps.fuzz.ServerInput (fuzz_input.proto)
// parsed from the input, with fake-clock advances and Tick()s in between.
// Checks, besides "no crash": every `done` runs exactly once (at the latest
// at CancelAll), an OK pull answers n * dim values, an error never has
// code OK/UNKNOWN/INTERNAL (Replicate: UNKNOWN).
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "common/logging.h"
#include "common/routing.h"
#include "fuzz/fuzz_input.pb.h"
#include "fuzz/fuzz_util.h"
#include "server/server_node.h"

namespace ps::fuzz {
namespace {

constexpr int kDims[] = {1, 3};

proto::ClusterView MakeView(const ServerInput& in) {
  const int servers = 1 + static_cast<int>(in.servers() % 3);
  const int workers = 1 + static_cast<int>(in.workers() % 4);
  proto::ClusterView v;
  v.set_epoch(1);
  std::vector<int> ids;
  for (int i = 0; i < servers; ++i) ids.push_back(i);
  const int replicas = static_cast<int>(in.replicas() % servers);
  *v.mutable_routing() =
      BuildHashRing(ids, /*vnodes=*/4, /*epoch=*/1, replicas);
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
  v.mutable_consistency()->set_mode(in.mode());
  v.mutable_consistency()->set_tau(in.tau());
  for (int t = 0; t < 2; ++t) {
    proto::TableConfig* tc = v.add_tables();
    tc->set_id(t);
    tc->set_name(t == 0 ? "weights" : "embeddings");
    tc->set_dim(kDims[t]);
    tc->mutable_optimizer()->set_name(t == 0 ? "sgd" : "adagrad");
    tc->mutable_optimizer()->set_learning_rate(0.5f);
  }
  return v;
}

// Counts outstanding callbacks; each call owns its request and response
// until its `done` runs.
struct Tracker {
  int64_t outstanding = 0;
};

bool GoodErrorCode(const absl::Status& s) {
  return s.code() != absl::StatusCode::kUnknown &&
         s.code() != absl::StatusCode::kInternal;
}

}  // namespace

void QuietProtobuf() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
}

int Server(const uint8_t* data, size_t size) {
  static bool quiet = (InitLogging("fuzz", "off"), QuietProtobuf(), true);
  (void)quiet;
  ServerInput in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  FakeClock clock;
  auto tracker = std::make_shared<Tracker>();
  {
    ServerNode node(&clock);
    if (!node.Configure(0, MakeView(in)).ok()) return 0;
    for (const ServerCall& call : in.calls()) {
      switch (call.call_case()) {
        case ServerCall::kPush: {
          auto req = std::make_shared<proto::PushRequest>(call.push());
          auto resp = std::make_shared<proto::PushResponse>();
          auto ran = std::make_shared<bool>(false);
          ++tracker->outstanding;
          node.Push(*req, resp.get(),
                    [tracker, req, resp, ran](const absl::Status& s) {
                      PS_FUZZ_CHECK(!*ran);
                      *ran = true;
                      --tracker->outstanding;
                      PS_FUZZ_CHECK(s.ok() || GoodErrorCode(s));
                    });
          break;
        }
        case ServerCall::kPull: {
          auto req = std::make_shared<proto::PullRequest>(call.pull());
          auto resp = std::make_shared<proto::PullResponse>();
          auto ran = std::make_shared<bool>(false);
          ++tracker->outstanding;
          node.Pull(*req, resp.get(),
                    [tracker, req, resp, ran](const absl::Status& s) {
                      PS_FUZZ_CHECK(!*ran);
                      *ran = true;
                      --tracker->outstanding;
                      PS_FUZZ_CHECK(s.ok() || GoodErrorCode(s));
                      if (s.ok()) {
                        const size_t n = req->keys().size() / 8;
                        const int t = req->table();
                        PS_FUZZ_CHECK(t == 0 || t == 1);
                        PS_FUZZ_CHECK(resp->vals().size() ==
                                      n * kDims[t] * sizeof(float));
                      }
                    });
          break;
        }
        case ServerCall::kClock: {
          absl::Status s = node.ClockTick(call.clock());
          PS_FUZZ_CHECK(s.ok() || GoodErrorCode(s));
          break;
        }
        case ServerCall::kFinish: {
          absl::Status s = node.Finish(call.finish());
          PS_FUZZ_CHECK(s.ok() || GoodErrorCode(s));
          break;
        }
        case ServerCall::kConsistency: {
          absl::Status s = node.SetConsistency(call.consistency());
          PS_FUZZ_CHECK(s.ok() || GoodErrorCode(s));
          break;
        }
        case ServerCall::kReplicate: {
          // INTERNAL is a legitimate answer here: a replica that diverged
          // from its primary says so (and gets a fresh copy).
          absl::Status s = node.Replicate(call.replicate());
          PS_FUZZ_CHECK(s.code() != absl::StatusCode::kUnknown);
          break;
        }
        case ServerCall::kAdvanceMs:
          clock.Advance(absl::Milliseconds(call.advance_ms() % 100000));
          node.Tick();
          break;
        case ServerCall::CALL_NOT_SET:
          break;
      }
    }
    (void)node.Status();
    node.CancelAll(absl::CancelledError("fuzz: shutdown"));
  }
  // Every request got its answer by the time the node is gone.
  PS_FUZZ_CHECK(tracker->outstanding == 0);
  return 0;
}

}  // namespace ps::fuzz
