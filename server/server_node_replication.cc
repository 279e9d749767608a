// Replication of key ranges (issue 9, docs/fault_tolerance.md).
//
// The primary of a range logs every input it applies to the range (a push
// segment, a clock announcement, a finish, a worker's death) with the next
// index of the range's log, and queues the entry on one stream per backup
// server. A stream has at most one batch in flight, so a backup receives
// each range's entries in index order; it applies entry i only after i - 1
// and skips an index it has (a resend). An answer to a worker waits until
// every entry its request logged (a duplicate: everything logged before it)
// is on every backup of the range: nothing acknowledged lives on one server
// only. A backup that is new to a range (after a failover, or a promoted
// primary's backups) first gets a copy of the whole range at the current
// index: its consistency state and table rows; the entries after it follow
// on the same stream.
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/logging.h"
#include "common/proto_span.h"
#include "common/status_macros.h"
#include "server/server_node.h"
#include "transport/errors.h"

namespace ps {
namespace {

// `fn` wrapped so that it does nothing once the node is being destroyed,
// and the destructor waits while it runs.
template <typename L, typename F>
auto GuardedBy(std::shared_ptr<L> life, F fn) {
  return [life = std::move(life), fn = std::move(fn)](auto&&... args) mutable {
    {
      absl::MutexLock l(&life->mu);
      if (!life->alive) return;
      ++life->running;
    }
    fn(std::forward<decltype(args)>(args)...);
    absl::MutexLock l(&life->mu);
    --life->running;
  };
}

constexpr int kMaxBatchEntries = 512;
constexpr size_t kMaxBatchBytes = 8 << 20;
constexpr absl::Duration kReplicateTimeout = absl::Seconds(10);

// What a batch counts for a BSP entry: its sums' bytes.
size_t BspBytes(const proto::ReplicaBspClocks& bc) {
  return 64 + 16 * static_cast<size_t>(bc.seg_seqs_size()) +
         bc.sum_keys().size() + bc.sum_vals().size();
}

// Where a clock of a packed ReplicaBspClocks starts in its flat arrays:
// its first segment, announcement and sum, and the first byte of its sums'
// keys and floats.
struct BspClockAt {
  int seg = 0;
  int ann = 0;
  int sum = 0;
  size_t key_byte = 0;
  size_t val_byte = 0;
};

// The start of every clock of `bc` and, last, the end of the arrays, for
// the server's `tables`. INVALID_ARGUMENT when the arrays do not match
// their counts or a sum names no table.
absl::StatusOr<std::vector<BspClockAt>> LayOutBspClocks(
    const proto::ReplicaBspClocks& bc,
    const std::vector<std::unique_ptr<Table>>& tables) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicated BSP clocks: ", what));
  };
  const int n = bc.ranges_size();
  if (bc.indexes_size() != n || bc.clocks_size() != n ||
      bc.examples_size() != n || bc.num_segs_size() != n ||
      bc.num_anns_size() != n || bc.num_sums_size() != n) {
    return bad("per-clock arrays of different lengths");
  }
  const int anns = bc.ann_workers_size();
  const int sums = bc.sum_tables_size();
  if (bc.seg_seqs_size() != bc.seg_workers_size() ||
      bc.ann_segments_size() != anns || bc.ann_examples_size() != anns ||
      bc.ann_settled_size() != anns || bc.sum_num_keys_size() != sums) {
    return bad("entry arrays of different lengths");
  }
  const auto num_segs = AsSpan(bc.num_segs());
  const auto num_anns = AsSpan(bc.num_anns());
  const auto num_sums = AsSpan(bc.num_sums());
  const auto sum_tables = AsSpan(bc.sum_tables());
  const auto sum_num_keys = AsSpan(bc.sum_num_keys());
  std::vector<BspClockAt> at(static_cast<size_t>(n) + 1);
  BspClockAt next;
  for (int i = 0; i < n; ++i) {
    at[i] = next;
    if (num_segs[i] < 0 || num_anns[i] < 0 || num_sums[i] < 0 ||
        num_segs[i] > bc.seg_workers_size() - next.seg ||
        num_anns[i] > anns - next.ann || num_sums[i] > sums - next.sum) {
      return bad("counts do not match the arrays");
    }
    next.seg += num_segs[i];
    next.ann += num_anns[i];
    for (int j = next.sum; j < next.sum + num_sums[i]; ++j) {
      const int t = sum_tables[j];
      if (t < 0 || t >= static_cast<int>(tables.size())) {
        return bad(absl::StrCat("unknown table ", t));
      }
      const int d = tables[t]->dim();
      const int64_t keys = sum_num_keys[j];
      if (keys < 0 || static_cast<uint64_t>(keys) >
                          (bc.sum_keys().size() - next.key_byte) /
                              sizeof(uint64_t)) {
        return bad("sum keys do not match their counts");
      }
      next.key_byte += static_cast<size_t>(keys) * sizeof(uint64_t);
      const size_t vals =
          static_cast<size_t>(keys) * static_cast<size_t>(d) * sizeof(float);
      if (vals > bc.sum_vals().size() - next.val_byte) {
        return bad("sums do not match keys");
      }
      next.val_byte += vals;
    }
    next.sum += num_sums[i];
  }
  at[n] = next;
  if (next.seg != bc.seg_workers_size() || next.ann != anns ||
      next.sum != sums || next.key_byte != bc.sum_keys().size() ||
      next.val_byte != bc.sum_vals().size()) {
    return bad("counts do not match the arrays");
  }
  return at;
}

// Appends clock i of `from` (laid out in `at`) to `to`.
void AppendBspClock(const proto::ReplicaBspClocks& from,
                    const std::vector<BspClockAt>& at, int i,
                    proto::ReplicaBspClocks* to) {
  const BspClockAt& a = at[i];
  const BspClockAt& b = at[i + 1];
  to->add_ranges(from.ranges(i));
  to->add_indexes(from.indexes(i));
  to->add_clocks(from.clocks(i));
  to->add_examples(from.examples(i));
  to->add_num_segs(from.num_segs(i));
  to->add_num_anns(from.num_anns(i));
  to->add_num_sums(from.num_sums(i));
  auto copy = [](const auto& src, int first, int last, auto* dst) {
    dst->Add(src.begin() + first, src.begin() + last);
  };
  copy(from.seg_workers(), a.seg, b.seg, to->mutable_seg_workers());
  copy(from.seg_seqs(), a.seg, b.seg, to->mutable_seg_seqs());
  copy(from.ann_workers(), a.ann, b.ann, to->mutable_ann_workers());
  copy(from.ann_segments(), a.ann, b.ann, to->mutable_ann_segments());
  copy(from.ann_examples(), a.ann, b.ann, to->mutable_ann_examples());
  copy(from.ann_settled(), a.ann, b.ann, to->mutable_ann_settled());
  copy(from.sum_tables(), a.sum, b.sum, to->mutable_sum_tables());
  copy(from.sum_num_keys(), a.sum, b.sum, to->mutable_sum_num_keys());
  to->mutable_sum_keys()->append(from.sum_keys(), a.key_byte,
                                 b.key_byte - a.key_byte);
  to->mutable_sum_vals()->append(from.sum_vals(), a.val_byte,
                                 b.val_byte - a.val_byte);
}

// What an entry counts for in a batch's bytes (kMaxBatchBytes) and in a
// stream's queued bytes (kLingerFlushBytes): a copy fills a batch.
size_t DeltaBytes(const proto::RangeDelta& d) {
  size_t n = 64 * static_cast<size_t>(d.state().workers_size());
  for (const proto::RangeCopy::Rows& rows : d.tables()) {
    n += rows.keys().size() + rows.entries().size();
  }
  return n;
}

size_t ReplicaEntryBytes(const proto::ReplicaEntry& e) {
  return e.has_push()        ? e.push().keys().size() + e.push().vals().size()
         : e.has_copy()      ? kMaxBatchBytes
         : e.has_delta()     ? DeltaBytes(e.delta())
         : e.has_announces() ? 32 * e.announces().ranges_size()
         : e.has_bsp()       ? BspBytes(e.bsp())
                             : 64;
}

absl::Duration RetryBackoff(int attempt) {
  return std::min(absl::Milliseconds(10) * (1 << std::min(attempt, 6)),
                  absl::Milliseconds(500));
}

// The keys of a replicated segment: ascending (unless not `ascending`: a
// delta's, where a repeat is harmless) and inside `range`.
absl::Status CheckRangeKeys(absl::string_view keys, const Routing& routing,
                            int range, bool ascending = true) {
  if (!ByteCountOk<uint64_t>(keys)) {
    return absl::InvalidArgumentError("replica keys: not a multiple of 8");
  }
  absl::Span<const uint64_t> k = ViewAs<uint64_t>(keys);
  const uint64_t begin = routing.RangeBegin(range);
  const uint64_t last = routing.RangeLast(range);
  for (size_t i = 0; i < k.size(); ++i) {
    if ((ascending && i > 0 && k[i] <= k[i - 1]) || k[i] < begin ||
        k[i] > last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica keys of range ", range, " not ascending or outside it"));
    }
  }
  return absl::OkStatus();
}

// A replica push's segment count: the length of its per-segment arrays,
// -1 when they differ.
int SegmentCount(const proto::ReplicaPush& p) {
  const int n = p.seg_ranges_size();
  if (p.seg_indexes_size() != n || p.seg_seqs_size() != n ||
      p.seg_num_keys_size() != n) {
    return -1;
  }
  return n;
}

// Calls fn(range, index) for every range entry `e` carries: a push's
// segments, a clock's announcements, or the entry's own range. (Not
// analysed: `fn` may require the caller's lock.)
template <typename F>
void ForEachRange(const proto::ReplicaEntry& e, F fn)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (e.has_push()) {
    const proto::ReplicaPush& p = e.push();
    const auto ranges = AsSpan(p.seg_ranges());
    const auto indexes = AsSpan(p.seg_indexes());
    const size_t n = std::min(ranges.size(), indexes.size());
    for (size_t i = 0; i < n; ++i) fn(ranges[i], indexes[i]);
  } else if (e.has_announces()) {
    const proto::ReplicaAnnounces& a = e.announces();
    const auto ranges = AsSpan(a.ranges());
    const auto indexes = AsSpan(a.indexes());
    const size_t n = std::min(ranges.size(), indexes.size());
    for (size_t i = 0; i < n; ++i) fn(ranges[i], indexes[i]);
  } else if (e.has_bsp()) {
    const proto::ReplicaBspClocks& b = e.bsp();
    const auto ranges = AsSpan(b.ranges());
    const auto indexes = AsSpan(b.indexes());
    const size_t n = std::min(ranges.size(), indexes.size());
    for (size_t i = 0; i < n; ++i) fn(ranges[i], indexes[i]);
  } else {
    fn(e.range(), e.index());
  }
}

}  // namespace

void ServerNode::SetPeers(ClientFactory* peers) {
  absl::MutexLock l(&mu_);
  peers_ = peers;
}

void ServerNode::SetSuspectHandler(
    std::function<void(int server, absl::Duration silent)> suspect) {
  absl::MutexLock l(&mu_);
  suspect_ = std::move(suspect);
}

std::vector<int> ServerNode::SuspectSilentBackups(absl::Duration after) {
  std::vector<int> named;
  std::vector<absl::Duration> silences;
  std::function<void(int, absl::Duration)> suspect;
  {
    absl::MutexLock l(&mu_);
    if (!suspect_ || after <= absl::ZeroDuration()) return named;
    const absl::Time now = clock_->Now();
    for (const auto& [backup, st] : streams_) {
      // awaiting_since is InfiniteFuture when no batch is out.
      if (now - st.awaiting_since >= after &&
          suspected_.Due(backup, now, after)) {
        named.push_back(backup);
        silences.push_back(now - std::min(st.awaiting_since,
                                          st.unanswered_since));
      }
    }
    suspect = suspect_;
  }
  for (size_t i = 0; i < named.size(); ++i) {
    PS_LOG_INFO("S[{}] has left a replication batch unanswered for {}: "
                "asking the scheduler to probe it",
                named[i], absl::FormatDuration(silences[i]));
    suspect(named[i], silences[i]);
  }
  return named;
}

std::pair<int64_t, int64_t> ServerNode::FirstAck() const {
  absl::MutexLock l(&ack_mu_);
  return {first_ack_epoch_, first_ack_ms_};
}

void ServerNode::NoteWorkerGone(int32_t worker) {
  absl::MutexLock l(&gone_mu_);
  if (workers_gone_.size() < 1024 &&
      std::find(workers_gone_.begin(), workers_gone_.end(), worker) ==
          workers_gone_.end()) {
    workers_gone_.push_back(worker);
  }
}

void ServerNode::TakeWorkersGone(proto::HeartbeatRequest* req) {
  absl::MutexLock l(&gone_mu_);
  for (int32_t w : workers_gone_) req->add_workers_gone(w);
  workers_gone_.clear();
}

void ServerNode::FillHeartbeat(proto::HeartbeatRequest* req) const {
  req->set_role(proto::ROLE_SERVER);
  const auto [ack_epoch, ack_ms] = FirstAck();
  req->set_first_ack_epoch(ack_epoch);
  req->set_first_ack_unix_ms(ack_ms);
  absl::MutexLock l(&mu_);
  req->set_id(id_);
  if (routing_ == nullptr) return;
  req->set_view_epoch(epoch_);
  for (int r = 0; r < static_cast<int>(logs_.size()); ++r) {
    if (!logs_[r].complete && routing_->IsBackupOf(r, id_)) {
      req->add_incomplete_ranges(r);
    }
  }
}

void ServerNode::NoteAck(int64_t epoch) {
  if (epoch <= first_ack_seen_.load(std::memory_order_relaxed)) return;
  absl::MutexLock l(&ack_mu_);
  if (epoch <= first_ack_epoch_) return;
  first_ack_epoch_ = epoch;
  first_ack_ms_ = absl::ToUnixMillis(clock_->Now());
  first_ack_seen_.store(epoch, std::memory_order_relaxed);
}

void ServerNode::Later(absl::Duration delay, std::function<void()> fn) {
  clock_->RunAfter(delay, GuardedBy(life_, std::move(fn)));
}

bool ServerNode::HasBackups(int range) const {
  // Not tied to peers_: a node that lost its peers (shutting down) must not
  // answer anything as replicated; its answers wait (and fail with it).
  if (routing_ == nullptr || routing_->replicas() == 0) return false;
  for (int i = 0; i < routing_->replicas(); ++i) {
    if (routing_->BackupOfRange(range, i) >= 0) return true;
  }
  return false;
}

int64_t ServerNode::AssignIndexLocked(int range, Needs* needs) {
  const int64_t index = ++logs_[range].index;
  if (needs != nullptr) needs->emplace_back(range, index);
  return index;
}

ServerNode::Targets ServerNode::FeedTargetsLocked(int range) const {
  Targets to;
  const RangeLog& lg = logs_[range];
  for (int i = 0; i < routing_->replicas(); ++i) {
    const int b = routing_->BackupOfRange(range, i);
    if (b < 0 || b == id_) continue;
    // A backup waiting for its copy gets the range's state as of the copy,
    // which includes this entry.
    if (std::find(lg.copy_to.begin(), lg.copy_to.end(), b) != lg.copy_to.end()) {
      continue;
    }
    to.push_back(b);
  }
  return to;
}

void ServerNode::SetReplicationLinger(absl::Duration linger) {
  absl::MutexLock l(&mu_);
  replication_linger_ = std::max(linger, absl::ZeroDuration());
}

absl::Duration ServerNode::LingerLocked() const { return replication_linger_; }

void ServerNode::SetReplicationDeltas(bool deltas) {
  absl::MutexLock l(&mu_);
  replicate_deltas_ = deltas;
}

void ServerNode::MarkDirtyLocked(int range) {
  RangeLog& lg = logs_[range];
  if (lg.dirty) return;
  lg.dirty = true;
  if (dirty_ranges_.empty()) dirty_since_ = clock_->Now();
  dirty_ranges_.push_back(range);
  dirty_bytes_ += 64;
}

void ServerNode::AddDirtyKeysLocked(int range, int table,
                                    absl::Span<const uint64_t> keys,
                                    const uint32_t* slots,
                                    uint64_t generation) {
  MarkDirtyLocked(range);
  RangeLog& lg = logs_[range];
  if (lg.dirty_rows.size() <= static_cast<size_t>(table)) {
    lg.dirty_rows.resize(static_cast<size_t>(table) + 1);
  }
  RangeLog::DirtyRows& d = lg.dirty_rows[table];
  if (d.keys.empty()) d.generation = generation;
  if (slots == nullptr || generation != d.generation) {
    d.by_slot = false;  // the range was cleared in between: by keys
    d.slots.clear();
  }
  d.keys.insert(d.keys.end(), keys.begin(), keys.end());
  if (d.by_slot) d.slots.insert(d.slots.end(), slots, slots + keys.size());
  CountDirtyRowsLocked(table, keys.size());
}

void ServerNode::CountDirtyRowsLocked(int table, size_t rows) {
  // A key and its row (the bound the linger was tuned with), also for a
  // row by slot, which travels with a 4-byte slot.
  dirty_bytes_ += rows * (sizeof(uint64_t) +
                          tables_[table]->entry_floats() * sizeof(float));
}

void ServerNode::EndBySlotLocked(int range) {
  RangeLog& lg = logs_[range];
  if (!lg.by_slot) return;
  lg.by_slot = false;
  for (const auto& t : tables_) t->StopJournal(range);
}

bool ServerNode::DirtyDueLocked() {
  if (dirty_ranges_.empty()) return false;
  const absl::Duration linger = LingerLocked();
  if (linger <= absl::ZeroDuration() || dirty_bytes_ >= kLingerFlushBytes) {
    return true;
  }
  const absl::Duration left = dirty_since_ + linger - clock_->Now();
  if (left <= absl::ZeroDuration()) return true;
  if (!dirty_timer_armed_) {
    dirty_timer_armed_ = true;
    Later(left, [this] {
      {
        absl::MutexLock l(&mu_);
        dirty_timer_armed_ = false;
      }
      Kick();
    });
  }
  return false;
}

void ServerNode::ShipDirtyLocked() {
  size_t kept = 0;
  Targets fed;  // streams given a delta now
  bool copies_due = false;
  for (int r : dirty_ranges_) {
    RangeLog& lg = logs_[r];
    if (!lg.dirty) continue;
    if (routing_ == nullptr || routing_->OwnerOfRange(r) != id_) {
      lg.ClearDirty();  // moved away: its new owner's copies carry it
      continue;
    }
    const Targets to = FeedTargetsLocked(r);
    // Only when a backup's stream can take it now: until then the range
    // goes on gathering, and one delta covers more pushes.
    bool idle = to.empty();
    for (int b : to) {
      auto it = streams_.find(b);
      if (it == streams_.end() || !it->second.sending) idle = true;
    }
    if (!idle) {
      dirty_ranges_[kept++] = r;
      continue;
    }
    switch (ShipRangeLocked(r, to, &fed)) {
      case Shipped::kDelta:
        break;
      case Shipped::kNotQuiet:
        // A push to it awaits its apply: the rows are not yet what the
        // state says. That push's end kicks again.
        dirty_ranges_[kept++] = r;
        break;
      case Shipped::kRecopy:
        copies_due = true;
        break;
    }
  }
  dirty_ranges_.resize(kept);
  if (kept == 0) dirty_bytes_ = 0;
  // The deltas served their linger as dirt: they go as soon as the stream
  // is idle.
  for (int b : fed) streams_[b].first_queued = clock_->Now() - LingerLocked();
  if (copies_due) {
    Later(absl::ZeroDuration(), [this] {
      TakeCopies();
      Kick();
    });
  }
}

ServerNode::Shipped ServerNode::ShipRangeLocked(int r, const Targets& to,
                                                Targets* fed) {
  RangeLog& lg = logs_[r];
  if (to.empty()) {  // every backup awaits a copy, which will cover it
    lg.shipped = lg.index;
    lg.ClearDirty();
    return Shipped::kDelta;
  }
  absl::StatusOr<proto::RangeStateSnapshot> snap = ranges_[r].Snapshot();
  if (!snap.ok()) return Shipped::kNotQuiet;
  proto::ReplicaEntry e;
  e.set_range(r);
  e.set_index(lg.index);
  proto::RangeDelta* d = e.mutable_delta();
  d->set_base(lg.shipped);
  *d->mutable_state() = std::move(*snap);
  std::vector<uint64_t>& keys = delta_keys_;
  std::vector<float>& entries = delta_entries_;
  Table::DeltaRows by_slot;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const RangeLog::DirtyRows* dirty =
        t < lg.dirty_rows.size() ? &lg.dirty_rows[t] : nullptr;
    if (lg.by_slot) {
      // By slot, from the journal the pushes wrote as they applied: the
      // backups' layout is ours (no key lookups there, and a slot instead
      // of a key on the wire for rows they hold). A push the journal
      // missed (by keys), or a partition changed under it: the backups get
      // a copy of the range instead.
      if (t >= lg.synced_slots.size() ||
          (dirty != nullptr && !dirty->keys.empty()) ||
          !tables_[t]->TakeJournal(r, lg.synced_generations[t],
                                   lg.synced_slots[t], &by_slot)) {
        PS_LOG_WARN("S[{}] range {}: its journal does not cover its pushes "
                    "since the last delta; its backups get a copy",
                    id_, r);
        EndBySlotLocked(r);
        for (int b : to) {  // fed, so none awaits a copy yet
          lg.acked.erase(b);
          lg.copy_to.push_back(b);
        }
        lg.shipped = lg.index;  // the copy covers it
        lg.ClearDirty();
        return Shipped::kRecopy;
      }
      const size_t made = by_slot.rows();
      if (made == 0) continue;
      proto::RangeCopy::Rows* rows = d->add_tables();
      rows->set_table(static_cast<int32_t>(t));
      rows->set_by_slot(true);
      // Moved, not copied (the journal starts new strings).
      rows->set_slots(std::move(by_slot.slots));
      rows->set_slot_bits(std::move(by_slot.slot_bits));
      rows->set_keys(std::move(by_slot.new_keys));
      rows->set_entries(std::move(by_slot.entries));
      rows->set_base_slots(by_slot.base_slots);
      rows->set_base_digest(lg.synced_digests[t]);
      lg.synced_slots[t] = by_slot.num_slots;
      lg.synced_digests[t] = by_slot.digest;
      replica_rows_by_slot_ += static_cast<int64_t>(made);
      continue;
    }
    if (dirty == nullptr || dirty->keys.empty()) continue;
    const RangeLog::DirtyRows& dr = *dirty;
    keys.clear();
    entries.clear();
    // Each key once (by its slot), in the order first pushed: no sort
    // (sorting 100k random keys a push cost more than replaying it), and no
    // hashing where the pushes' slots are still good.
    tables_[t]->ExportKeys(r, dr.keys, dr.by_slot ? dr.slots.data() : nullptr,
                           dr.generation, &keys, &entries);
    if (keys.empty()) continue;
    proto::RangeCopy::Rows* rows = d->add_tables();
    rows->set_table(static_cast<int32_t>(t));
    rows->set_keys(keys.data(), keys.size() * sizeof(uint64_t));
    rows->set_entries(entries.data(), entries.size() * sizeof(float));
    replica_rows_by_key_ += static_cast<int64_t>(keys.size());
  }
  for (size_t i = 0; i < to.size(); ++i) {
    if (fed != nullptr &&
        std::find(fed->begin(), fed->end(), to[i]) == fed->end()) {
      fed->push_back(to[i]);
    }
    if (i + 1 == to.size()) {
      EnqueueLocked(to[i], std::move(e));
    } else {
      EnqueueLocked(to[i], e);
    }
  }
  lg.shipped = lg.index;
  lg.ClearDirty();
  return Shipped::kDelta;
}

void ServerNode::QueueLocked(int backup, proto::ReplicaEntry e) {
  auto [it, inserted] = streams_.try_emplace(backup);
  Stream& st = it->second;
  if (inserted) st.generation = ++next_generation_;
  if (st.queue.empty() && LingerLocked() > absl::ZeroDuration()) {
    st.first_queued = clock_->Now();
  }
  st.queued_bytes += ReplicaEntryBytes(e);
  st.queue.push_back(std::move(e));
}

void ServerNode::EnqueueLocked(int backup, proto::ReplicaEntry e) {
  QueueLocked(backup, std::move(e));
  ++replica_entries_;
}

void ServerNode::RecountLocked(Stream* st) {
  st->queued_bytes = 0;
  for (const proto::ReplicaEntry& e : st->queue) {
    st->queued_bytes += ReplicaEntryBytes(e);
  }
}

void ServerNode::LogEntry(int range, proto::ReplicaEntry e, Needs* needs) {
  if (DeltasLocked()) {
    AssignIndexLocked(range, needs);
    MarkDirtyLocked(range);  // the range's state goes in its next delta
    return;
  }
  e.set_range(range);
  e.set_index(AssignIndexLocked(range, needs));
  const Targets to = FeedTargetsLocked(range);
  for (size_t i = 0; i < to.size(); ++i) {
    if (i + 1 == to.size()) {
      EnqueueLocked(to[i], std::move(e));
    } else {
      EnqueueLocked(to[i], e);
    }
  }
}

namespace {

// Spares kept per kind, and the most bytes of capacity one may keep: a
// spare holds the arrays of the largest entry it carried.
constexpr size_t kMaxSpares = 32;
constexpr size_t kMaxSpareBytes = size_t{64} << 10;
// Entry objects kept: about a batch's worth.
constexpr size_t kMaxSpareEntries = 256;

size_t Capacity(const proto::ReplicaPush& p) {
  return p.keys().capacity() + p.vals().capacity() +
         (p.seg_ranges().Capacity() + p.seg_num_keys().Capacity()) * 4 +
         (p.seg_indexes().Capacity() + p.seg_seqs().Capacity()) * 8;
}

size_t Capacity(const proto::ReplicaAnnounces& a) {
  return a.ranges().Capacity() * 4 +
         (a.indexes().Capacity() + a.segments().Capacity() +
          a.settled_seqs().Capacity()) *
             8;
}

template <typename M>
void Keep(M* m, std::vector<std::unique_ptr<M>>* spares) {
  std::unique_ptr<M> owned(m);
  if (spares->size() >= kMaxSpares || Capacity(*m) > kMaxSpareBytes) return;
  m->Clear();  // keeps the arrays' and strings' capacity
  spares->push_back(std::move(owned));
}

}  // namespace

void ServerNode::RecycleLocked(proto::ReplicateRequest* req) {
  auto* entries = req->mutable_entries();
  while (!entries->empty()) {
    std::unique_ptr<proto::ReplicaEntry> e(entries->ReleaseLast());
    if (e->has_push()) {
      Keep(e->release_push(), &spares_.pushes);
    } else if (e->has_announces()) {
      Keep(e->release_announces(), &spares_.announces);
    }
    if (spares_.entries.size() < kMaxSpareEntries) {
      e->Clear();
      spares_.entries.push_back(std::move(e));
    }
  }
}

void ServerNode::LogPushLocked(const proto::PushRequest& req,
                               absl::Span<const uint64_t> keys,
                               const float* vals, int dim,
                               const std::vector<LoggedSegment>& segs) {
  // One entry per backup (a push feeds two or three): a short list.
  absl::InlinedVector<std::pair<int, proto::ReplicaEntry>, 4> per_backup;
  for (const LoggedSegment& seg : segs) {
    for (int b : FeedTargetsLocked(seg.range)) {
      auto it = std::find_if(per_backup.begin(), per_backup.end(),
                             [b](const auto& x) { return x.first == b; });
      if (it == per_backup.end()) {
        it = per_backup.emplace(per_backup.end());
        it->first = b;
        proto::ReplicaPush* p = TakeSpare(&spares_.pushes);
        it->second.set_allocated_push(p);
        p->set_worker(req.worker_id());
        p->set_clock(req.clock());
        p->set_table(req.table());
        p->set_num_examples(req.num_examples());
      }
      proto::ReplicaPush* p = it->second.mutable_push();
      p->add_seg_ranges(seg.range);
      p->add_seg_indexes(seg.index);
      p->add_seg_seqs(seg.seq);
      p->add_seg_num_keys(static_cast<int64_t>(seg.last - seg.first));
      p->mutable_keys()->append(
          reinterpret_cast<const char*>(keys.data() + seg.first),
          (seg.last - seg.first) * sizeof(uint64_t));
      p->mutable_vals()->append(
          reinterpret_cast<const char*>(vals + seg.first * dim),
          (seg.last - seg.first) * dim * sizeof(float));
    }
  }
  std::sort(per_backup.begin(), per_backup.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  for (auto& [b, e] : per_backup) EnqueueLocked(b, std::move(e));
}

bool ServerNode::PruneForLocked(int backup, proto::ReplicaEntry* e) const {
  auto wanted = [&](int r) ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return r >= 0 && r < static_cast<int>(logs_.size()) &&
           logs_[r].acked.contains(backup);
  };
  if (e->has_copy()) {
    // A copy only for a backup of a range this server still owns: the
    // backup refuses any other as stale-epoch, on every resend, and the
    // whole stream behind it waits (its primary's later entries, and the
    // acknowledgements of every push and clock they carry).
    const int r = e->range();
    return routing_ != nullptr && r >= 0 &&
           r < static_cast<int>(logs_.size()) &&
           routing_->OwnerOfRange(r) == id_ && routing_->IsBackupOf(r, backup);
  }
  if (e->has_bsp()) {
    const proto::ReplicaBspClocks& bc = e->bsp();
    int kept = 0;
    for (int r : bc.ranges()) kept += wanted(r) ? 1 : 0;
    if (kept == bc.ranges_size() || kept == 0) return kept > 0;
    auto at = LayOutBspClocks(bc, tables_);
    if (!at.ok()) return true;  // malformed: the backup refuses it whole
    proto::ReplicaBspClocks pruned;
    for (int i = 0; i < bc.ranges_size(); ++i) {
      if (wanted(bc.ranges(i))) AppendBspClock(bc, *at, i, &pruned);
    }
    *e->mutable_bsp() = std::move(pruned);
    return true;
  }
  if (e->has_announces()) {
    proto::ReplicaAnnounces* a = e->mutable_announces();
    int kept = 0;
    for (int i = 0; i < a->ranges_size(); ++i) {
      if (!wanted(a->ranges(i))) continue;
      a->set_ranges(kept, a->ranges(i));
      a->set_indexes(kept, a->indexes(i));
      a->set_segments(kept, a->segments(i));
      a->set_settled_seqs(kept, a->settled_seqs(i));
      ++kept;
    }
    a->mutable_ranges()->Truncate(kept);
    a->mutable_indexes()->Truncate(kept);
    a->mutable_segments()->Truncate(kept);
    a->mutable_settled_seqs()->Truncate(kept);
    return kept > 0;
  }
  if (!e->has_push()) return wanted(e->range());
  proto::ReplicaPush* p = e->mutable_push();
  const int segs = SegmentCount(*p);
  if (segs < 0) return true;  // malformed: the backup refuses it whole
  bool all = true;
  for (int i = 0; i < segs; ++i) {
    if (!wanted(p->seg_ranges(i))) all = false;
  }
  if (all) return true;
  const size_t key_bytes = sizeof(uint64_t);
  const size_t nkeys = p->keys().size() / key_bytes;
  const size_t val_bytes = nkeys > 0 ? p->vals().size() / nkeys : 0;
  proto::ReplicaPush kept;
  kept.set_worker(p->worker());
  kept.set_clock(p->clock());
  kept.set_table(p->table());
  kept.set_num_examples(p->num_examples());
  size_t at = 0;
  for (int i = 0; i < segs; ++i) {
    const size_t n = static_cast<size_t>(p->seg_num_keys(i));
    if (wanted(p->seg_ranges(i))) {
      kept.add_seg_ranges(p->seg_ranges(i));
      kept.add_seg_indexes(p->seg_indexes(i));
      kept.add_seg_seqs(p->seg_seqs(i));
      kept.add_seg_num_keys(p->seg_num_keys(i));
      kept.mutable_keys()->append(p->keys(), at * key_bytes, n * key_bytes);
      kept.mutable_vals()->append(p->vals(), at * val_bytes, n * val_bytes);
    }
    at += n;
  }
  if (kept.seg_ranges_size() == 0) return false;
  *p = std::move(kept);
  return true;
}

absl::Status ServerNode::CheckSenderLocked(int from, int64_t epoch,
                                           int range) const {
  if (range < 0 || range >= static_cast<int>(ranges_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown range ", range));
  }
  if (routing_->OwnerOfRange(range) == from && routing_->IsBackupOf(range, id_)) {
    return absl::OkStatus();
  }
  if (epoch > epoch_) {
    return ErrorWithReason(absl::StatusCode::kUnavailable,
                           proto::REASON_VIEW_BEHIND,
                           absl::StrCat("view behind: replica epoch ", epoch,
                                        ", server epoch ", epoch_));
  }
  return ErrorWithReason(
      absl::StatusCode::kFailedPrecondition, proto::REASON_STALE_EPOCH,
      absl::StrCat("stale-epoch: S[", id_, "] is not S[", from,
                   "]'s backup of range ", range, " at epoch ", epoch_));
}

void ServerNode::NeedCurrent(int range, Needs* needs) {
  if (logs_[range].index > 0) needs->emplace_back(range, logs_[range].index);
}

void ServerNode::FlushBspClocksLocked() {
  const int n = bsp_out_.ranges_size();
  if (n > 0) LogBspClocksLocked();
  if (bsp_applied_unreplicated_) {
    bsp_applied_unreplicated_ = false;
    // An answer made while the range had a backup waits for its clock's
    // acknowledgement by that backup. Once the backup failed over, the
    // clock is applied here alone: nothing acknowledges it, so the answer
    // is due as soon as it is applied (before: it waited for the next
    // view, and a BSP job stalled until a pull's wait expired). Checked
    // after the logging above, so a clock of a replicated range is waited
    // for at its own index.
    if (!ack_waits_.empty()) AnswerReadyLaterLocked();
  }
}

void ServerNode::LogBspClocksLocked() {
  const int n = bsp_out_.ranges_size();
  // Built by ApplyBsp: laid out without error.
  const std::vector<BspClockAt> at = LayOutBspClocks(bsp_out_, tables_).value();
  std::map<int, proto::ReplicaEntry> per_backup;
  // Per range, the last clock logged now and its index (which covers the
  // range's earlier clocks too).
  absl::flat_hash_map<int, std::pair<int64_t, int64_t>> logged;
  const auto ranges = AsSpan(bsp_out_.ranges());
  const auto clocks = AsSpan(bsp_out_.clocks());
  int64_t* const indexes = bsp_out_.mutable_indexes()->mutable_data();
  for (int i = 0; i < n; ++i) {
    const int r = ranges[i];
    const int64_t index = AssignIndexLocked(r, nullptr);
    indexes[i] = index;
    logged[r] = {clocks[i], index};
    for (int b : FeedTargetsLocked(r)) {
      AppendBspClock(bsp_out_, at, i, per_backup[b].mutable_bsp());
    }
  }
  bsp_out_.Clear();
  for (auto& [b, e] : per_backup) EnqueueLocked(b, std::move(e));
  for (AckWait& w : ack_waits_) {
    for (auto& [r, index] : w.needs) {
      if (index >= 0) continue;
      auto it = logged.find(r);
      if (it != logged.end() && -(index + 1) <= it->second.first) {
        index = it->second.second;
      }
    }
  }
}

void ServerNode::ResolveClockNeedsLocked(Needs* needs) const {
  for (auto& [r, index] : *needs) {
    if (index >= 0) continue;
    if (ranges_[r].BspApplied() > -(index + 1)) index = logs_[r].index;
  }
}

bool ServerNode::CommittedLocked(const Needs& needs) const {
  for (const auto& [r, index] : needs) {
    if (index < 0) return false;  // a BSP clock not applied yet
    if (index == 0 || routing_ == nullptr) continue;
    const RangeLog& lg = logs_[r];
    for (int i = 0; i < routing_->replicas(); ++i) {
      const int b = routing_->BackupOfRange(r, i);
      if (b < 0 || b == id_) continue;
      auto it = lg.acked.find(b);
      if (it == lg.acked.end() || it->second < index) return false;
    }
  }
  return true;
}

bool ServerNode::LostLocked(const Needs& needs) const {
  if (routing_ == nullptr) return false;
  for (const auto& [r, index] : needs) {
    if (index != 0 && routing_->OwnerOfRange(r) != id_) return true;
  }
  return false;
}

absl::Status ServerNode::MovedAwayLocked() const {
  return ErrorWithReason(
      absl::StatusCode::kFailedPrecondition, proto::REASON_STALE_EPOCH,
      absl::StrCat("stale-epoch: a range of the request moved off S[", id_,
                   "] at epoch ", epoch_, " before its backups had it"));
}

void ServerNode::WhenCommitted(Needs needs, Fire fire, absl::Status answer,
                               int64_t ack_epoch) {
  AckWait w{std::move(needs), std::move(fire), std::move(answer), ack_epoch,
            clock_->Now()};
  absl::Status closed;
  {
    absl::MutexLock l(&mu_);
    closed = closed_;
    if (closed.ok()) ResolveClockNeedsLocked(&w.needs);
    if (closed.ok() && LostLocked(w.needs)) {
      closed = MovedAwayLocked();
    } else if (closed.ok() && !CommittedLocked(w.needs)) {
      ack_waits_.push_back(std::move(w));
      return;
    }
  }
  RunWait(w, closed);
}

void ServerNode::RunWait(AckWait& w, const absl::Status& why) {
  if (!why.ok()) {
    w.fire(why);
    return;
  }
  if (w.answer.ok() && w.ack_epoch >= 0) NoteAck(w.ack_epoch);
  w.fire(w.answer);
}

std::vector<std::pair<ServerNode::AckWait, absl::Status>>
ServerNode::TakeReadyLocked() {
  std::vector<std::pair<AckWait, absl::Status>> out;
  for (auto it = ack_waits_.begin(); it != ack_waits_.end();) {
    ResolveClockNeedsLocked(&it->needs);
    if (LostLocked(it->needs)) {
      out.emplace_back(std::move(*it), MovedAwayLocked());
      it = ack_waits_.erase(it);
    } else if (CommittedLocked(it->needs)) {
      out.emplace_back(std::move(*it), absl::OkStatus());
      it = ack_waits_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void ServerNode::ReconfigureReplicationLocked(const Routing* old) {
  if (logs_.size() != ranges_.size()) logs_.resize(ranges_.size());
  for (int r = 0; r < static_cast<int>(ranges_.size()); ++r) {
    RangeLog& lg = logs_[r];
    const bool owner = routing_->OwnerOfRange(r) == id_;
    const bool owner_before = old != nullptr && old->OwnerOfRange(r) == id_;
    const bool backup_now = routing_->IsBackupOf(r, id_);
    if (old == nullptr) {
      // The job's start (epoch 1): every replica is empty, so complete. A
      // server configured first at a later view (it joined) holds nothing
      // until a copy.
      lg.complete = (owner || backup_now) && routing_->epoch() <= 1;
    } else if (!owner && !backup_now) {
      lg.complete = false;  // no longer follows the range
    }
    if (owner) {
      if (lg.awaiting_copy) {
        // Promoted while waiting for a copy from a primary that died in
        // between: its own replica is whole when it followed the range's
        // earlier primary (every acknowledged entry is on it); a backup new
        // to the range holds nothing (two failures within one copy's time).
        if (lg.complete) {
          PS_LOG_INFO("S[{}] promoted to owner of range {} while awaiting a "
                      "copy; its replica is complete up to entry {}",
                      id_, r, lg.index);
        }
        lg.awaiting_copy = false;
      }
      if (old != nullptr && !owner_before && !lg.complete && lost_.ok()) {
        // Made the owner of a range it holds no complete copy of: serving
        // it would hand the workers an emptied range as if nothing
        // happened. The scheduler promotes only complete replicas, so this
        // is a bug or two failures it could not see; refuse, loudly.
        lost_ = absl::DataLossError(absl::StrCat(
            "S[", id_, "] was made the owner of range ", r, " at epoch ",
            routing_->epoch(),
            " without a complete copy of it (its copy had not arrived): the "
            "range's earlier state is lost"));
        PS_LOG_ERROR("{}", std::string(lost_.message()));
      }
      lg.complete = true;
      // Deltas from here on: every backup new to the range gets a copy at
      // this index or later first.
      if (!owner_before) lg.shipped = lg.index;
      std::map<int, int64_t> acked;
      std::vector<int> copy_to;
      for (int i = 0; i < routing_->replicas(); ++i) {
        const int b = routing_->BackupOfRange(r, i);
        if (b < 0 || b == id_) continue;
        const bool pending = std::find(lg.copy_to.begin(), lg.copy_to.end(),
                                       b) != lg.copy_to.end();
        if (old == nullptr) {
          acked[b] = 0;  // the job's start: every replica is empty
        } else if (owner_before && old->IsBackupOf(r, b) && !pending &&
                   lg.acked.contains(b)) {
          acked[b] = lg.acked[b];
        } else {
          copy_to.push_back(b);
        }
      }
      lg.acked = std::move(acked);
      lg.copy_to = std::move(copy_to);
      if (old == nullptr && routing_->epoch() <= 1) {
        // The job's start: this replica and every backup's are empty, and
        // the backups build theirs from this server's deltas only.
        lg.by_slot = true;
        lg.synced_slots.assign(tables_.size(), 0);
        lg.synced_generations.assign(tables_.size(), 0);
        lg.synced_digests.assign(tables_.size(), 0);
        for (size_t t = 0; t < tables_.size(); ++t) {
          const Table::PartitionLayout layout = tables_[t]->Layout(r);
          if (layout.slots != 0) lg.by_slot = false;
          lg.synced_generations[t] = layout.generation;
        }
        // Only deltas take the journals (the per-input log replays the
        // pushes, and BSP's after aggregation its sums).
        if (!DeltasLocked()) lg.by_slot = false;
        if (lg.by_slot) {
          for (const auto& t : tables_) t->StartJournal(r);
        }
      } else if (!owner_before) {
        EndBySlotLocked(r);
      }
    } else {
      EndBySlotLocked(r);
      lg.acked.clear();
      lg.copy_to.clear();
      lg.dirty = false;  // its new owner's copies carry it
      lg.dirty_rows.clear();
      const bool backup = routing_->IsBackupOf(r, id_);
      if (backup && old != nullptr &&
          (!old->IsBackupOf(r, id_) ||
           old->OwnerOfRange(r) != routing_->OwnerOfRange(r))) {
        lg.awaiting_copy = true;  // a new primary, or new to this range
      } else if (!backup) {
        lg.awaiting_copy = false;
      }
    }
  }
  // Ranges no longer owned were cleared above; a dirty range is listed
  // once (MarkDirtyLocked).
  {
    size_t kept = 0;
    for (int r : dirty_ranges_) {
      if (logs_[r].dirty) dirty_ranges_[kept++] = r;
    }
    dirty_ranges_.resize(kept);
    if (kept == 0) dirty_bytes_ = 0;
  }
  // Drop queued entries no backup needs any more; drop idle streams of
  // servers that back nothing up now.
  for (auto it = streams_.begin(); it != streams_.end();) {
    const int b = it->first;
    std::deque<proto::ReplicaEntry>& q = it->second.queue;
    q.erase(std::remove_if(q.begin(), q.end(),
                           [&](proto::ReplicaEntry& e)
                               ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                             return !PruneForLocked(b, &e);
                           }),
            q.end());
    RecountLocked(&it->second);
    bool backs_up = false;
    for (int r : owned_) {
      if (routing_->IsBackupOf(r, b)) backs_up = true;
    }
    if (!backs_up && q.empty()) {
      it = streams_.erase(it);  // a batch in flight is ignored (generation)
    } else {
      ++it;
    }
  }
  // Answers waiting only on backups that are gone, or on ranges that moved
  // away (Configure holds mu_ here).
  AnswerReadyLaterLocked();
}

void ServerNode::AnswerReadyLaterLocked() {
  auto ready = TakeReadyLocked();
  if (ready.empty()) return;
  auto fires = std::make_shared<std::vector<std::pair<AckWait, absl::Status>>>(
      std::move(ready));
  Later(absl::ZeroDuration(), [this, fires] {
    for (auto& [w, st] : *fires) RunWait(w, st);
  });
}

void ServerNode::TakeCopies() {
  bool retry = false;
  {
    absl::MutexLock l(&mu_);
    if (routing_ == nullptr) return;
    for (int r : owned_) {
      RangeLog& lg = logs_[r];
      if (lg.copy_to.empty()) continue;
      absl::StatusOr<proto::RangeStateSnapshot> snap = ranges_[r].Snapshot();
      if (!snap.ok()) {  // a segment awaits its apply: a moment later
        retry = true;
        continue;
      }
      if (lg.by_slot && lg.dirty) {
        // The copy ends the range's journal, which holds the rows of its
        // pushes since the last delta: the backups that get no copy need
        // them (a push acknowledged on a delta without its rows is lost
        // once that backup is promoted). They get that delta first; a
        // journal that falls short makes them copies too. (Every caller
        // kicks the streams after this.)
        ShipRangeLocked(r, FeedTargetsLocked(r), /*fed=*/nullptr);
      }
      proto::ReplicaEntry e;
      e.set_range(r);
      e.set_index(lg.index);
      proto::RangeCopy* copy = e.mutable_copy();
      *copy->mutable_state() = std::move(*snap);
      std::vector<uint64_t> keys;
      std::vector<float> entries;
      for (const auto& t : tables_) {
        t->ExportRange(r, &keys, &entries);
        if (keys.empty()) continue;
        proto::RangeCopy::Rows* rows = copy->add_tables();
        rows->set_table(t->id());
        rows->set_keys(keys.data(), keys.size() * sizeof(uint64_t));
        rows->set_entries(entries.data(), entries.size() * sizeof(float));
      }
      for (int b : lg.copy_to) QueueLocked(b, e);
      EndBySlotLocked(r);  // that backup has the copy's layout, not ours
      PS_LOG_INFO("S[{}] copying range {} at entry {} to S[{}] ({} bytes)",
                  id_, r, lg.index, lg.copy_to.front(), e.ByteSizeLong());
      lg.copy_to.clear();
    }
    if (retry) {
      if (copy_retry_queued_) return;
      copy_retry_queued_ = true;
    }
  }
  if (retry) {
    Later(absl::Milliseconds(2), [this] {
      {
        absl::MutexLock l(&mu_);
        copy_retry_queued_ = false;
      }
      TakeCopies();
      Kick();
    });
  }
}

bool ServerNode::DueLocked(int backup, Stream* st) {
  if (st->sending || st->queue.empty()) return false;
  const absl::Duration linger = LingerLocked();
  if (linger <= absl::ZeroDuration() || st->queued_bytes >= kLingerFlushBytes) {
    return true;
  }
  const absl::Duration left = st->first_queued + linger - clock_->Now();
  if (left <= absl::ZeroDuration()) return true;
  if (!st->timer_armed) {
    st->timer_armed = true;
    Later(left, [this, backup, generation = st->generation] {
      {
        absl::MutexLock l(&mu_);
        auto it = streams_.find(backup);
        if (it == streams_.end() || it->second.generation != generation) {
          return;
        }
        it->second.timer_armed = false;
      }
      KickOne(backup);
    });
  }
  return false;
}

void ServerNode::Kick() {
  std::vector<int> due;
  {
    absl::MutexLock l(&mu_);
    if (DirtyDueLocked()) ShipDirtyLocked();
    for (auto& [b, st] : streams_) {
      if (DueLocked(b, &st)) due.push_back(b);
    }
  }
  for (int b : due) SendBatch(b);
}

void ServerNode::KickOne(int backup) {
  {
    absl::MutexLock l(&mu_);
    auto it = streams_.find(backup);
    if (it == streams_.end() || !DueLocked(backup, &it->second)) return;
  }
  SendBatch(backup);
}

void ServerNode::SendBatch(int backup) {
  auto req = std::make_shared<proto::ReplicateRequest>();
  uint64_t generation;
  {
    absl::MutexLock l(&mu_);
    auto it = streams_.find(backup);
    if (it == streams_.end() || it->second.sending ||
        it->second.queue.empty() || peers_ == nullptr) {
      return;
    }
    Stream& st = it->second;
    req->set_from_server(id_);
    req->set_epoch(epoch_);
    size_t bytes = 0;
    while (!st.queue.empty() && req->entries_size() < kMaxBatchEntries &&
           bytes < kMaxBatchBytes) {
      proto::ReplicaEntry& e = st.queue.front();
      const size_t n = ReplicaEntryBytes(e);
      bytes += n;
      st.queued_bytes -= n;  // counted by QueueLocked or RecountLocked
      proto::ReplicaEntry* to = TakeSpare(&spares_.entries);
      *to = std::move(e);
      req->mutable_entries()->AddAllocated(to);
      st.queue.pop_front();
    }
    st.sending = true;
    generation = st.generation;
    ++replica_batches_;
  }
  SendReplicate(backup, generation, std::move(req), 0);
}

void ServerNode::SendReplicate(int backup, uint64_t generation,
                               std::shared_ptr<proto::ReplicateRequest> req,
                               int attempt) {
  std::shared_ptr<ServerClient> client;
  {
    absl::MutexLock l(&mu_);
    if (peers_ == nullptr || backup >= routing_->num_servers()) return;
    client = peers_->Server(routing_->proto().servers(backup).address());
    auto st = streams_.find(backup);
    if (st != streams_.end() && st->second.generation == generation) {
      st->second.awaiting_since = clock_->Now();
      if (st->second.unanswered_since == absl::InfiniteFuture()) {
        st->second.unanswered_since = st->second.awaiting_since;
      }
    }
  }
  client->Replicate(
      req, clock_->Now() + kReplicateTimeout,
      GuardedBy(life_, [this, backup, generation, req, attempt](
                           const absl::Status& s, proto::ReplicateResponse*) {
        OnBatchReply(backup, generation, req, s, attempt);
      }));
}

void ServerNode::OnBatchReply(int backup, uint64_t generation,
                              std::shared_ptr<proto::ReplicateRequest> req,
                              const absl::Status& s, int attempt) {
  {
    absl::MutexLock l(&mu_);
    auto st = streams_.find(backup);
    if (st != streams_.end() && st->second.generation == generation) {
      st->second.awaiting_since = absl::InfiniteFuture();
      if (s.code() != absl::StatusCode::kUnavailable &&
          s.code() != absl::StatusCode::kDeadlineExceeded) {
        st->second.unanswered_since = absl::InfiniteFuture();  // it answered
      }
    }
  }
  if (s.ok()) {
    std::vector<std::pair<AckWait, absl::Status>> fires;
    {
      absl::MutexLock l(&mu_);
      auto acked = [&](int r, int64_t index, bool copy)
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        RangeLog& lg = logs_[r];
        auto it = lg.acked.find(backup);
        if (it != lg.acked.end()) {
          it->second = std::max(it->second, index);
        } else if (copy && routing_->OwnerOfRange(r) == id_ &&
                   routing_->IsBackupOf(r, backup)) {
          lg.acked[backup] = index;  // the copy makes it a replica
        }
      };
      for (const proto::ReplicaEntry& e : req->entries()) {
        ForEachRange(e, [&](int r, int64_t index)
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                              acked(r, index, e.has_copy());
                            });
      }
      auto st = streams_.find(backup);
      if (st != streams_.end() && st->second.generation == generation) {
        st->second.sending = false;
      }
      RecycleLocked(req.get());  // the batch is done with
      fires = TakeReadyLocked();
    }
    for (auto& [w, st] : fires) RunWait(w, st);
    Kick();  // also ships the deltas of ranges that waited for this stream
    return;
  }
  if (attempt == 0 || attempt % 50 == 0) {
    int self;
    {
      absl::MutexLock l(&mu_);
      self = id_;
    }
    if (ReasonOf(s) == proto::REASON_STALE_EPOCH) {
      // Expected around a view change (a range moved, a backup replaced):
      // the entries are pruned for the new view before the resend.
      PS_LOG_INFO("S[{}] replicating {} entries to S[{}]: {} (attempt {})",
                  self, req->entries_size(), backup, std::string(s.message()),
                  attempt + 1);
    } else {
      PS_LOG_WARN("S[{}] replicating {} entries to S[{}] failed (attempt {}): "
                  "{}",
                  self, req->entries_size(), backup, attempt + 1,
                  s.ToString());
    }
  }
  if (s.code() == absl::StatusCode::kDataLoss ||
      s.code() == absl::StatusCode::kInvalidArgument ||
      s.code() == absl::StatusCode::kInternal) {
    // The backup's state of these ranges is unusable: it gets a fresh copy
    // instead of the rest of the log.
    {
      absl::MutexLock l(&mu_);
      auto recopy = [&](int r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        RangeLog& lg = logs_[r];
        if (lg.acked.erase(backup) > 0) lg.copy_to.push_back(backup);
      };
      for (const proto::ReplicaEntry& e : req->entries()) {
        ForEachRange(e, [&](int r, int64_t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                            mu_) { recopy(r); });
      }
      auto st = streams_.find(backup);
      if (st != streams_.end() && st->second.generation == generation) {
        st->second.sending = false;
        std::deque<proto::ReplicaEntry>& q = st->second.queue;
        q.erase(std::remove_if(q.begin(), q.end(),
                               [&](proto::ReplicaEntry& e)
                                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                 return e.has_copy() ||
                                        !PruneForLocked(backup, &e);
                               }),
                q.end());
        RecountLocked(&st->second);
      }
    }
    Later(RetryBackoff(attempt), [this] {
      TakeCopies();
      Kick();
    });
    return;
  }
  // Not applied, or not known to be: the same batch again after a backoff,
  // minus entries of ranges the backup no longer holds for this server. A
  // dead backup is retried until the scheduler's next view drops it; an
  // unreachable one is reported so that the scheduler probes it at once
  // (the workers may not notice: they wait for this server's answers).
  const bool unreachable =
      (s.code() == absl::StatusCode::kUnavailable &&
       ReasonOf(s) != proto::REASON_VIEW_BEHIND) ||
      s.code() == absl::StatusCode::kDeadlineExceeded;
  Later(RetryBackoff(attempt), [this, backup, generation, req, attempt,
                                unreachable] {
    if (unreachable && attempt % 10 == 0) {
      std::function<void(int, absl::Duration)> suspect;
      absl::Duration silent = absl::ZeroDuration();
      {
        absl::MutexLock l(&mu_);
        suspect = suspect_;
        if (auto st = streams_.find(backup); st != streams_.end() &&
            st->second.unanswered_since != absl::InfiniteFuture()) {
          silent = clock_->Now() - st->second.unanswered_since;
        }
      }
      if (suspect) suspect(backup, silent);
    }
    {
      absl::MutexLock l(&mu_);
      auto st = streams_.find(backup);
      if (st == streams_.end() || st->second.generation != generation) {
        return;  // the backup left the view; its stream is gone
      }
      auto* entries = req->mutable_entries();
      entries->erase(
          std::remove_if(entries->begin(), entries->end(),
                         [&](proto::ReplicaEntry& e)
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           return !PruneForLocked(backup, &e);
                         }),
          entries->end());
      req->set_epoch(epoch_);
      if (entries->empty()) st->second.sending = false;
    }
    if (req->entries_size() == 0) {
      Kick();
      return;
    }
    SendReplicate(backup, generation, req, attempt + 1);
  });
}

absl::Status ServerNode::Replicate(const proto::ReplicateRequest& req,
                                   absl::Span<const char> vals) {
  RangeActionList actions;
  std::vector<int> finished;
  absl::Status s;
  {
    absl::MutexLock l(&mu_);
    if (consistency_ == nullptr) {
      return NotConfigured();
    }
    for (const proto::ReplicaEntry& e : req.entries()) {
      ForEachRange(e, [&](int r, int64_t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (s.ok()) s = CheckSenderLocked(req.from_server(), req.epoch(), r);
      });
      if (s.ok()) s = ApplyEntryLocked(req.from_server(), e, vals, &actions);
      if (!s.ok()) break;
    }
  }
  Publish(actions, finished);
  return s;
}

absl::StatusOr<bool> ServerNode::IsNextEntryLocked(int from, int range,
                                                  int64_t index) const {
  const RangeLog& lg = logs_[range];
  if (lg.awaiting_copy) {
    return absl::UnavailableError(
        absl::StrCat("range ", range, " awaits its copy from S[", from, "]"));
  }
  if (index <= lg.index) return false;
  if (index != lg.index + 1) {
    return absl::DataLossError(absl::StrCat("range ", range, ": entry ", index,
                                            " after ", lg.index));
  }
  return true;
}

absl::Status ServerNode::ApplyPushLocked(int from, const proto::ReplicaPush& p,
                                         RangeActionList* actions) {
  if (p.table() < 0 || p.table() >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica push: unknown table ", p.table()));
  }
  Table* t = tables_[p.table()].get();
  if (!ByteCountOk<uint64_t>(p.keys())) {
    return absl::InvalidArgumentError("replica keys: not a multiple of 8");
  }
  const size_t total = p.keys().size() / sizeof(uint64_t);
  const size_t dim = static_cast<size_t>(t->dim());
  if (p.vals().size() != total * dim * sizeof(float)) {
    return absl::InvalidArgumentError("replica push: vals do not match keys");
  }
  absl::Span<const uint64_t> keys = ViewAs<uint64_t>(p.keys());
  const float* vals = reinterpret_cast<const float*>(p.vals().data());
  const int segs = SegmentCount(p);
  if (segs < 0) {
    return absl::InvalidArgumentError(
        "replica push: segment arrays of different lengths");
  }
  size_t at = 0;
  const auto seg_ranges = AsSpan(p.seg_ranges());
  const auto seg_num_keys = AsSpan(p.seg_num_keys());
  const auto seg_indexes = AsSpan(p.seg_indexes());
  const auto seg_seqs = AsSpan(p.seg_seqs());
  for (int sg = 0; sg < segs; ++sg) {
    const int r = seg_ranges[sg];  // checked by the caller
    const int64_t num_keys = seg_num_keys[sg];
    if (num_keys < 0 || static_cast<uint64_t>(num_keys) > total - at) {
      return absl::InvalidArgumentError("replica push: segments do not match");
    }
    const size_t n = static_cast<size_t>(num_keys);
    absl::Span<const uint64_t> k = keys.subspan(at, n);
    const float* v = vals + at * dim;
    at += n;
    RangeLog& lg = logs_[r];
    PS_ASSIGN_OR_RETURN(const bool next,
                        IsNextEntryLocked(from, r, seg_indexes[sg]));
    if (!next) continue;  // a resend
    for (size_t i = 0; i < n; ++i) {
      if ((i > 0 && k[i] <= k[i - 1]) || k[i] < routing_->RangeBegin(r) ||
          k[i] > routing_->RangeLast(r)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "replica keys of range ", r, " not ascending or outside it"));
      }
    }
    RangeState& range = ranges_[r];
    BufferedSegment buffered;
    if (range.bsp()) {
      buffered.table = p.table();
      buffered.keys.assign(reinterpret_cast<const char*>(k.data()),
                           n * sizeof(uint64_t));
      buffered.vals.assign(reinterpret_cast<const char*>(v),
                           n * dim * sizeof(float));
    }
    RangeActions a;
    bool dup = false;
    absl::Status s =
        range.Accept(p.worker(), seg_seqs[sg], p.clock(), &buffered, &dup,
                     &a);
    if (s.ok() && !dup && !range.bsp()) {
      t->Push(r, k, v, t->optimizer().GradientScale(p.num_examples()));
      s = range.Applied(p.worker(), p.clock(), &a);
    }
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat("range ", r, " entry ",
                                              seg_indexes[sg],
                                              " refused by the replica: ",
                                              s.message()));
    }
    ApplyBsp(r, &a);
    AddActions(actions, r, &a);
    lg.index = seg_indexes[sg];
  }
  return absl::OkStatus();
}

absl::Status ServerNode::ApplyAnnouncesLocked(int from,
                                              const proto::ReplicaAnnounces& an,
                                              RangeActionList* actions) {
  const int n = an.ranges_size();
  if (an.indexes_size() != n || an.segments_size() != n ||
      an.settled_seqs_size() != n) {
    return absl::InvalidArgumentError(
        "replica announcements: arrays of different lengths");
  }
  const auto an_ranges = AsSpan(an.ranges());
  const auto an_indexes = AsSpan(an.indexes());
  const auto an_segments = AsSpan(an.segments());
  const auto an_settled_seqs = AsSpan(an.settled_seqs());
  for (int i = 0; i < n; ++i) {
    const int r = an_ranges[i];  // checked by the caller
    PS_ASSIGN_OR_RETURN(const bool next,
                        IsNextEntryLocked(from, r, an_indexes[i]));
    if (!next) continue;  // a resend
    RangeActions a;
    absl::Status s = ranges_[r].Announce(an.worker(), an.clock(),
                                         an_segments[i], an.examples(),
                                         an_settled_seqs[i], &a);
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat("range ", r, " entry ",
                                              an_indexes[i],
                                              " refused by the replica: ",
                                              s.message()));
    }
    ApplyBsp(r, &a);
    AddActions(actions, r, &a);
    logs_[r].index = an_indexes[i];
  }
  return absl::OkStatus();
}

absl::Status ServerNode::ApplyBspClocksLocked(
    int from, const proto::ReplicaBspClocks& bc, RangeActionList* actions) {
  PS_ASSIGN_OR_RETURN(const std::vector<BspClockAt> at,
                      LayOutBspClocks(bc, tables_));
  const auto bc_ranges = AsSpan(bc.ranges());
  const auto bc_indexes = AsSpan(bc.indexes());
  const auto bc_clocks = AsSpan(bc.clocks());
  const auto bc_examples = AsSpan(bc.examples());
  const auto bc_ann_workers = AsSpan(bc.ann_workers());
  const auto bc_ann_segments = AsSpan(bc.ann_segments());
  const auto bc_ann_examples = AsSpan(bc.ann_examples());
  const auto bc_ann_settled = AsSpan(bc.ann_settled());
  const auto bc_sum_tables = AsSpan(bc.sum_tables());
  const auto bc_sum_num_keys = AsSpan(bc.sum_num_keys());
  std::vector<BspAnnouncement> announces;
  for (int c = 0; c < bc.ranges_size(); ++c) {
    const int r = bc_ranges[c];  // checked by the caller
    PS_ASSIGN_OR_RETURN(const bool next,
                        IsNextEntryLocked(from, r, bc_indexes[c]));
    if (!next) continue;  // a resend
    const BspClockAt& a = at[c];
    const BspClockAt& b = at[c + 1];
    size_t key_byte = a.key_byte;
    for (int i = a.sum; i < b.sum; ++i) {
      const size_t len =
          static_cast<size_t>(bc_sum_num_keys[i]) * sizeof(uint64_t);
      PS_RETURN_IF_ERROR(CheckRangeKeys(
          absl::string_view(bc.sum_keys()).substr(key_byte, len), *routing_,
          r));
      key_byte += len;
    }
    announces.clear();
    for (int i = a.ann; i < b.ann; ++i) {
      announces.push_back(BspAnnouncement{bc_ann_workers[i],
                                          bc_ann_segments[i],
                                          bc_ann_examples[i],
                                          bc_ann_settled[i]});
    }
    RangeActions ra;
    absl::Status s = ranges_[r].ApplyReplicated(
        bc_clocks[c],
        AsSpan(bc.seg_workers()).subspan(a.seg, b.seg - a.seg),
        AsSpan(bc.seg_seqs()).subspan(a.seg, b.seg - a.seg),
        announces, &ra);
    if (s.ok() &&
        (ra.apply.size() != 1 || ra.apply[0].examples != bc_examples[c])) {
      s = absl::InternalError(absl::StrCat(
          "clock ", bc_clocks[c], " has ",
          ra.apply.empty() ? 0 : ra.apply[0].examples, " examples here, ",
          bc_examples[c], " on the primary"));
    }
    if (!s.ok()) {
      // The primary applied this clock in the same state: the replica has
      // diverged. The primary answers with a fresh copy.
      return absl::InternalError(absl::StrCat("range ", r, " entry ",
                                              bc_indexes[c],
                                              " refused by the replica: ",
                                              s.message()));
    }
    // The primary's sums replace the segments buffered here (placeholders,
    // or a copy's): the same floats the primary applied.
    ra.apply.clear();
    key_byte = a.key_byte;
    size_t val_byte = a.val_byte;
    for (int i = a.sum; i < b.sum; ++i) {
      Table* t = tables_[bc_sum_tables[i]].get();
      const size_t keys = static_cast<size_t>(bc_sum_num_keys[i]);
      t->Push(r,
              absl::MakeConstSpan(reinterpret_cast<const uint64_t*>(
                                      bc.sum_keys().data() + key_byte),
                                  keys),
              reinterpret_cast<const float*>(bc.sum_vals().data() + val_byte),
              t->optimizer().GradientScale(bc_examples[c]));
      key_byte += keys * sizeof(uint64_t);
      val_byte += keys * static_cast<size_t>(t->dim()) * sizeof(float);
    }
    AddActions(actions, r, &ra);
    logs_[r].index = bc_indexes[c];
  }
  return absl::OkStatus();
}

namespace {

// A copy's or delta's rows' entries: their own `entries`, or the bytes
// they name of the request's values (a batch through shared memory:
// `vals` lies in the primary's arena, and each float is read once).
absl::StatusOr<absl::Span<const char>> RowsEntries(
    const proto::RangeCopy::Rows& rows, absl::Span<const char> vals) {
  if (rows.vals_offset() == 0 && rows.vals_bytes() == 0) {
    return absl::Span<const char>(rows.entries());
  }
  if (!rows.entries().empty() || rows.vals_offset() % sizeof(float) != 0 ||
      rows.vals_offset() > vals.size() ||
      rows.vals_bytes() > vals.size() - rows.vals_offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows' entries at ", rows.vals_offset(), " + ", rows.vals_bytes(),
        " outside the request's ", vals.size(), " bytes of values"));
  }
  return vals.subspan(static_cast<size_t>(rows.vals_offset()),
                      static_cast<size_t>(rows.vals_bytes()));
}

// Checked by CheckRows first.
const float* EntriesOf(const proto::RangeCopy::Rows& rows,
                       absl::Span<const char> vals) {
  return reinterpret_cast<const float*>(RowsEntries(rows, vals)->data());
}

// A copy's or delta's rows: tables this server has, keys ascending inside
// `range`, entries matching (in the rows or in `vals`).
absl::Status CheckRows(
    const google::protobuf::RepeatedPtrField<proto::RangeCopy::Rows>& tables,
    const std::vector<std::unique_ptr<Table>>& have, const Routing& routing,
    int range, absl::string_view what, bool ascending,
    absl::Span<const char> vals) {
  for (const proto::RangeCopy::Rows& rows : tables) {
    if (rows.table() < 0 || rows.table() >= static_cast<int>(have.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of range ", range, ": unknown table ", rows.table()));
    }
    PS_RETURN_IF_ERROR(CheckRangeKeys(rows.keys(), routing, range, ascending));
    size_t n = rows.keys().size() / sizeof(uint64_t);
    if (rows.by_slot()) {
      // A delta's rows by slot (a copy's go by key, ascending): a list of
      // slots or a bitmap of them, not both.
      if (ascending || rows.slots().size() % sizeof(uint32_t) != 0 ||
          rows.slot_bits().size() % sizeof(uint64_t) != 0 ||
          (!rows.slots().empty() && !rows.slot_bits().empty())) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " of range ", range, ": malformed rows by slot"));
      }
      n += rows.slots().size() / sizeof(uint32_t);
      for (uint64_t word : ViewAs<uint64_t>(rows.slot_bits())) {
        n += static_cast<size_t>(__builtin_popcountll(word));
      }
    } else if (!rows.slots().empty() || !rows.slot_bits().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of range ", range, ": slots in rows by key"));
    }
    absl::StatusOr<absl::Span<const char>> entries = RowsEntries(rows, vals);
    if (!entries.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of range ", range, ": ", entries.status().message()));
    }
    if (entries->size() !=
        n * have[rows.table()]->entry_floats() * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of range ", range, ": entries do not match keys"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RangeState> ServerNode::PeerStateLocked(
    const proto::RangeStateSnapshot& snap, int r, int from,
    absl::string_view what) const {
  RangeLimits rl;
  rl.max_clock_ahead = limits_.max_clock_ahead;
  rl.max_unsettled_seqs = limits_.max_unsettled_seqs;
  absl::StatusOr<RangeState> state = RangeState::FromSnapshot(snap, rl);
  if (!state.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " of range ", r, " from S[", from, "]: ",
        state.status().message()));
  }
  // Fewer workers than this view: workers joined since the state was taken
  // (issue 9); what follows adds them. More: a worker joined that this
  // server's view does not have yet.
  if (state->num_workers() > static_cast<int>(workers_.size())) {
    return ErrorWithReason(
        absl::StatusCode::kUnavailable, proto::REASON_VIEW_BEHIND,
        absl::StrCat(what, " of range ", r, " has ", state->num_workers(),
                     " workers, this view ", workers_.size()));
  }
  if (state->bsp() != (mode_ == proto::MODE_BSP)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of range ", r, ": another job's state"));
  }
  return state;
}

absl::Status ServerNode::ApplyDeltaLocked(int from,
                                          const proto::ReplicaEntry& e,
                                          absl::Span<const char> vals,
                                          RangeActionList* actions) {
  const int r = e.range();
  RangeLog& lg = logs_[r];
  if (lg.awaiting_copy) {
    return absl::UnavailableError(
        absl::StrCat("range ", r, " awaits its copy from S[", from, "]"));
  }
  if (e.index() <= lg.index) return absl::OkStatus();  // a resend
  const proto::RangeDelta& d = e.delta();
  if (d.base() > lg.index) {
    // Rows changed between this replica's index and the delta's base are
    // in no delta it got: the primary answers with a fresh copy.
    return absl::DataLossError(absl::StrCat("range ", r, ": delta from entry ",
                                            d.base(), " after ", lg.index));
  }
  PS_ASSIGN_OR_RETURN(RangeState state,
                      PeerStateLocked(d.state(), r, from, "delta"));
  // A delta's keys come in push order, each once; a repeat would only be
  // written twice with the same entry.
  PS_RETURN_IF_ERROR(CheckRows(d.tables(), tables_, *routing_, r, "delta",
                               /*ascending=*/false, vals));
  for (const proto::RangeCopy::Rows& rows : d.tables()) {
    if (!rows.by_slot()) continue;
    // Before anything changes: rows by slot that do not fit this replica's
    // layout leave it as it was, and the primary sends a copy.
    PS_RETURN_IF_ERROR(tables_[rows.table()]->CheckDelta(
        r, ViewAs<uint32_t>(rows.slots()), ViewAs<uint64_t>(rows.slot_bits()),
        rows.base_slots(),
        rows.base_digest()));
  }
  RangeState& range = ranges_[r];
  absl::InlinedVector<int64_t, 8> before(range.num_workers());
  for (int w = 0; w < range.num_workers(); ++w) before[w] = range.Entry(w);
  range = std::move(state);
  RangeActions none;  // a follower applies nothing by itself
  range.SetFollower(routing_->OwnerOfRange(r) != id_, &none);
  for (const proto::RangeCopy::Rows& rows : d.tables()) {
    const float* entries = EntriesOf(rows, vals);
    if (rows.by_slot()) {
      tables_[rows.table()]->ImportDelta(r, ViewAs<uint32_t>(rows.slots()),
                                         ViewAs<uint64_t>(rows.slot_bits()),
                                         ViewAs<uint64_t>(rows.keys()),
                                         entries);
    } else {
      tables_[rows.table()]->ImportRange(r, ViewAs<uint64_t>(rows.keys()),
                                         entries);
    }
  }
  lg.index = e.index();
  RangeActions a;
  for (int w = 0; w < range.num_workers(); ++w) {
    const int64_t was = w < static_cast<int>(before.size()) ? before[w] : 0;
    if (range.Entry(w) > was) a.advanced.emplace_back(w, range.Entry(w));
  }
  AddActions(actions, r, &a);
  return absl::OkStatus();
}

absl::Status ServerNode::ApplyEntryLocked(int from,
                                          const proto::ReplicaEntry& e,
                                          absl::Span<const char> vals,
                                          RangeActionList* actions) {
  if (e.has_push()) return ApplyPushLocked(from, e.push(), actions);
  if (e.has_announces()) return ApplyAnnouncesLocked(from, e.announces(), actions);
  if (e.has_bsp()) return ApplyBspClocksLocked(from, e.bsp(), actions);
  if (e.has_delta()) return ApplyDeltaLocked(from, e, vals, actions);
  const int r = e.range();
  RangeLog& lg = logs_[r];
  RangeState& range = ranges_[r];
  if (e.has_copy()) {
    if (!lg.awaiting_copy && e.index() <= lg.index) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(RangeState state,
                        PeerStateLocked(e.copy().state(), r, from, "copy"));
    PS_RETURN_IF_ERROR(CheckRows(e.copy().tables(), tables_, *routing_, r,
                                 "copy", /*ascending=*/true, vals));
    range = std::move(state);
    RangeActions none;  // a follower applies nothing by itself
    range.SetFollower(routing_->OwnerOfRange(r) != id_, &none);
    for (const auto& t : tables_) t->ClearRange(r);
    for (const proto::RangeCopy::Rows& rows : e.copy().tables()) {
      tables_[rows.table()]->ImportRange(r, ViewAs<uint64_t>(rows.keys()),
                                         EntriesOf(rows, vals));
    }
    lg.index = e.index();
    lg.awaiting_copy = false;
    lg.complete = true;
    RangeActions a;
    for (int w = 0; w < range.num_workers(); ++w) {
      if (range.Entry(w) > 0) a.advanced.emplace_back(w, range.Entry(w));
    }
    AddActions(actions, r, &a);
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(const bool next, IsNextEntryLocked(from, r, e.index()));
  if (!next) return absl::OkStatus();  // a resend
  RangeActions a;
  absl::Status s;
  switch (e.op_case()) {
    case proto::ReplicaEntry::kAnnounce: {
      const proto::ReplicaAnnounce& an = e.announce();
      s = range.Announce(an.worker(), an.clock(), an.segments(), an.examples(),
                         an.settled_seq(), &a);
      break;
    }
    case proto::ReplicaEntry::kFinish:
      s = range.Finish(e.finish().worker(), e.finish().final_clock(), &a);
      break;
    case proto::ReplicaEntry::kDeadWorker:
      s = range.SetDead(e.dead_worker(), &a);
      break;
    case proto::ReplicaEntry::kJoin:
      if (e.join().clock() < 0) {
        s = absl::InvalidArgumentError("join entry without a clock");
      } else {
        s = range.Join(e.join().worker(), e.join().clock(), &a);
      }
      break;
    default:
      return absl::InvalidArgumentError("replica entry without an operation");
  }
  if (!s.ok()) {
    // The primary accepted this input in the same state: the replica has
    // diverged. The primary answers with a fresh copy.
    return absl::InternalError(absl::StrCat("range ", r, " entry ", e.index(),
                                            " refused by the replica: ",
                                            s.message()));
  }
  ApplyBsp(r, &a);
  AddActions(actions, r, &a);
  lg.index = e.index();
  return absl::OkStatus();
}

}  // namespace ps
