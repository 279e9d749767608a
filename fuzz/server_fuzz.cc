// Fuzz target for the server's request handlers (server/server_node.h):
// a configured ServerNode on a fake clock gets the Push/Pull/ClockTick/
// Finish/SetConsistency/Replicate calls of a ps.fuzz.ServerInput (fuzz_input.proto)
// parsed from the input, with fake-clock advances and Tick()s in between.
// Its two tables' optimizers, dims and layout come from the input too
// (VariantOf), so that every optimizer's apply loop is fuzzed.
// Checks, besides "no crash": every `done` runs exactly once (at the latest
// at CancelAll), an OK pull answers n * dim values, an error never has
// code OK/UNKNOWN/INTERNAL (Replicate: UNKNOWN), and at the end no table
// holds a NaN or infinite weight or optimizer state.
#include <cmath>
#include <cstdio>
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

// The two tables' shapes, by ServerInput.tables: each optimizer's apply
// loop (FTRL's vector lanes, SGD's long rows) and both table layouts get
// pushes and pulls. Variant 0 is the first one the corpus was written for.
struct TableShape {
  const char* optimizer;
  int dim;
};
struct TableVariant {
  TableShape tables[2];
  uint64_t dense_ids;  // the dense-id layout below this id (0: maps only)
};

TableVariant VariantOf(const ServerInput& in) {
  static constexpr const char* kOptimizers[4][2] = {
      {"sgd", "adagrad"}, {"ftrl", "adam"}, {"adagrad", "ftrl"}, {"adam", "sgd"}};
  const uint32_t v = in.tables();
  TableVariant t;
  for (int i = 0; i < 2; ++i) {
    t.tables[i].optimizer = kOptimizers[v % 4][i];
    t.tables[i].dim = i == 0 ? 1 : 3;
  }
  // At least kLongRow (table.cc) floats a key: SGD's long-row loop.
  if ((v & 4) != 0) t.tables[1].dim = 300;
  t.dense_ids = (v & 8) != 0 ? 4096 : 0;
  return t;
}

proto::ClusterView MakeView(const ServerInput& in,
                            const TableVariant& variant) {
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
    tc->set_dim(variant.tables[t].dim);
    tc->set_dense_ids(variant.dense_ids);
    proto::OptimizerConfig* o = tc->mutable_optimizer();
    o->set_name(variant.tables[t].optimizer);
    o->set_learning_rate(0.5f);
    o->set_initial_accumulator(0.1f);  // adagrad: must be > 0
    o->set_alpha(0.1f);                // ftrl
    o->set_beta(1.0f);
    o->set_l1(0.01f);
    o->set_l2(0.01f);
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

// A `done` that must run exactly once, with a good code.
ServerNode::Done Answer(const std::shared_ptr<Tracker>& tracker) {
  auto ran = std::make_shared<bool>(false);
  return [tracker, ran](const absl::Status& s) {
    PS_FUZZ_CHECK(!*ran);
    *ran = true;
    --tracker->outstanding;
    PS_FUZZ_CHECK(s.ok() || GoodErrorCode(s));
  };
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
    const TableVariant variant = VariantOf(in);
    const absl::Status configured = node.Configure(0, MakeView(in, variant));
    // The view is valid by construction but for the input's mode: a target
    // whose every input stopped here would fuzz nothing (as this one did
    // until 2026-12-03: adagrad's initial accumulator was left at 0).
    PS_FUZZ_CHECK(configured.ok() ||
                  !proto::ConsistencyMode_IsValid(in.mode()));
    if (!configured.ok()) return 0;
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
                    [tracker, req, resp, ran,
                     variant](const absl::Status& s) {
                      PS_FUZZ_CHECK(!*ran);
                      *ran = true;
                      --tracker->outstanding;
                      PS_FUZZ_CHECK(s.ok() || GoodErrorCode(s));
                      if (s.ok()) {
                        // Keys sent, or a cached list of num_keys keys
                        // (as ServerNode::ResolveKeys tells them apart).
                        const bool cached = req->key_list() != 0 &&
                                            req->keys().empty() &&
                                            req->num_keys() != 0;
                        const size_t n = cached ? req->num_keys()
                                                : req->keys().size() / 8;
                        const int t = req->table();
                        PS_FUZZ_CHECK(t == 0 || t == 1);
                        PS_FUZZ_CHECK(resp->vals().size() ==
                                      n * variant.tables[t].dim *
                                          sizeof(float));
                      }
                    });
          break;
        }
        // Clocks and finishes by callback, as pushes: with backups their
        // answers wait for acknowledgements no backup here sends (the
        // blocking forms then never return; CancelAll answers them).
        case ServerCall::kClock: {
          ++tracker->outstanding;
          node.ClockTick(call.clock(), Answer(tracker));
          break;
        }
        case ServerCall::kFinish: {
          ++tracker->outstanding;
          node.Finish(call.finish(), Answer(tracker));
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
      // Whatever a peer sent, every range's consistency state is whole.
      const absl::Status inv = node.CheckInvariants();
      if (!inv.ok()) std::fprintf(stderr, "%s\n", inv.ToString().c_str());
      PS_FUZZ_CHECK(inv.ok());
    }
    (void)node.Status();
    // Whatever the pushes held (finite, as the server checks, but of any
    // size), no weight or optimizer state is NaN or infinite.
    for (int t = 0; t < 2; ++t) {
      const Table* table = node.table(t);
      PS_FUZZ_CHECK(table != nullptr);
      std::vector<uint64_t> keys;
      std::vector<float> entries;
      for (int r = 0; r < table->num_ranges(); ++r) {
        table->ExportRange(r, &keys, &entries);
        for (float x : entries) PS_FUZZ_CHECK(std::isfinite(x));
      }
    }
    node.CancelAll(absl::CancelledError("fuzz: shutdown"));
  }
  // Every request got its answer by the time the node is gone.
  PS_FUZZ_CHECK(tracker->outstanding == 0);
  return 0;
}

}  // namespace ps::fuzz
