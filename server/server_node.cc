#include "server/server_node.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/notification.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bytes.h"
#include "common/config.h"
#include "common/key_order.h"
#include "common/logging.h"
#include "common/proto_span.h"
#include "common/status_macros.h"
#include "common/value_codec.h"
#include "server/checkpoint.h"
#include "transport/transport.h"

namespace ps {
namespace {

// The least a thread's share of a push or pull may be, in values (keys *
// dim), before it is split across threads (common/parallel.h): a part must
// outweigh waking a helper (tens of microseconds on a busy machine). A push
// costs about 10 ns a value (the hash lookup and the update), a pull about
// half that.
constexpr size_t kMinParallelApplyValues = 16384;
constexpr size_t kMinParallelPullValues = 32768;

int64_t TauOf(const proto::ConsistencyConfig& c) {
  switch (c.mode()) {
    case proto::MODE_BSP:
      return 0;
    case proto::MODE_ASP:
      return kInfiniteTau;
    default:
      return c.tau() < 0 ? kInfiniteTau : c.tau();
  }
}

}  // namespace

absl::Status ServerNode::NotConfigured() {
  return ErrorWithReason(absl::StatusCode::kUnavailable,
                         proto::REASON_VIEW_BEHIND,
                         "server not configured yet (it has installed no "
                         "view): resend");
}

ServerNode::ServerNode(Clock* clock, ServerLimits limits,
                       int apply_parallelism)
    : clock_(clock),
      limits_(limits),
      apply_runner_(apply_parallelism),
      key_cache_(limits.key_cache_bytes) {}

namespace {

absl::Status ClockTooFar(int worker, int64_t clock, int64_t completed,
                         int64_t max_ahead) {
  return ErrorWithReason(
      absl::StatusCode::kOutOfRange, proto::REASON_CLOCK_TOO_FAR,
      absl::StrCat("clock ", clock, " of worker ", worker, " is more than ",
                   max_ahead, " clocks ahead of the ", completed,
                   " it completed here"));
}

using table_internal::AllFinite;

// A push's values as float32, decoded from the request's encoding and
// codec (issue 10: filters and compression) when it has them.
struct PushValues {
  absl::string_view bytes;  // float32[keys * dim]
  std::string raw;          // decompressed, when it was compressed
  std::unique_ptr<float[]> decoded;
};

// Decodes `req`'s values for `nkeys` keys of dimension `dim` into *out
// (without a copy when they travel as plain float32). INVALID_ARGUMENT for
// a size or encoding that does not match, a corrupt payload, or one that
// would decode to more than `max_decoded` bytes.
absl::Status DecodePushValues(const proto::PushRequest& req,
                              absl::string_view vals, size_t nkeys, int dim,
                              size_t max_decoded, PushValues* out) {
  const size_t floats = nkeys * static_cast<size_t>(dim);
  const proto::ValueEncoding enc = req.value_encoding();
  const proto::ValueCodec codec = req.vals_codec();
  if (enc == proto::VALUES_F32 && codec == proto::CODEC_NONE) {
    if (vals.size() != floats * sizeof(float)) {
      return absl::InvalidArgumentError(
          absl::StrCat("vals: expected ", floats, " floats, got ",
                       vals.size() / 4.0));
    }
    out->bytes = vals;
    return absl::OkStatus();
  }
  if (!proto::ValueEncoding_IsValid(enc)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown value_encoding ", static_cast<int>(enc)));
  }
  // What a request without encoding or codec could carry at most: a small
  // compressed request must not make the server allocate more.
  if (floats > max_decoded / sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vals: ", nkeys, " keys of dim ", dim, " decode to more than ",
        max_decoded, " bytes"));
  }
  const size_t encoded = floats * EncodedValueBytes(enc);
  absl::string_view src = vals;
  if (codec != proto::CODEC_NONE) {
    if (req.vals_raw_bytes() != encoded) {
      return absl::InvalidArgumentError(
          absl::StrCat("vals_raw_bytes: expected ", encoded, ", got ",
                       req.vals_raw_bytes()));
    }
    PS_RETURN_IF_ERROR(Decompress(codec, vals, encoded, &out->raw));
    src = out->raw;
  } else if (src.size() != encoded) {
    return absl::InvalidArgumentError(
        absl::StrCat("vals: expected ", encoded, " bytes for ", floats,
                     " values, got ", src.size()));
  }
  if (enc == proto::VALUES_F32) {
    out->bytes = src;
    return absl::OkStatus();
  }
  out->decoded.reset(new float[floats]);  // uninitialised: all written
  float* d = out->decoded.get();
  if (enc == proto::VALUES_F16) {
    PS_RETURN_IF_ERROR(DecodeValues(enc, src.data(), floats, 0, d));
  } else {
    // int8: a scale per segment.
    if (req.segments_size() == 0 && floats > 0) {
      return absl::InvalidArgumentError("int8 values need segments");
    }
    size_t at = 0;
    for (const proto::PushSegment& seg : req.segments()) {
      const size_t n = static_cast<size_t>(seg.num_keys()) * dim;
      if (n > floats - at) {
        return absl::InvalidArgumentError(
            "int8 values: segments hold more keys than the request");
      }
      PS_RETURN_IF_ERROR(
          DecodeValues(enc, src.data() + at, n, seg.scale(), d + at));
      at += n;
    }
    if (at != floats) {
      return absl::InvalidArgumentError(
          "int8 values: segments hold fewer keys than the request");
    }
  }
  out->bytes = absl::string_view(reinterpret_cast<const char*>(d),
                                 floats * sizeof(float));
  return absl::OkStatus();
}

}  // namespace

ServerNode::~ServerNode() {
  {
    absl::MutexLock l(&life_->mu);
    life_->alive = false;
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(life_->mu) {
      return life_->running == 0;
    };
    life_->mu.Await(absl::Condition(&idle));
  }
  std::list<AckWait> waits;
  {
    absl::MutexLock l(&mu_);
    waits.swap(ack_waits_);
  }
  for (AckWait& w : waits) RunWait(w, absl::CancelledError("server shutting down"));
  CancelAll(absl::CancelledError("server shutting down"));
}

int ServerNode::id() const {
  absl::MutexLock l(&mu_);
  return id_;
}

std::vector<int> ServerNode::OwnedRanges() const {
  absl::MutexLock l(&mu_);
  return owned_;
}

int64_t ServerNode::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

const Table* ServerNode::table(int id) const {
  absl::MutexLock l(&mu_);
  if (id < 0 || id >= static_cast<int>(tables_.size())) return nullptr;
  return tables_[id].get();
}

absl::Status ServerNode::Configure(
    int server_id, const proto::ClusterView& view,
    google::protobuf::Map<int32_t, int64_t>* join_clocks) {
  PS_ASSIGN_OR_RETURN(Routing routing, Routing::FromProto(view.routing()));
  if (view.workers_size() == 0) {
    return absl::InvalidArgumentError("cluster view has no workers");
  }
  if (!proto::ConsistencyMode_IsValid(view.consistency().mode())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown consistency mode ", view.consistency().mode()));
  }
  if (server_id < 0 || server_id >= std::max(1, routing.num_servers())) {
    return absl::InvalidArgumentError(
        absl::StrCat("server id ", server_id, " not in the view"));
  }
  RangeActionList actions;
  std::vector<int> finished;
  std::optional<int64_t> new_tau;
  std::vector<int> moved_away;  // owned before this view, not now
  {
    absl::MutexLock l(&mu_);
    if (consistency_ == nullptr) {
      for (int i = 0; i < view.tables_size(); ++i) {
        const proto::TableConfig& tc = view.tables(i);
        if (tc.id() != i) {
          return absl::InvalidArgumentError("table ids must be 0..n-1");
        }
        TableSpec spec;
        spec.id = tc.id();
        spec.dim = tc.dim();
        spec.optimizer = OptimizerFromProto(tc.optimizer());
        spec.init_scale = tc.optimizer().init_scale();
        spec.dense_ids = tc.dense_ids();
        PS_ASSIGN_OR_RETURN(auto table,
                            Table::Create(spec, routing.num_ranges()));
        if (spec.dense_ids != 0) {
          PS_LOG_DEBUG("S[{}] table {} ({}): feature ids below {} in the "
                       "dense-id layout",
                       server_id, spec.id, tc.name(), spec.dense_ids);
        }
        tables_.push_back(std::move(table));
      }
      // Checkpoints (issue 9): load this server's keys before any request
      // is admitted (consistency_ is still null).
      if (!view.restore_from().empty()) {
        absl::Status s = RestoreCheckpoint(view.restore_from(), server_id,
                                           routing, tables_, nullptr);
        if (!s.ok()) {
          tables_.clear();
          return s;
        }
      }
      consistency_ = std::make_unique<ConsistencyController>(
          view.workers_size(), routing.num_ranges(),
          TauOf(view.consistency()), clock_,
          limits_.max_pending_pulls_per_worker);
      workers_.resize(view.workers_size());
      mode_ = view.consistency().mode();
      RangeLimits rl;
      rl.max_clock_ahead = limits_.max_clock_ahead;
      rl.max_unsettled_seqs = limits_.max_unsettled_seqs;
      for (int r = 0; r < routing.num_ranges(); ++r) {
        PS_ASSIGN_OR_RETURN(
            RangeState st,
            RangeState::Create(view.workers_size(),
                               mode_ == proto::MODE_BSP, rl));
        ranges_.push_back(std::move(st));
      }
    } else {
      if (view.epoch() < epoch_) {
        // A broadcast overtaken by a newer view (the scheduler publishes a
        // view, e.g. one with a joining node, while it still tells the
        // servers an older one; this server caught up first). Views only
        // grow on the scheduler, so the newer one holds everything this
        // one does: nothing to adopt. A joining worker's clock is answered
        // from the ranges as they are.
        if (join_clocks != nullptr) {
          for (int i = 0; i < view.workers_size(); ++i) {
            if (view.workers(i).joining()) (*join_clocks)[i] = JoinClockLocked(i);
          }
        }
        PS_LOG_INFO("S[{}] at view epoch {}: told epoch {} late (nothing to "
                    "adopt)",
                    id_, epoch_, view.epoch());
        return absl::OkStatus();
      }
      if (routing.num_ranges() != routing_->num_ranges() ||
          view.workers_size() < static_cast<int>(workers_.size())) {
        return absl::UnimplementedError(
            "changing the ranges or removing workers in a running job");
      }
      if (view.has_consistency() &&
          view.consistency().mode() != proto::MODE_UNKNOWN) {
        if ((mode_ == proto::MODE_BSP) !=
            (view.consistency().mode() == proto::MODE_BSP)) {
          return absl::FailedPreconditionError(
              "switching to or from bsp while running is not supported");
        }
        mode_ = view.consistency().mode();
        new_tau = TauOf(view.consistency());
      }
    }
    const std::shared_ptr<const Routing> old_routing = routing_;
    id_ = server_id;
    epoch_ = view.epoch();
    model_dir_ = view.model_dir();
    routing_ = std::make_shared<const Routing>(std::move(routing));
    for (int r : owned_) {
      if (routing_->OwnerOfRange(r) != id_) moved_away.push_back(r);
    }
    owned_ = routing_->RangesOf(id_);
    ReconfigureReplicationLocked(old_routing.get());
    // A BSP range this server does not own follows its primary's applies
    // (replication after aggregation); one it owns now (promoted) applies
    // every clock complete here.
    for (int r = 0; r < static_cast<int>(ranges_.size()); ++r) {
      const bool follow = routing_->OwnerOfRange(r) != id_;
      if (ranges_[r].follower() == follow) continue;
      RangeActions a;
      ranges_[r].SetFollower(follow, &a);
      ApplyBsp(r, &a);
      AddActions(&actions, r, &a);
    }
    JoinWorkersLocked(view, join_clocks, &actions);
    for (const proto::NodeInfo& w : view.workers()) {
      if (w.id() < 0 || w.id() >= static_cast<int>(workers_.size())) continue;
      if (w.state() != proto::NODE_DEAD) continue;
      const bool newly = !workers_[w.id()].dead;
      if (newly) {
        workers_[w.id()].dead = true;
        finished.push_back(w.id());
      }
      for (int r = 0; r < static_cast<int>(ranges_.size()); ++r) {
        const bool owner = routing_->OwnerOfRange(r) == id_;
        // A backup learns of the death from its primary's log (in order
        // with the pushes); the owner logs it; SetDead is idempotent, so a
        // promoted range catches up with deaths its old primary never sent.
        if (routing_->IsBackupOf(r, id_)) continue;
        if (!newly && (!owner || ranges_[r].Dead(w.id()))) continue;
        RangeActions a;
        ranges_[r].SetDead(w.id(), &a).IgnoreError();  // id checked
        ApplyBsp(r, &a);
        if (owner && HasBackups(r)) {
          proto::ReplicaEntry e;
          e.set_dead_worker(w.id());
          LogEntry(r, std::move(e), nullptr);
        }
        AddActions(&actions, r, &a);
      }
    }
    FlushBspClocksLocked();
  }
  if (new_tau.has_value()) consistency_->SetTau(*new_tau);
  if (!moved_away.empty()) {
    // Elasticity (issue 9): pulls waiting here for ranges that moved away
    // would wait for clocks this server no longer gets; the workers pull
    // them again from the new owners.
    const int n = consistency_->CancelRanges(
        moved_away,
        ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                        proto::REASON_STALE_EPOCH,
                        absl::StrCat("stale-epoch: ", moved_away.size(),
                                     " range(s) moved off S[", server_id,
                                     "] at epoch ", view.epoch())));
    PS_LOG_INFO("S[{}] epoch {}: {} range(s) moved away ({} waiting pulls "
                "sent to their new owners)",
                server_id, view.epoch(), moved_away.size(), n);
  }
  Publish(actions, finished);
  TakeCopies();
  Kick();
  return absl::OkStatus();
}

int64_t ServerNode::JoinClockLocked(int worker) const {
  int64_t at = 0;
  for (int r : owned_) {
    if (ranges_[r].num_workers() > worker) {
      at = std::max(at, ranges_[r].Completed(worker));
    }
  }
  return at;
}

void ServerNode::JoinWorkersLocked(
    const proto::ClusterView& view,
    google::protobuf::Map<int32_t, int64_t>* join_clocks,
    RangeActionList* actions) {
  // View workers are in id order; ids below workers_.size() that never
  // joined (the job's own) have nothing to do here.
  for (int i = 0; i < view.workers_size(); ++i) {
    const proto::NodeInfo& w = view.workers(i);
    if (!w.joining() && w.start_clock() <= 0) continue;
    const int64_t clock = w.joining() ? -1 : w.start_clock();
    for (int r : owned_) {
      RangeState& range = ranges_[r];
      if (range.num_workers() < i) {
        PS_LOG_ERROR("S[{}] range {} has {} workers: cannot add W[{}]", id_,
                     r, range.num_workers(), i);
        continue;
      }
      const int64_t before = range.num_workers() == i ? -1 : range.Completed(i);
      RangeActions a;
      if (absl::Status st = range.Join(i, clock, &a); !st.ok()) {
        PS_LOG_WARN("S[{}] range {}: W[{}] joining at clock {}: {}", id_, r, i,
                    clock, st.ToString());
        continue;
      }
      if (range.Completed(i) == before) continue;  // a view seen again
      ApplyBsp(r, &a);
      if (HasBackups(r)) {
        // In order with the pushes, as a death is: the backups add the
        // worker at the same clock.
        proto::ReplicaEntry e;
        e.mutable_join()->set_worker(i);
        e.mutable_join()->set_clock(range.Completed(i));
        LogEntry(r, std::move(e), nullptr);
      }
      AddActions(actions, r, &a);
    }
    if (w.joining() && join_clocks != nullptr) {
      (*join_clocks)[i] = JoinClockLocked(i);
    }
  }
  const int known = static_cast<int>(workers_.size());
  if (view.workers_size() <= known) return;
  workers_.resize(view.workers_size());
  for (int i = known; i < view.workers_size(); ++i) {
    // Its entries where a range has it already (owned ranges, and backed-up
    // ones whose log brought the join); 0 elsewhere until it is added.
    std::vector<int64_t> entries(ranges_.size(), 0);
    for (size_t r = 0; r < ranges_.size(); ++r) {
      entries[r] = ranges_[r].Entry(i);
    }
    consistency_->AddWorker(entries);
    PS_LOG_INFO("S[{}] epoch {}: W[{}] joined the job", id_, view.epoch(), i);
  }
}

absl::Status ServerNode::Admit(int worker_id, int64_t epoch, int table,
                              Admitted* a) const {
  if (consistency_ == nullptr) {
    return NotConfigured();
  }
  // Closed (CancelAll: the server is going away): a pull admitted now would
  // wait with nothing left to end its wait (the ticker that expires waits
  // has stopped), and its gRPC call would hold the server's Shutdown.
  if (!closed_.ok()) return closed_;
  if (!lost_.ok()) return lost_;
  if (epoch > epoch_) {
    // Bug "A server that misses one view broadcast": the worker already has
    // a newer view than this server; the server catches up (its heartbeat
    // carries the scheduler's epoch), the worker resends the same request.
    // Checked before the worker id: a worker that joined the running job
    // (issue 9) is unknown to a server behind its view.
    return ErrorWithReason(absl::StatusCode::kUnavailable,
                           proto::REASON_VIEW_BEHIND,
                           absl::StrCat("view behind: request epoch ", epoch,
                                        ", server epoch ", epoch_));
  }
  if (worker_id < 0 || worker_id >= static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown worker id ", worker_id));
  }
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown table ", table));
  }
  if (epoch < epoch_) {
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                           proto::REASON_STALE_EPOCH,
                           absl::StrCat("stale-epoch: request epoch ", epoch,
                                        ", server epoch ", epoch_));
  }
  a->table = tables_[table].get();
  a->routing = routing_;
  a->id = id_;
  a->bsp = mode_ == proto::MODE_BSP;
  return absl::OkStatus();
}

absl::Status ServerNode::CheckKeys(absl::string_view keys, const Admitted& a,
                                   std::vector<RangeRun>* runs) {
  if (!ByteCountOk<uint64_t>(keys)) {
    return absl::InvalidArgumentError("keys: byte count not a multiple of 8");
  }
  absl::Span<const uint64_t> k = ViewAs<uint64_t>(keys);
  if (const size_t i = FirstNotAscending(k.data(), k.size()); i < k.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys not ascending and unique at index ", i));
  }
  bool owned = true;
  a.routing->ForEachRangeRun(k, [&](int range, size_t first, size_t last) {
    if (a.routing->OwnerOfRange(range) != a.id) owned = false;
    if (runs != nullptr) runs->push_back(RangeRun{range, first, last});
  });
  if (!owned) {
    return ErrorWithReason(
        absl::StatusCode::kFailedPrecondition, proto::REASON_STALE_EPOCH,
        absl::StrCat("stale-epoch: keys not owned by server ", a.id));
  }
  return absl::OkStatus();
}

absl::Status ServerNode::StillOwnedLocked(
    const RequestKeys& rk, const std::shared_ptr<const Routing>& admitted) const {
  if (routing_ == admitted) return lost_;  // CheckKeys found them owned
  for (const RangeRun& run : rk.runs) {
    if (routing_->OwnerOfRange(run.range) != id_) {
      return ErrorWithReason(
          absl::StatusCode::kFailedPrecondition, proto::REASON_STALE_EPOCH,
          absl::StrCat("stale-epoch: range ", run.range, " moved off S[", id_,
                       "] at epoch ", epoch_, " while a pull waited"));
    }
  }
  return lost_;
}

absl::Status ServerNode::ResolveKeys(int worker, int table, uint64_t key_list,
                                     uint32_t num_keys, absl::string_view keys,
                                     const Admitted& a,
                                     RequestKeys* out) {
  out->table = table;
  if (key_list == 0 || !keys.empty() || num_keys == 0) {
    PS_RETURN_IF_ERROR(CheckKeys(keys, a, &out->runs));
    out->keys = ViewAs<uint64_t>(keys);
    if (key_list != 0 && !out->keys.empty()) out->keep = key_list;
    return absl::OkStatus();
  }
  out->cached = key_cache_.Find(worker, key_list);
  if (out->cached == nullptr) {
    return ErrorWithReason(
        absl::StatusCode::kFailedPrecondition, proto::REASON_KEYS_NOT_CACHED,
        absl::StrCat("key list ", key_list, " of worker ", worker,
                     " is not cached on server ", a.id, "; resend its keys"));
  }
  const KeyList& l = *out->cached;
  if (l.table != table || l.keys.size() != num_keys) {
    // Ids name one list each: this is a client bug, not an eviction.
    return absl::InvalidArgumentError(absl::StrCat(
        "key list ", key_list, " has ", l.keys.size(), " keys of table ",
        l.table, ", the request says ", num_keys, " of table ", table));
  }
  for (const RangeRun& run : l.runs) {
    // Boundaries never change in a job; owners do.
    if (a.routing->OwnerOfRange(run.range) != a.id) {
      return ErrorWithReason(
          absl::StatusCode::kFailedPrecondition, proto::REASON_STALE_EPOCH,
          absl::StrCat("stale-epoch: keys not owned by server ", a.id));
    }
  }
  out->keys = l.keys;
  out->runs = l.runs;
  out->keep = key_list;
  return absl::OkStatus();
}

std::pair<uint32_t*, uint64_t*> ServerNode::Resolving(RequestKeys* rk,
                                                      int table, size_t run) {
  if (rk->keep == 0) return {nullptr, nullptr};
  if (rk->resolved == nullptr) {
    if (rk->cached != nullptr) {
      rk->resolved = std::make_shared<KeyList>(*rk->cached);
    } else {
      rk->resolved = std::make_shared<KeyList>();
      rk->resolved->table = table;
      rk->resolved->keys.assign(rk->keys.begin(), rk->keys.end());
      rk->resolved->runs = rk->runs;
    }
    KeyList& l = *rk->resolved;
    l.slots.resize(l.keys.size(), Table::kNoSlot);
    l.generations.resize(l.runs.size(), 0);  // 0: never a generation
  }
  KeyList& l = *rk->resolved;
  return {l.slots.data() + l.runs[run].first, &l.generations[run]};
}

void ServerNode::KeepResolved(int worker, RequestKeys* rk) {
  if (rk->keep == 0) return;
  if (rk->resolved != nullptr) {
    // Every run resolved (a generation is never 0) and every key found or
    // made: its cached pushes skip PushSlots' bounds check.
    KeyList& l = *rk->resolved;
    l.complete =
        std::find(l.slots.begin(), l.slots.end(), Table::kNoSlot) ==
            l.slots.end() &&
        std::find(l.generations.begin(), l.generations.end(), uint64_t{0}) ==
            l.generations.end();
    l.consecutive.assign(l.complete ? l.runs.size() : 0, 0);
    for (size_t r = 0; r < l.consecutive.size(); ++r) {
      const uint32_t* s = l.slots.data() + l.runs[r].first;
      const size_t n = l.runs[r].last - l.runs[r].first;
      bool ok = true;
      for (size_t k = 1; k < n; ++k) {
        ok &= s[k] == s[0] + static_cast<uint32_t>(k);
      }
      l.consecutive[r] = ok ? 1 : 0;
    }
    key_cache_.Put(worker, rk->keep, std::move(rk->resolved), rk->window);
  } else if (rk->cached == nullptr) {
    // Kept unresolved (nothing was looked up: e.g. every run a duplicate).
    auto l = std::make_shared<KeyList>();
    l->table = rk->table;
    l->keys.assign(rk->keys.begin(), rk->keys.end());
    l->runs = rk->runs;
    key_cache_.Put(worker, rk->keep, std::move(l), rk->window);
  }
}

bool ServerNode::ValuesFinite(absl::string_view vals) {
  constexpr size_t kPartBytes = 256 * 1024;
  const size_t n = vals.size() / sizeof(float);
  if (vals.size() < 2 * kPartBytes || apply_runner_.parallelism() < 2) {
    return AllFinite(vals);
  }
  const int parts = static_cast<int>(std::min<size_t>(
      vals.size() / kPartBytes, 4 * size_t{static_cast<size_t>(
                                        apply_runner_.parallelism())}));
  std::atomic<bool> finite{true};
  apply_runner_.Run(parts, [&](int i) {
    const size_t first = n * static_cast<size_t>(i) / static_cast<size_t>(parts);
    const size_t last =
        n * static_cast<size_t>(i + 1) / static_cast<size_t>(parts);
    if (!AllFinite(vals.substr(first * sizeof(float),
                               (last - first) * sizeof(float)))) {
      finite.store(false, std::memory_order_relaxed);
    }
  });
  // A trailing partial float (a malformed count, refused elsewhere) is not
  // a value.
  return finite.load(std::memory_order_relaxed);
}

void ServerNode::Push(const proto::PushRequest& req, absl::string_view keys_in,
                      absl::string_view vals_in, proto::PushResponse* resp,
                      Done done) {
  Admitted adm;
  absl::Status s;
  bool values_logged = false;  // replication sends the values themselves
  {
    absl::MutexLock l(&mu_);
    s = Admit(req.worker_id(), req.epoch(), req.table(), &adm);
    values_logged =
        routing_ != nullptr && routing_->replicas() > 0 && !DeltasLocked();
  }
  // The O(keys) work stays outside mu_, which every request takes.
  RequestKeys rk;
  if (s.ok()) {
    s = ResolveKeys(req.worker_id(), req.table(), req.key_list(),
                    req.num_keys(), keys_in, adm, &rk);
    rk.window = req.key_lists();
  }
  const std::vector<RangeRun>& runs = rk.runs;
  PushValues pv;  // the values as float32
  if (s.ok()) {
    s = DecodePushValues(req, vals_in, rk.keys.size(), adm.table->dim(),
                         limits_.max_decoded_value_bytes, &pv);
  }
  const absl::string_view vals = pv.bytes;
  // A dense push of one range (SGD on long rows) has its values checked by
  // the table as it applies them, which puts the rows back and refuses it
  // whole on a NaN: one pass over 4 MiB of values instead of two (the
  // check alone cost as much as the update). Only where nothing but the
  // apply reads the values: not BSP (buffered), not where replication
  // sends the values themselves, not the legacy per-clock bookkeeping.
  bool check_in_apply = s.ok() && !adm.bsp && !values_logged &&
                        rk.runs.size() == 1 && req.segments_size() == 1 &&
                        adm.table->ChecksFiniteWhileApplying();
  const auto non_finite = [&req] {
    return ErrorWithReason(absl::StatusCode::kInvalidArgument,
                           proto::REASON_NON_FINITE,
                           absl::StrCat("push of worker ", req.worker_id(),
                                        " has NaN or infinite values"));
  };
  if (s.ok()) {
    if (req.clock() < 0) {
      s = absl::InvalidArgumentError("negative clock");
    } else if (!check_in_apply && !ValuesFinite(vals)) {
      s = non_finite();
      absl::MutexLock l(&mu_);
      ++non_finite_pushes_;
    }
  }
  // One segment per range run: the client's (range, seq) pairs, which must
  // cut the keys exactly as the routing does, or (older clients) `seq` for
  // every range.
  std::vector<uint64_t> seqs(runs.size(), req.seq());
  if (s.ok() && req.segments_size() > 0) {
    if (req.segments_size() != static_cast<int>(runs.size())) {
      s = absl::InvalidArgumentError(
          absl::StrCat(req.segments_size(), " segments for keys in ",
                       runs.size(), " ranges"));
    }
    for (size_t i = 0; s.ok() && i < runs.size(); ++i) {
      const proto::PushSegment& seg = req.segments(static_cast<int>(i));
      if (seg.range() != runs[i].range ||
          seg.num_keys() != runs[i].last - runs[i].first) {
        s = absl::InvalidArgumentError(absl::StrCat(
            "segment ", i, " (range ", seg.range(), ", ", seg.num_keys(),
            " keys) does not match the keys' range ", runs[i].range, " (",
            runs[i].last - runs[i].first, " keys)"));
      }
      seqs[i] = seg.seq();
    }
  } else if (s.ok() && req.seq() == 0 && !runs.empty()) {
    s = absl::InvalidArgumentError("push seq 0");
  }
  if (!s.ok()) {
    done(s);
    return;
  }
  Table* const t = adm.table;
  const int dim = t->dim();
  absl::Span<const uint64_t> keys = rk.keys;
  const float* g = reinterpret_cast<const float*>(vals.data());
  RangeActionList actions;
  actions.reserve(runs.size());
  std::vector<int> finished;
  std::vector<size_t> fresh;  // runs admitted now, to apply (ASP/SSP)
  Needs needs;                // replication: what the answer waits for
  std::vector<LoggedSegment> logged;  // ... and what goes to the backups
  // Runs whose rows go in a delta: by the range's journal (kDeltaJournal,
  // the table records them as it applies them) or by their keys.
  enum : uint8_t { kNoDelta, kDeltaKeys, kDeltaJournal };
  std::vector<uint8_t> delta_runs;
  fresh.reserve(runs.size());
  {
    absl::MutexLock l(&mu_);
    if (routing_ != nullptr && routing_->replicas() > 0) {
      needs.reserve(runs.size());  // grown per segment: freed elsewhere
      logged.reserve(runs.size());
    }
    if (check_in_apply && routing_ != nullptr && routing_->replicas() > 0 &&
        !DeltasLocked()) {
      // Replication changed to send values meanwhile: checked here.
      check_in_apply = false;
      if (!ValuesFinite(vals)) {
        s = non_finite();
        ++non_finite_pushes_;
      }
    }
    int news = 0;
    for (size_t i = 0; s.ok() && i < runs.size(); ++i) {
      const RangeRun& run = runs[i];
      const bool replicated = HasBackups(run.range);
      BufferedSegment seg;
      if (adm.bsp) {
        seg.table = req.table();
        seg.keys.assign(reinterpret_cast<const char*>(keys.data() + run.first),
                        (run.last - run.first) * sizeof(uint64_t));
        seg.vals.assign(vals.data() + run.first * dim * sizeof(float),
                        (run.last - run.first) * dim * sizeof(float));
      }
      bool dup = false;
      RangeActions a;
      absl::Status st = ranges_[run.range].Accept(
          req.worker_id(), seqs[i], req.clock(), &seg, &dup, &a);
      if (!st.ok()) {
        // Segments admitted before it are still applied below (a resend
        // finds them duplicates); the request fails with the first error.
        s = st;
        break;
      }
      if (dup && applying_.contains({run.range, req.worker_id(), seqs[i]})) {
        // The original is being applied (and may yet be refused): answered
        // once it is, so that an acknowledgement means applied.
        s = absl::AbortedError(
            absl::StrCat("push seq ", seqs[i], " of worker ", req.worker_id(),
                         " is being applied: resend once it is answered"));
        break;
      }
      if (dup) {
        // Answered only once the original is on every backup.
        if (replicated && adm.bsp && !DeltasLocked()) {
          needs.emplace_back(run.range, ClockNeed(req.clock()));
        } else if (replicated) {
          NeedCurrent(run.range, &needs);
        }
        continue;
      }
      if (replicated && adm.bsp && !DeltasLocked()) {
        // Replication after aggregation: the segment goes to the backups
        // within its clock's sum, and is acknowledged once that is there.
        needs.emplace_back(run.range, ClockNeed(req.clock()));
      } else if (replicated && adm.bsp) {
        // By deltas: the segment is in the range's state (buffered until
        // its clock applies; ApplyBsp then notes the rows it changes).
        AssignIndexLocked(run.range, &needs);
        MarkDirtyLocked(run.range);
      } else if (replicated && DeltasLocked()) {
        // In the range's next delta: the rows the apply records in the
        // range's journal, or else the rows of its keys as they are then
        // (the keys, and the slots the apply finds them at, are noted once
        // applied).
        AssignIndexLocked(run.range, &needs);
        MarkDirtyLocked(run.range);
        if (delta_runs.empty()) delta_runs.resize(runs.size(), kNoDelta);
        delta_runs[i] = logs_[run.range].by_slot ? kDeltaJournal : kDeltaKeys;
      } else if (replicated) {
        logged.push_back(LoggedSegment{run.range, run.first, run.last,
                                       seqs[i],
                                       AssignIndexLocked(run.range, &needs)});
      }
      ++news;
      if (adm.bsp) {
        ApplyBsp(run.range, &a);
        AddActions(&actions, run.range, &a);
      } else {
        fresh.push_back(i);
        applying_.insert({run.range, req.worker_id(), seqs[i]});
      }
    }
    if (!logged.empty()) LogPushLocked(req, keys, g, dim, logged);
    if (news > 0) {
      ++pushes_;
      if (req.segments_size() == 0) {
        LegacyClock& lc =
            workers_[req.worker_id()].legacy[req.clock()];
        ++lc.admitted;
        for (const RangeRun& run : runs) ++lc.per_range[run.range];
        AnnounceLegacy(req.worker_id(), &actions, &needs);
      }
    } else if (s.ok()) {
      resp->set_duplicate(true);  // a replay: applied once already
    }
    FlushBspClocksLocked();
    ResolveClockNeedsLocked(&needs);
    if (fresh.empty()) NoteFinished(req.worker_id(), actions, &finished);
  }
  if (!fresh.empty()) {
    const float scale = t->optimizer().GradientScale(req.num_examples());
    absl::Mutex resolving_mu;  // Resolving makes rk.resolved on first use
    // Deltas by keys: where each run's keys were found (a delta reads
    // their rows by slot, without hashing them again), and the slots'
    // generation. By journal: whether the table recorded the rows.
    std::vector<uint32_t> delta_slots;
    std::vector<const uint32_t*> run_slots;
    std::vector<uint64_t> run_generations;
    std::unique_ptr<bool[]> journaled;
    if (!delta_runs.empty()) {
      journaled = std::make_unique<bool[]>(runs.size());
      if (std::find(delta_runs.begin(), delta_runs.end(), kDeltaKeys) !=
          delta_runs.end()) {
        delta_slots.resize(keys.size());
        run_slots.resize(runs.size(), nullptr);
        run_generations.resize(runs.size(), 0);
      }
    }
    // Set by the table when it refused the values (check_in_apply: one
    // run).
    bool refused = false;
    bool* const checked = check_in_apply ? &refused : nullptr;
    // `rows`: the runner a long row's update is split over (when the push
    // is one range's, not split by ranges already).
    auto apply = [&](size_t i, ParallelRunner* rows) {
      const RangeRun& run = runs[i];
      const size_t n = run.last - run.first;
      const float* grads = g + run.first * dim;
      const bool delta = !delta_runs.empty() && delta_runs[i] == kDeltaKeys;
      bool* journal = !delta_runs.empty() && delta_runs[i] == kDeltaJournal
                          ? &journaled[i]
                          : nullptr;
      // A cached list's slots, unless stale: no hashing but for the keys
      // its pull did not find. A delta names the rows by every slot,
      // those the push made included (no second lookup when it is built).
      if (rk.cached != nullptr && !rk.cached->slots.empty() &&
          t->PushSlots(
              run.range, rk.cached->generations[i], keys.subspan(run.first, n),
              rk.cached->slots.data() + run.first, grads, scale,
              KeyOrder::kAscending,
              delta ? delta_slots.data() + run.first : nullptr, journal,
              rk.cached->complete, rows,
              !rk.cached->consecutive.empty() && rk.cached->consecutive[i] != 0,
              checked)) {
        if (delta) {
          run_slots[i] = delta_slots.data() + run.first;
          run_generations[i] = rk.cached->generations[i];
        }
        return;
      }
      std::pair<uint32_t*, uint64_t*> resolving;
      {
        absl::MutexLock l(&resolving_mu);
        resolving = Resolving(&rk, req.table(), i);
      }
      if (delta && resolving.first == nullptr) {
        resolving = {delta_slots.data() + run.first, &run_generations[i]};
      }
      t->Push(run.range, keys.subspan(run.first, n), grads, scale,
              resolving.first, resolving.second, KeyOrder::kAscending, journal,
              rows, checked);
      if (delta) {
        run_slots[i] = resolving.first;
        run_generations[i] = *resolving.second;
      }
    };
    // Ranges are independent: a large push is applied by several threads,
    // each a contiguous group of its ranges (answered once all are done).
    // A push to one range (a dense table's key, say) is split by its long
    // rows' columns instead: a 4 MiB row's SGD on one thread was 30 % of a
    // dense push's samples, the server's other threads idle meanwhile.
    if (before_apply_for_test_) before_apply_for_test_();
    if (fresh.size() == 1) {
      apply(fresh[0], &apply_runner_);
    } else {
      apply_runner_.ForEachBalanced(
          fresh.size(), kMinParallelApplyValues,
          [&](size_t j) {
            const RangeRun& run = runs[fresh[j]];
            return (run.last - run.first) * static_cast<size_t>(dim);
          },
          [&](size_t j) { apply(fresh[j], nullptr); });
    }
    absl::MutexLock l(&mu_);
    for (size_t i : fresh) {
      applying_.erase({runs[i].range, req.worker_id(), seqs[i]});
      if (refused) {
        // Nothing of it applied: as if never admitted, so that a resend
        // is refused again rather than answered as a duplicate.
        ranges_[runs[i].range]
            .Withdraw(req.worker_id(), seqs[i], req.clock())
            .IgnoreError();  // admitted above: cannot fail
        s = non_finite();
        ++non_finite_pushes_;
        --pushes_;
      } else {
        RangeActions a;
        ranges_[runs[i].range]
            .Applied(req.worker_id(), req.clock(), &a)
            .IgnoreError();  // admitted above: cannot fail
        AddActions(&actions, runs[i].range, &a);
      }
      if (!delta_runs.empty() && delta_runs[i] != kNoDelta) {
        const RangeRun& run = runs[i];
        if (journaled[i]) {
          CountDirtyRowsLocked(req.table(), run.last - run.first);
        } else {
          // By keys, with the slots the apply found (none where a journal
          // was expected but off: looked up again).
          const bool found = delta_runs[i] == kDeltaKeys;
          AddDirtyKeysLocked(run.range, req.table(),
                             keys.subspan(run.first, run.last - run.first),
                             found ? run_slots[i] : nullptr,
                             found ? run_generations[i] : 0);
        }
      }
    }
    NoteFinished(req.worker_id(), actions, &finished);
  }
  Publish(actions, finished);
  if (s.ok()) KeepResolved(req.worker_id(), &rk);
  if (s.ok() && req.has_end_clock()) {
    // The clock riding on the push: after its segments, answered with it.
    if (req.end_clock().worker_id() != req.worker_id()) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "push of worker ", req.worker_id(), " ends the clock of worker ",
          req.end_clock().worker_id()));
    } else {
      s = ClockTickImpl(req.end_clock(), &needs);
    }
  }
  if (needs.empty()) {
    if (s.ok()) NoteAck(req.epoch());
    done(s);
    return;
  }
  WhenCommitted(std::move(needs), std::move(done), s, req.epoch());
  Kick();
}

namespace {

// PullResponse.others_min_clock: the lowest clock completed on `range` by
// the workers other than `worker` still training; 0 when there is none.
int64_t OthersMinClock(const RangeState& range, int worker) {
  int64_t lowest = -1;
  for (int w = 0; w < range.num_workers(); ++w) {
    if (w == worker || range.Finished(w) || range.Dead(w)) continue;
    const int64_t c = range.Completed(w);
    if (lowest < 0 || c < lowest) lowest = c;
  }
  return std::max<int64_t>(0, lowest);
}

}  // namespace

void ServerNode::Pull(const proto::PullRequest& req, absl::string_view keys_in,
                      proto::PullResponse* resp, Done done,
                      absl::Duration max_wait, ValueBuffer values) {
  Admitted adm;
  absl::Status s;
  absl::Time deadline;
  {
    absl::MutexLock l(&mu_);
    s = Admit(req.worker_id(), req.epoch(), req.table(), &adm);
    if (s.ok()) {
      // The most a correct worker can be ahead of is the clocks it
      // completed on the ranges this server owns.
      int64_t completed = 0;
      for (int r : owned_) {
        completed = std::max(completed, ranges_[r].Completed(req.worker_id()));
      }
      // A server that owns no range (drained) has nothing to compare with:
      // the pull's ranges answer it, a stale epoch.
      if (!owned_.empty() && req.clock() > completed &&
          req.clock() - completed > limits_.max_clock_ahead) {
        s = ClockTooFar(req.worker_id(), req.clock(), completed,
                        limits_.max_clock_ahead);
      }
      // Only SSP's catch-up reads it: no scan of the workers in the others.
      if (mode_ == proto::MODE_SSP && !owned_.empty()) {
        resp->set_others_min_clock(
            OthersMinClock(ranges_[owned_.front()], req.worker_id()));
      }
    }
    if (s.ok()) {
      ++pulls_;
      const int64_t wait_ms = std::min(
          req.wait_ms() > 0 ? req.wait_ms() : default_wait_ms_,
          limits_.max_wait_ms);
      deadline = clock_->Now() +
                 std::min(absl::Milliseconds(wait_ms), max_wait);
    }
  }
  auto rk = std::make_shared<RequestKeys>();
  if (s.ok()) {
    s = ResolveKeys(req.worker_id(), req.table(), req.key_list(),
                    req.num_keys(), keys_in, adm, rk.get());
    rk->window = req.key_lists();
  }
  std::vector<int> ranges;
  ranges.reserve(rk->runs.size());
  for (const RangeRun& run : rk->runs) ranges.push_back(run.range);
  if (!s.ok()) {
    done(s);
    return;
  }
  Table* const t = adm.table;
  if (max_wait <= absl::ZeroDuration()) {
    // The caller gave up already: do not queue a wait nobody will read.
    done(absl::DeadlineExceededError("pull arrived after its deadline"));
    return;
  }
  if (ranges.empty()) {  // no keys: nothing to wait for
    done(absl::OkStatus());
    return;
  }
  Clock* const clock = clock_;
  const absl::Time asked = clock->Now();
  // A catch-up watch (PullRequest.others_at) waits for the other workers,
  // not for the consistency bound, and says where they were when answered.
  const int64_t others_at = req.others_at();
  std::vector<int> watched;
  if (others_at > 0) watched = ranges;
  auto ready =
      [this, t, rk, admitted = adm.routing, worker = req.worker_id(),
       table = req.table(), resp, clock, asked, values = std::move(values),
       watched = std::move(watched),
       done = std::move(done)](const absl::Status& s) {
        if (!s.ok()) {
          done(s);
          return;
        }
        if (!watched.empty()) {
          resp->set_others_min_clock(
              std::max<int64_t>(0, consistency_->OthersMin(worker, watched)));
        }
        // Read only as the ranges' owner: a pull that waited across a view
        // change may be released here after a range moved away (before
        // CancelRanges, or by a copy's clocks), and a backup's values lag
        // its primary's applies. The worker asks the new owner.
        // (`done` writes the answer to the worker's socket, which may
        // block: never under mu_, which heartbeats and every push need.)
        std::shared_ptr<const Routing> reading;
        absl::Status owned;
        {
          absl::ReaderMutexLock l(&mu_);
          owned = StillOwnedLocked(*rk, admitted);
          reading = routing_;
        }
        if (!owned.ok()) {
          done(owned);
          return;
        }
        resp->set_held_us(absl::ToInt64Microseconds(clock->Now() - asked));
        absl::Span<const uint64_t> keys = rk->keys;
        const size_t dim = static_cast<size_t>(t->dim());
        float* out;
        if (values != nullptr) {
          out = values(keys.size() * dim);
        } else {
          // Every float is written below (libstdc++ still zero-fills first:
          // it has no resize without initialisation before C++23).
          std::string* vals = resp->mutable_vals();
          vals->resize(keys.size() * dim * sizeof(float));
          out = reinterpret_cast<float*>(vals->data());
        }
        const KeyList* cached = rk->cached.get();
        absl::Mutex resolving_mu;  // Resolving makes rk->resolved once
        auto copy = [&](size_t i) {
          const RangeRun& run = rk->runs[i];
          const auto run_keys = keys.subspan(run.first, run.last - run.first);
          if (cached != nullptr && !cached->slots.empty() &&
              t->PullSlots(run.range, cached->generations[i], run_keys,
                           cached->slots.data() + run.first,
                           out + run.first * dim)) {
            return;
          }
          std::pair<uint32_t*, uint64_t*> resolving;
          {
            absl::MutexLock l(&resolving_mu);
            resolving = Resolving(rk.get(), table, i);
          }
          t->Pull(run.range, run_keys, out + run.first * dim,
                  resolving.first, resolving.second);
        };
        // As a push's apply: a large pull's ranges on several threads.
        apply_runner_.ForEachBalanced(
            rk->runs.size(), kMinParallelPullValues,
            [&](size_t i) {
              return (rk->runs[i].last - rk->runs[i].first) * dim;
            },
            copy);
        absl::Status changed;
        {
          absl::ReaderMutexLock l(&mu_);
          if (routing_ != reading) {  // the view changed while reading
            changed = ErrorWithReason(
                absl::StatusCode::kFailedPrecondition,
                proto::REASON_STALE_EPOCH,
                absl::StrCat("stale-epoch: the view changed to epoch ", epoch_,
                             " while a pull was read on S[", id_, "]"));
          }
        }
        if (!changed.ok()) {
          done(changed);
          return;
        }
        KeepResolved(worker, rk.get());
        done(absl::OkStatus());
      };
  if (others_at > 0) {
    consistency_->WaitOthers(req.worker_id(), others_at, std::move(ranges),
                             deadline, std::move(ready));
  } else {
    consistency_->WaitPull(req.worker_id(), req.clock(), std::move(ranges),
                           deadline, std::move(ready));
  }
}

absl::Status ServerNode::ClockTick(const proto::ClockRequest& req) {
  absl::Notification n;
  absl::Status out;
  ClockTick(req, [&](const absl::Status& s) {
    out = s;
    n.Notify();
  });
  n.WaitForNotification();
  return out;
}

absl::Status ServerNode::Finish(const proto::FinishRequest& req) {
  absl::Notification n;
  absl::Status out;
  Finish(req, [&](const absl::Status& s) {
    out = s;
    n.Notify();
  });
  n.WaitForNotification();
  return out;
}

void ServerNode::AnswerWhenCommitted(const absl::Status& s, Needs needs,
                                     Done done) {
  if (needs.empty()) {
    done(s);
    return;
  }
  WhenCommitted(std::move(needs), std::move(done), s, -1);
  Kick();
}

void ServerNode::ClockTick(const proto::ClockRequest& req, Done done) {
  Needs needs;
  absl::Status s = ClockTickImpl(req, &needs);
  AnswerWhenCommitted(s, std::move(needs), std::move(done));
}

void ServerNode::Finish(const proto::FinishRequest& req, Done done) {
  Needs needs;
  absl::Status s = FinishImpl(req, &needs);
  AnswerWhenCommitted(s, std::move(needs), std::move(done));
}

absl::Status ServerNode::ClockTickImpl(const proto::ClockRequest& req,
                                       Needs* needs) {
  RangeActionList actions;
  std::vector<int> finished;
  {
    absl::MutexLock l(&mu_);
    if (consistency_ == nullptr) {
      return NotConfigured();
    }
    if (req.worker_id() < 0 ||
        req.worker_id() >= static_cast<int>(workers_.size())) {
      if (req.worker_id() >= 0 && req.epoch() > epoch_) {
        // A worker that joined at a view this server has not adopted yet.
        return ErrorWithReason(
            absl::StatusCode::kUnavailable, proto::REASON_VIEW_BEHIND,
            absl::StrCat("view behind: clock epoch ", req.epoch(),
                         ", server epoch ", epoch_));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("unknown worker id ", req.worker_id()));
    }
    if (req.clock() < 0 || req.pushes() < 0 || req.num_examples() < 0) {
      return absl::InvalidArgumentError("negative clock, pushes or examples");
    }
    const int w = req.worker_id();
    const int n = req.range_ids_size();
    if (req.range_segments_size() != n || req.range_settled_seqs_size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "clock announces ", n, " ranges with ", req.range_segments_size(),
          " segment counts and ", req.range_settled_seqs_size(),
          " settled seqs"));
    }
    const auto range_ids = AsSpan(req.range_ids());
    const auto range_segments = AsSpan(req.range_segments());
    const auto range_settled = AsSpan(req.range_settled_seqs());
    // Judged after the ranges' owner (below): a clock to a server that no
    // longer owns its ranges (drained: it owns none, so it had completed
    // "0") is a stale epoch the worker regroups, not a clock too far (the
    // worker took that as final and exited; chaos mix seed 908 SSP).
    auto too_far = [&]() -> absl::Status {
      mu_.AssertHeld();  // tells the analysis the lambda runs under mu_
      if (owned_.empty()) return absl::OkStatus();
      int64_t completed = 0;
      for (int r : owned_) {
        completed = std::max(completed, ranges_[r].Completed(w));
      }
      if (req.clock() > completed &&
          req.clock() - completed > limits_.max_clock_ahead) {
        return ClockTooFar(w, req.clock(), completed, limits_.max_clock_ahead);
      }
      return absl::OkStatus();
    };
    if (n == 0) PS_RETURN_IF_ERROR(too_far());
    if (n > 0) {
      // Per range: every entry must name a range this server owns now
      // (ranges keep their state when views change, so the request's epoch
      // matters only when it names a range this server does not own yet).
      for (int i = 0; i < n; ++i) {
        const int range = range_ids[i];
        if (range < 0 || range >= routing_->num_ranges()) {
          return absl::InvalidArgumentError(
              absl::StrCat("unknown range ", range));
        }
        if (routing_->OwnerOfRange(range) != id_) {
          if (req.epoch() > epoch_) {
            return ErrorWithReason(
                absl::StatusCode::kUnavailable, proto::REASON_VIEW_BEHIND,
                absl::StrCat("view behind: clock epoch ", req.epoch(),
                             ", server epoch ", epoch_));
          }
          return ErrorWithReason(
              absl::StatusCode::kFailedPrecondition, proto::REASON_STALE_EPOCH,
              absl::StrCat("stale-epoch: range ", range,
                           " not owned by server ", id_));
        }
        if (range_segments[i] < 0) {
          return absl::InvalidArgumentError("negative segment count");
        }
      }
      PS_RETURN_IF_ERROR(too_far());
      // One replication entry per backup for the whole request (a clock
      // announces every range of the server: one entry per range made the
      // backups' work grow with the number of ranges).
      absl::flat_hash_map<int, proto::ReplicaEntry> per_backup;
      absl::Status refused;
      actions.reserve(actions.size() + n);
      for (int i = 0; i < n; ++i) {
        const int range = range_ids[i];
        RangeActions ra;
        refused = ranges_[range].Announce(w, req.clock(),
                                          range_segments[i],
                                          req.num_examples(),
                                          range_settled[i], &ra);
        if (!refused.ok()) break;  // the entries logged so far still go
        ApplyBsp(range, &ra);
        AddActions(&actions, range, &ra);
        if (!HasBackups(range)) continue;
        if (mode_ == proto::MODE_BSP && !DeltasLocked()) {
          // Sent to the backups with the clock's sum; answered after it.
          needs->emplace_back(range, ClockNeed(req.clock()));
          continue;
        }
        const int64_t index = AssignIndexLocked(range, needs);
        if (DeltasLocked()) {
          MarkDirtyLocked(range);  // the range's state goes in its delta
          continue;
        }
        for (int b : FeedTargetsLocked(range)) {
          auto [it, inserted] = per_backup.try_emplace(b);
          proto::ReplicaAnnounces* an;
          if (inserted) {
            an = TakeSpare(&spares_.announces);
            it->second.set_allocated_announces(an);
            an->set_worker(w);
            an->set_clock(req.clock());
            an->set_examples(req.num_examples());
          } else {
            an = it->second.mutable_announces();
          }
          an->add_ranges(range);
          an->add_indexes(index);
          an->add_segments(range_segments[i]);
          an->add_settled_seqs(range_settled[i]);
        }
      }
      for (auto& [b, e] : per_backup) EnqueueLocked(b, std::move(e));
      FlushBspClocksLocked();
      ResolveClockNeedsLocked(needs);
      PS_RETURN_IF_ERROR(refused);
    } else {
      // Older clients: settle every owned range now; announce per range
      // once all `pushes` requests of the clock arrived.
      for (int r : owned_) {
        ranges_[r].Settle(w, req.settled_seq()).IgnoreError();  // id checked
      }
      // A clock every owned range completed is a replay: it only settles.
      bool replay = !owned_.empty();
      for (int r : owned_) {
        if (ranges_[r].Completed(w) <= req.clock()) replay = false;
      }
      if (!replay) {
        LegacyClock& lc = workers_[w].legacy[req.clock()];
        if (lc.announced < 0) {
          lc.announced = req.pushes();
          lc.examples = req.num_examples();
        }
        AnnounceLegacy(w, &actions, needs);
      }
      FlushBspClocksLocked();
      ResolveClockNeedsLocked(needs);
    }
    NoteFinished(w, actions, &finished);
  }
  Publish(actions, finished);
  return absl::OkStatus();
}

absl::Status ServerNode::FinishImpl(const proto::FinishRequest& req,
                                    Needs* needs) {
  RangeActionList actions;
  std::vector<int> finished;
  {
    absl::MutexLock l(&mu_);
    if (consistency_ == nullptr) {
      return NotConfigured();
    }
    if (req.worker_id() < 0 ||
        req.worker_id() >= static_cast<int>(workers_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown worker id ", req.worker_id()));
    }
    if (req.final_clock() < 0) {
      return absl::InvalidArgumentError("negative final clock");
    }
    const int w = req.worker_id();
    // All or nothing: a finish refused by one range changes none.
    for (int r : owned_) {
      PS_RETURN_IF_ERROR(ranges_[r].CanFinish(w, req.final_clock()));
    }
    for (int r : owned_) {
      RangeActions ra;
      ranges_[r].Finish(w, req.final_clock(), &ra).IgnoreError();  // checked
      ApplyBsp(r, &ra);
      AddActions(&actions, r, &ra);
      if (HasBackups(r)) {
        proto::ReplicaEntry e;
        e.mutable_finish()->set_worker(w);
        e.mutable_finish()->set_final_clock(req.final_clock());
        LogEntry(r, std::move(e), needs);
      }
    }
    FlushBspClocksLocked();
    NoteFinished(w, actions, &finished);
    if (!workers_[w].finished) {
      PS_LOG_WARN("worker {} finished at clock {} but has not completed it "
                  "on every range here",
                  w, req.final_clock());
    }
  }
  Publish(actions, finished);
  return absl::OkStatus();
}

void ServerNode::AnnounceLegacy(int worker, RangeActionList* out,
                                Needs* needs) {
  WorkerState& w = workers_[worker];
  for (auto it = w.legacy.begin(); it != w.legacy.end();) {
    LegacyClock& lc = it->second;
    if (lc.announced < 0 || lc.admitted < lc.announced) {
      ++it;
      continue;
    }
    for (int r : owned_) {
      auto n = lc.per_range.find(r);
      RangeActions ra;
      // Validated when it was recorded; a clock too far ahead was refused.
      ranges_[r]
          .Announce(worker, it->first,
                    n == lc.per_range.end() ? 0 : n->second, lc.examples, 0,
                    &ra)
          .IgnoreError();
      ApplyBsp(r, &ra);
      AddActions(out, r, &ra);
      if (HasBackups(r) && mode_ == proto::MODE_BSP && !DeltasLocked()) {
        // With the clock's sum (FlushBspClocksLocked, by the caller).
        needs->emplace_back(r, ClockNeed(it->first));
      } else if (HasBackups(r)) {
        proto::ReplicaEntry e;
        proto::ReplicaAnnounce* an = e.mutable_announce();
        an->set_worker(worker);
        an->set_clock(it->first);
        an->set_segments(n == lc.per_range.end() ? 0 : n->second);
        an->set_examples(lc.examples);
        LogEntry(r, std::move(e), needs);
      }
    }
    it = w.legacy.erase(it);
  }
}

void ServerNode::ApplyBsp(int range, RangeActions* actions) {
  if (actions->apply.empty()) return;
  // Where the applied clocks go for the backups, when there are any.
  const bool owner = routing_->OwnerOfRange(range) == id_;
  const bool replicated = owner && HasBackups(range);
  // Replication after aggregation: where the applied clocks go for the
  // backups. By deltas: the rows the sums change are noted for the
  // range's next delta (recorded in its journal, or else by key).
  const bool deltas = replicated && DeltasLocked();
  proto::ReplicaBspClocks* const out =
      replicated && !deltas ? &bsp_out_ : nullptr;
  if (owner && !replicated) bsp_applied_unreplicated_ = true;
  if (deltas) MarkDirtyLocked(range);
  for (RangeActions::Apply& apply : actions->apply) {
    if (out != nullptr) {
      out->add_ranges(range);
      out->add_indexes(0);  // assigned by FlushBspClocksLocked
      out->add_clocks(apply.clock);
      out->add_examples(apply.examples);
      out->add_num_segs(static_cast<int32_t>(apply.segments.size()));
      out->add_num_anns(static_cast<int32_t>(apply.announces.size()));
      for (const BufferedSegment& seg : apply.segments) {
        out->add_seg_workers(seg.worker);
        out->add_seg_seqs(seg.seq);
      }
      for (const BspAnnouncement& a : apply.announces) {
        out->add_ann_workers(a.worker);
        out->add_ann_segments(a.segments);
        out->add_ann_examples(a.examples);
        out->add_ann_settled(a.settled);
      }
    }
    int32_t sums = 0;
    for (size_t ti = 0; ti < tables_.size(); ++ti) {
      Table* t = tables_[ti].get();
      const float scale = t->optimizer().GradientScale(apply.examples);
      // Kept per table: one for each range and clock cost as much as the
      // sums (its per-range maps for every range of the job).
      if (bsp_sums_.size() <= ti) bsp_sums_.resize(ti + 1);
      std::unique_ptr<GradAccumulator>& acc = bsp_sums_[ti];
      if (acc == nullptr || acc->dim() != t->dim() ||
          acc->num_ranges() != t->num_ranges()) {
        acc = std::make_unique<GradAccumulator>(t->dim(), t->num_ranges());
      }
      bool touched = false;
      for (const BufferedSegment& seg : apply.segments) {
        if (seg.table != static_cast<int>(ti)) continue;
        acc->Add(range, ViewAs<uint64_t>(seg.keys),
                 reinterpret_cast<const float*>(seg.vals.data()));
        touched = true;
      }
      if (!touched) continue;
      if (deltas) {
        bool journaled = false;
        delta_sum_keys_.clear();
        acc->ApplyTo(t, scale, &delta_sum_keys_, nullptr,
                     logs_[range].by_slot ? &journaled : nullptr);
        const auto keys = ViewAs<uint64_t>(delta_sum_keys_);
        if (journaled) {
          CountDirtyRowsLocked(static_cast<int>(ti), keys.size());
        } else {
          // By keys (looked up again when the delta is made); with a
          // journal expected but off, ShipRangeLocked then sends the
          // backups a copy of the range instead.
          AddDirtyKeysLocked(range, static_cast<int>(ti), keys, nullptr, 0);
        }
      } else if (out == nullptr) {
        acc->ApplyTo(t, scale);
      } else {
        const size_t before = out->sum_keys().size();
        acc->ApplyTo(t, scale, out->mutable_sum_keys(), out->mutable_sum_vals());
        out->add_sum_tables(static_cast<int32_t>(ti));
        out->add_sum_num_keys(static_cast<int64_t>(
            (out->sum_keys().size() - before) / sizeof(uint64_t)));
        ++sums;
      }
    }
    if (out != nullptr) out->add_num_sums(sums);
  }
  actions->apply.clear();
}

void ServerNode::NoteFinished(int worker, const RangeActionList& actions,
                              std::vector<int>* finished) {
  WorkerState& w = workers_[worker];
  bool any = false;
  for (const auto& [r, a] : actions) {
    if (!a.finished.empty()) any = true;
  }
  if (!any || w.finished) return;
  for (int r : owned_) {
    if (!ranges_[r].Finished(worker)) return;
  }
  w.finished = true;
  finished->push_back(worker);
}

void ServerNode::Publish(const RangeActionList& actions,
                         const std::vector<int>& finished) {
  if (consistency_ == nullptr) return;
  // One call per (worker, clock) with all its ranges: a clock completes on
  // every range of the server at once, and a call per range took the
  // controller's lock and scanned its waiting pulls that many times.
  // Grouped by (worker, clock) without sorting every (worker, clock,
  // range): there are few groups, and a backup's announcements of 64
  // ranges sorted each time were 1-2 % of its CPU.
  struct Group {
    int worker;
    int64_t entry;
    std::vector<int> ranges;
  };
  std::vector<Group> groups;
  absl::flat_hash_map<std::pair<int, int64_t>, size_t> many;  // past 16
  for (const auto& [range, a] : actions) {
    for (const auto& [worker, entry] : a.advanced) {
      size_t g = groups.size();
      if (groups.size() <= 16) {
        for (size_t i = 0; i < groups.size(); ++i) {
          if (groups[i].worker == worker && groups[i].entry == entry) {
            g = i;
            break;
          }
        }
      } else {
        auto it = many.find({worker, entry});
        if (it != many.end()) g = it->second;
      }
      if (g == groups.size()) {
        groups.push_back(Group{worker, entry, {}});
        if (groups.size() > 16) {
          if (many.empty()) {
            for (size_t i = 0; i < groups.size(); ++i) {
              many[{groups[i].worker, groups[i].entry}] = i;
            }
          } else {
            many[{worker, entry}] = g;
          }
        }
      }
      groups[g].ranges.push_back(range);
    }
  }
  std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    return std::tie(a.worker, a.entry) < std::tie(b.worker, b.entry);
  });
  for (Group& g : groups) {
    if (!std::is_sorted(g.ranges.begin(), g.ranges.end())) {
      std::sort(g.ranges.begin(), g.ranges.end());
    }
    consistency_->AdvanceClock(g.worker, g.entry - 1, g.ranges);
  }
  for (int worker : finished) consistency_->SetWorkerFinished(worker);
}

absl::Status ServerNode::CheckInvariants() const {
  absl::MutexLock l(&mu_);
  for (size_t r = 0; r < ranges_.size(); ++r) {
    absl::Status s = ranges_[r].CheckInvariants();
    if (!s.ok()) {
      return absl::InternalError(
          absl::StrCat("S[", id_, "] range ", r, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string ServerNode::DebugRanges() const {
  absl::MutexLock l(&mu_);
  std::string out = absl::StrCat("S[", id_, "] epoch ", epoch_, ":\n");
  if (routing_ == nullptr) return out;
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const int r = static_cast<int>(i);
    const bool owner = routing_->OwnerOfRange(r) == id_;
    if (!owner && !routing_->IsBackupOf(r, id_)) continue;
    absl::StrAppend(&out, "  r", r, owner ? " owner" : " backup");
    if (i < logs_.size()) {
      const RangeLog& lg = logs_[i];
      absl::StrAppend(&out, " index ", lg.index,
                      lg.complete ? " complete" : " incomplete",
                      lg.awaiting_copy ? " awaiting-copy" : "", " acked {");
      for (const auto& [b, e] : lg.acked) absl::StrAppend(&out, b, ":", e, " ");
      absl::StrAppend(&out, "} copy_to {", absl::StrJoin(lg.copy_to, ","),
                      "}");
    }
    absl::StatusOr<proto::RangeStateSnapshot> snap = ranges_[i].Snapshot();
    absl::StrAppend(&out, " ",
                    snap.ok() ? snap->ShortDebugString()
                              : snap.status().ToString(),
                    "\n");
  }
  return out;
}

absl::Status ServerNode::SetConsistency(const proto::ConsistencyConfig& c) {
  if (!proto::ConsistencyMode_IsValid(c.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown consistency mode ", c.mode()));
  }
  if (c.mode() == proto::MODE_UNKNOWN) {
    return absl::InvalidArgumentError("consistency.mode not set");
  }
  if (c.mode() == proto::MODE_SSP && c.tau() < 0) {
    return absl::InvalidArgumentError("consistency.tau must be >= 0 for ssp");
  }
  {
    absl::MutexLock l(&mu_);
    if (consistency_ == nullptr) {
      return NotConfigured();
    }
    if ((mode_ == proto::MODE_BSP) != (c.mode() == proto::MODE_BSP)) {
      return absl::FailedPreconditionError(
          "switching to or from bsp while running is not supported; "
          "change tau instead");
    }
    mode_ = c.mode();
  }
  consistency_->SetTau(TauOf(c));
  return absl::OkStatus();
}

void ServerNode::KeepModelCopy() {
  absl::MutexLock l(&mu_);
  kept_copy_.clear();
  for (const auto& t : tables_) kept_copy_.push_back(t->CopyValues(&owned_));
  kept_owned_ = owned_;
}

absl::Status ServerNode::SaveKeptCopy(proto::ServerControlResponse* resp) {
  std::string dir;
  {
    absl::MutexLock l(&mu_);
    if (kept_copy_.size() != tables_.size() || kept_owned_ != owned_) {
      resp->set_saved_kept_copy(false);
      return absl::OkStatus();
    }
    dir = absl::StrCat(model_dir_.empty() ? "." : model_dir_, "/best");
  }
  proto::ServerControlResponse copy;
  PS_RETURN_IF_ERROR(SaveModel(dir, &copy, /*kept_copy=*/true));
  resp->set_saved_kept_copy(copy.saved_kept_copy());
  return absl::OkStatus();
}

absl::Status ServerNode::SaveModel(const std::string& dir_arg,
                                   proto::ServerControlResponse* resp,
                                   bool kept_copy) {
  // No partial models (issue 8: a full disk left a partial model). Every
  // file is written under a temporary name in the same folder and fsynced;
  // only when all of them are complete are they renamed into place (then
  // the folder is fsynced). On any error the temporaries, and files of this
  // save already renamed, are removed, so no model file of this save is
  // left behind; the error names the file and the reason (ENOSPC reads
  // RESOURCE_EXHAUSTED "... No space left on device").
  {
    const auto [ack_epoch, ack_ms] = FirstAck();
    resp->set_first_ack_epoch(ack_epoch);
    resp->set_first_ack_unix_ms(ack_ms);
  }
  std::string dir = dir_arg;
  if (dir.empty()) {
    absl::MutexLock l(&mu_);
    dir = model_dir_.empty() ? "." : model_dir_;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create model dir ", dir, ": ", ec.message()));
  }
  auto errno_error = [](int err, absl::string_view what,
                        const std::string& path) {
    return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
  };
  auto fsync_path = [&](const std::string& path, int flags) -> absl::Status {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
    if (fd < 0) return errno_error(errno, "cannot open", path);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return errno_error(err, "cannot fsync", path);
    return absl::OkStatus();
  };
  struct Pending {
    std::string temp, final_path;
  };
  std::vector<Pending> files;
  size_t renamed = 0;
  auto discard = [&]() {
    for (size_t i = 0; i < files.size(); ++i) {
      std::remove(files[i].temp.c_str());
      std::remove((files[i].temp + ".tmp").c_str());  // Table's own temp
      if (i < renamed) std::remove(files[i].final_path.c_str());
    }
  };
  absl::MutexLock l(&mu_);
  int64_t keys = 0, nonzeros = 0;
  std::string first_path;
  absl::Status status;
  const bool from_copy = kept_copy && kept_copy_.size() == tables_.size() &&
                         kept_owned_ == owned_;
  if (kept_copy && !from_copy) {
    PS_LOG_WARN("no model copy kept over the ranges this server owns now; "
                "saving the live model");
  }
  for (size_t ti = 0; ti < tables_.size(); ++ti) {
    const auto& t = tables_[ti];
    const Table::ValueCopy* from = from_copy ? &kept_copy_[ti] : nullptr;
    const std::string base =
        absl::StrCat(dir, "/table-", t->id(), ".server-", id_);
    size_t k = 0, nz = 0;
    files.push_back({base + ".bin.partial", base + ".bin"});
    status = t->SaveBinary(files.back().temp, &k, &owned_, from);
    if (status.ok()) status = fsync_path(files.back().temp, O_RDONLY);
    if (!status.ok()) break;
    files.push_back({base + ".txt.partial", base + ".txt"});
    status = t->SaveText(files.back().temp, &nz, &owned_, from);
    if (status.ok()) status = fsync_path(files.back().temp, O_RDONLY);
    if (!status.ok()) break;
    keys += k;
    nonzeros += nz;
    if (first_path.empty()) first_path = base + ".bin";
  }
  for (; status.ok() && renamed < files.size(); ++renamed) {
    if (std::rename(files[renamed].temp.c_str(),
                    files[renamed].final_path.c_str()) != 0) {
      status = errno_error(errno, "cannot rename into",
                           files[renamed].final_path);
    }
  }
  if (status.ok()) status = fsync_path(dir, O_RDONLY | O_DIRECTORY);
  if (!status.ok()) {
    discard();
    return absl::Status(
        status.code(),
        absl::StrCat("S[", id_, "] saving the model to ", dir,
                     " failed, no file of it kept: ", status.message()));
  }
  resp->set_model_path(first_path);
  resp->set_keys(keys);
  resp->set_nonzeros(nonzeros);
  resp->set_saved_kept_copy(from_copy);
  return absl::OkStatus();
}

proto::ServerStatus ServerNode::Status() const {
  proto::ServerStatus s;
  {
    proto::HeartbeatRequest hb;
    FillHeartbeat(&hb);
    s.set_view_epoch(hb.view_epoch());
    *s.mutable_incomplete_ranges() = hb.incomplete_ranges();
  }
  absl::MutexLock l(&mu_);
  s.set_id(id_);
  int64_t keys = 0;
  for (const auto& t : tables_) keys += t->size();
  s.set_keys(keys);
  s.set_pushes(pushes_);
  s.set_pulls(pulls_);
  s.set_non_finite_pushes(non_finite_pushes_);
  int64_t non_finite_updates = 0;
  for (const auto& t : tables_) {
    non_finite_updates += static_cast<int64_t>(t->non_finite_updates());
  }
  s.set_non_finite_updates(non_finite_updates);
  s.set_replica_entries(replica_entries_);
  s.set_replica_batches(replica_batches_);
  s.set_replica_rows_by_slot(replica_rows_by_slot_);
  s.set_replica_rows_by_key(replica_rows_by_key_);
  absl::Time oldest = absl::InfiniteFuture();
  for (const auto& [backup, st] : streams_) {
    oldest = std::min(oldest, st.awaiting_since);
  }
  if (oldest != absl::InfiniteFuture()) {
    s.set_replication_waiting_ms(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(clock_->Now() - oldest)));
  }
  s.set_ranges(static_cast<int>(owned_.size()));
  for (int r : owned_) {
    if (r >= static_cast<int>(logs_.size())) break;
    for (const auto& [b, index] : logs_[r].acked) {
      proto::ServerStatus::Replica* rep = s.add_synced();
      rep->set_range(r);
      rep->set_server(b);
    }
  }
  if (consistency_) {
    for (int64_t c : consistency_->MinClockPerWorker()) s.add_worker_clocks(c);
  }
  return s;
}

void ServerNode::Tick() {
  ConsistencyController* c;
  {
    absl::MutexLock l(&mu_);
    c = consistency_.get();
    WarnOfStuckAnswerLocked();
    WarnOfNonFiniteUpdatesLocked();
  }
  if (c != nullptr) c->ExpireWaits();
}

void ServerNode::WarnOfNonFiniteUpdatesLocked() {
  // Pushes that left some elements as they were are answered OK (the rest
  // of each push applied), so this is where it shows: at once, then at
  // most every kStuckAnswerWarning while the count grows.
  const absl::Time now = clock_->Now();
  if (now - non_finite_warned_ < kStuckAnswerWarning ||
      now - non_finite_checked_ < absl::Seconds(1)) {
    return;
  }
  non_finite_checked_ = now;  // a look reads every partition's count
  for (const auto& t : tables_) {
    const uint64_t n = t->non_finite_updates();
    const int id = t->spec().id;
    uint64_t& seen = non_finite_seen_[id];
    if (n <= seen) continue;
    PS_LOG_WARN("S[{}] table {}: {} value elements were not updated (now {} "
                "in all): their update would have stored a weight or "
                "optimizer state that is not finite, from gradients too "
                "large for single precision (a diverging worker: lower the "
                "learning rate, scale the features or clip the gradients)",
                id_, id, n - seen, n);
    seen = n;
    non_finite_warned_ = now;
  }
}

void ServerNode::WarnOfStuckAnswerLocked() {
  // The oldest answer still waiting for its replication. Only a backup
  // that stays silent without being failed over, or a bug, keeps one this
  // long: a worker then sees a server that answers its status but not its
  // push, and in BSP the job stalls; this says what the answer waits for.
  if (ack_waits_.empty()) return;
  const absl::Time now = clock_->Now();
  const AckWait& w = ack_waits_.front();
  if (now - w.since < kStuckAnswerWarning ||
      now - stuck_warned_ < kStuckAnswerWarning) {
    return;
  }
  stuck_warned_ = now;
  std::string what;
  for (const auto& [r, index] : w.needs) {
    if (what.size() > 400) {
      absl::StrAppend(&what, " ...");
      break;
    }
    absl::StrAppend(&what, what.empty() ? "" : "; ", "range ", r);
    if (index < 0) {
      absl::StrAppend(&what, ": BSP clock ", -(index + 1),
                      " not applied (applied: ", ranges_[r].BspApplied(),
                      ")");
      continue;
    }
    absl::StrAppend(&what, ": index ", index, ", acked by {");
    if (routing_ != nullptr) {
      for (int i = 0; i < routing_->replicas(); ++i) {
        const int b = routing_->BackupOfRange(r, i);
        if (b < 0 || b == id_) continue;
        auto it = logs_[r].acked.find(b);
        absl::StrAppend(&what, " S[", b, "]: ",
                        it == logs_[r].acked.end() ? -1 : it->second);
      }
    }
    absl::StrAppend(&what, " }");
  }
  PS_LOG_WARN("S[{}] epoch {}: an answer has waited {} for its replication "
              "({} waiting): {}",
              id_, epoch_, absl::FormatDuration(now - w.since),
              ack_waits_.size(), what);
}

void ServerNode::CancelAll(const absl::Status& status) {
  ConsistencyController* c;
  std::list<AckWait> waits;
  {
    absl::MutexLock l(&mu_);
    c = consistency_.get();
    waits.swap(ack_waits_);
    closed_ = status.ok() ? absl::CancelledError("server closed") : status;
  }
  for (AckWait& w : waits) RunWait(w, status);
  if (c != nullptr) c->CancelAll(status);
}

}  // namespace ps
