// Differential fuzz target for replication by slot (issue 9): a primary
// table and a backup table of the same spec, driven by the input as
// ServerNode drives them (server/server_node_replication.cc). The primary
// takes pushes (by keys, by cached slots, recorded in its delta journal or
// not); the backup is kept in step by deltas of rows by slot (TakeJournal ->
// CheckDelta -> ImportDelta), by keys once the journal has stopped
// (ExportKeys -> ImportRange), or by a whole copy (ExportRange -> ClearRange
// -> ImportRange), which also follows a delta the backup refused.
//
// Byte 0 picks the tables: optimizer (sgd, adagrad, ftrl, adam), dim (1, 3,
// 64 or 200: rows wide enough that a range's keys fill several of the
// table's chunks, so that runs of slots cross chunks), and whether the
// lower half of the feature ids use the dense-id layout. Then one operation per group of
// bytes (op byte % 16; bits 4-7 pick the range), until the input ends.
//
// Checks, besides "no crash, no sanitizer report":
//   * while a range goes by slot, its journal is on and every delta is
//     taken, the backup accepts it, and afterwards holds the primary's
//     layout (slots and digest);
//   * after every delta, copy or key-wise update, the backup's range is the
//     primary's: the same keys, and every entry (value and optimizer state)
//     bit for bit;
//   * a delta altered as a broken or hostile primary might send it (a base
//     or digest the backup does not have, a row past its base) is refused
//     with DATA_LOSS, and the backup's range is left as it was;
//   * a push by slots taken before the range was cleared does nothing and
//     says so.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/hash.h"
#include "fuzz/fuzz_util.h"
#include "server/table.h"

namespace ps::fuzz {
namespace {

constexpr int kRanges = 2;
// The key universe: FeatureKey(0 .. features - 1), 1024 features for rows
// of 1 or 3 floats, 256 for wider ones (whose ranges still fill several
// chunks); the dense-id layout, when on, takes the lower half of the ids.
uint64_t Features(int dim) { return dim <= 3 ? 1024 : 256; }

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ == end_; }
  uint8_t Byte() { return p_ == end_ ? 0 : *p_++; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// How the backup of one range is kept in step, as ServerNode's RangeLog.
struct RangeSync {
  bool by_slot = true;          // from the job's start, both empty
  bool journal_on = true;       // until a push not recorded stops it
  uint32_t synced_slots = 0;    // the primary's slots at the last delta
  uint64_t synced_digest = 0;   // and its layout digest
  uint64_t synced_generation = 0;
  std::vector<uint64_t> pushed;  // keys pushed since (by keys only)
};

// A key list whose slots a pull or push handed out (key caching).
struct Cached {
  int range = 0;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> slots;
  uint64_t generation = 0;
};

// A range's keys and entries, as ExportRange gives them.
struct RangeContents {
  std::vector<uint64_t> keys;
  std::vector<float> entries;
};

RangeContents Contents(const Table& table, int r) {
  RangeContents c;
  table.ExportRange(r, &c.keys, &c.entries);
  return c;
}

// The same keys, and every entry bit for bit.
void CheckSame(const RangeContents& a, const RangeContents& b) {
  PS_FUZZ_CHECK(a.keys == b.keys);
  PS_FUZZ_CHECK(a.entries.size() == b.entries.size());
  PS_FUZZ_CHECK(a.entries.empty() ||
                std::memcmp(a.entries.data(), b.entries.data(),
                            a.entries.size() * sizeof(float)) == 0);
}

void ExpectSameRange(const Table& primary, const Table& backup, int r) {
  CheckSame(Contents(primary, r), Contents(backup, r));
}

// A whole copy of range r (TakeCopies, or a refused delta's repair); the
// range goes by keys from then on, as the server's does.
void Copy(Table& primary, Table& backup, int r, RangeSync& s) {
  const RangeContents c = Contents(primary, r);
  backup.ClearRange(r);
  backup.ImportRange(r, c.keys, c.entries.data());
  primary.StopJournal(r);
  s.by_slot = false;
  s.pushed.clear();
  ExpectSameRange(primary, backup, r);
}

// A push's gradients: one byte a key, spread over its dim elements (so
// that wide rows do not eat the input), in [-8, 8).
void Gradients(Reader& in, size_t keys, int dim, std::vector<float>* grads) {
  grads->resize(keys * static_cast<size_t>(dim));
  float* g = grads->data();
  for (size_t i = 0; i < keys; ++i) {
    const uint8_t b = in.Byte();
    for (int j = 0; j < dim; ++j) {
      *g++ = static_cast<int8_t>(b ^ static_cast<uint8_t>(j * 37)) / 16.0f;
    }
  }
}

absl::Status CheckAndImport(Table& backup, int r, const Table::DeltaRows& d,
                            uint64_t base_digest) {
  const auto* slots = reinterpret_cast<const uint32_t*>(d.slots.data());
  const size_t n = d.slots.size() / sizeof(uint32_t);
  const size_t words = d.slot_bits.size() / sizeof(uint64_t);
  std::vector<uint64_t> bits(words);
  if (words > 0) std::memcpy(bits.data(), d.slot_bits.data(), words * 8);
  absl::Status st = backup.CheckDelta(r, absl::MakeConstSpan(slots, n), bits,
                                      d.base_slots, base_digest);
  if (!st.ok()) return st;
  const size_t m = d.new_keys.size() / sizeof(uint64_t);
  std::vector<uint64_t> new_keys(m);
  if (m > 0) std::memcpy(new_keys.data(), d.new_keys.data(), m * 8);
  backup.ImportDelta(r, absl::MakeConstSpan(slots, n), bits, new_keys,
                     reinterpret_cast<const float*>(d.entries.data()));
  return absl::OkStatus();
}

// Takes range r's delta since the last one into *d. False, after a whole
// copy instead, when the journal had stopped (only a push not recorded
// stops it, and the harness tracks those).
bool TakeDelta(Table& primary, Table& backup, int r, RangeSync& s,
               Table::DeltaRows* d) {
  if (!primary.TakeJournal(r, s.synced_generation, s.synced_slots, d)) {
    PS_FUZZ_CHECK(!s.journal_on);
    Copy(primary, backup, r, s);
    return false;
  }
  PS_FUZZ_CHECK(s.journal_on);
  return true;
}

// Ships what the primary's range r did since the last time.
void Ship(Table& primary, Table& backup, int r, RangeSync& s) {
  if (!s.by_slot) {
    std::vector<uint64_t> keys;
    std::vector<float> entries;
    primary.ExportKeys(r, s.pushed, nullptr, 0, &keys, &entries);
    backup.ImportRange(r, keys, entries.data());
    s.pushed.clear();
    ExpectSameRange(primary, backup, r);
    return;
  }
  Table::DeltaRows d;
  if (!TakeDelta(primary, backup, r, s, &d)) return;
  PS_FUZZ_CHECK(d.base_slots == s.synced_slots);
  PS_FUZZ_CHECK(d.entries.size() == d.rows() * primary.entry_floats() * 4);
  absl::Status st = CheckAndImport(backup, r, d, s.synced_digest);
  PS_FUZZ_CHECK(st.ok());
  s.synced_slots = d.num_slots;
  s.synced_digest = d.digest;
  const Table::PartitionLayout pl = primary.Layout(r), bl = backup.Layout(r);
  PS_FUZZ_CHECK(pl.slots == d.num_slots && pl.digest == d.digest);
  PS_FUZZ_CHECK(bl.slots == pl.slots && bl.digest == pl.digest);
  ExpectSameRange(primary, backup, r);
}

}  // namespace

int Replica(const uint8_t* data, size_t size) {
  Reader in(data, size);
  const uint8_t shape = in.Byte();
  static constexpr const char* kOptimizers[] = {"sgd", "adagrad", "ftrl",
                                                "adam"};
  static constexpr int kDims[] = {1, 3, 64, 200};
  TableSpec spec;
  spec.id = 0;
  spec.optimizer.name = kOptimizers[shape % 4];
  spec.dim = kDims[(shape >> 2) % 4];
  const uint64_t features = Features(spec.dim);
  spec.dense_ids = (shape & 0x10) != 0 ? features / 2 : 0;
  absl::StatusOr<std::unique_ptr<Table>> p = Table::Create(spec, kRanges);
  absl::StatusOr<std::unique_ptr<Table>> b = Table::Create(spec, kRanges);
  PS_FUZZ_CHECK(p.ok() && b.ok());
  Table& primary = **p;
  Table& backup = **b;
  RangeSync sync[kRanges];
  for (int r = 0; r < kRanges; ++r) {
    sync[r].synced_generation = primary.Layout(r).generation;
    primary.StartJournal(r);
  }
  Cached cached;
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  for (int ops = 0; !in.done() && ops < 500; ++ops) {
    const uint8_t op = in.Byte();
    const int r = (op >> 4) % kRanges;
    RangeSync& s = sync[r];
    // Mostly pushes and deltas; what ends a range's going by slot (a push
    // not recorded, a copy, an altered delta) an eighth of the time.
    switch (op % 16) {
      case 0:
      case 1:
      case 2:
      case 3:
      case 4:
      case 5:
      case 6: {  // a push by keys (op 6: not recorded in the journal)
        const size_t n = 1 + in.Byte() % 64;
        keys.clear();
        // Features of range r: f % kRanges == r (a key keeps its range).
        const uint8_t start = in.Byte(), step = 1 + in.Byte() % 8;
        for (size_t i = 0; i < n; ++i) {
          const uint64_t f =
              ((start + i * step) % (features / kRanges)) * kRanges + r;
          keys.push_back(FeatureKey(f));
        }
        if (in.Byte() % 2 == 0) std::sort(keys.begin(), keys.end());
        Gradients(in, n, spec.dim, &grads);
        cached.range = r;
        cached.keys = keys;
        cached.slots.assign(n, Table::kNoSlot);
        bool journaled = false;
        const bool record = s.by_slot && op % 16 != 6;
        primary.Push(r, keys, grads.data(), 1.0f, cached.slots.data(),
                     &cached.generation, KeyOrder::kAny,
                     record ? &journaled : nullptr);
        if (record) PS_FUZZ_CHECK(journaled == s.journal_on);
        if (s.by_slot && !record) s.journal_on = false;
        s.pushed.insert(s.pushed.end(), keys.begin(), keys.end());
        break;
      }
      case 7:
      case 8:
      case 9: {  // a push by the last list's slots (key caching)
        if (cached.keys.empty()) break;
        RangeSync& cs = sync[cached.range];
        Gradients(in, cached.keys.size(), spec.dim, &grads);
        bool journaled = false;
        const bool done = primary.PushSlots(
            cached.range, cached.generation, cached.keys, cached.slots.data(),
            grads.data(), 1.0f, KeyOrder::kAny, nullptr,
            cs.by_slot ? &journaled : nullptr);
        // The primary's ranges are never cleared here: its slots hold.
        PS_FUZZ_CHECK(done);
        if (cs.by_slot) PS_FUZZ_CHECK(journaled == cs.journal_on);
        cs.pushed.insert(cs.pushed.end(), cached.keys.begin(),
                         cached.keys.end());
        break;
      }
      case 10:
      case 11:
      case 12:
      case 13:  // a delta
        Ship(primary, backup, r, s);
        break;
      case 14:  // a copy
        Copy(primary, backup, r, s);
        break;
      case 15: {  // a delta altered in flight, then the repair
        if (!s.by_slot) break;
        Table::DeltaRows d;
        if (!TakeDelta(primary, backup, r, s, &d)) break;
        const RangeContents before = Contents(backup, r);
        uint64_t digest = s.synced_digest;
        const uint8_t how = in.Byte();
        switch (how % 3) {
          case 0:
            d.base_slots += 1 + how / 3;
            break;
          case 1:
            digest ^= uint64_t{1} << (how % 64);
            break;
          case 2: {
            const size_t n = d.slots.size() / sizeof(uint32_t);
            if (n == 0) {
              d.base_slots = d.base_slots == 0 ? 1 : d.base_slots - 1;
              break;
            }
            const uint32_t past = s.synced_slots + how / 3;
            std::memcpy(d.slots.data() + (how % n) * sizeof(uint32_t), &past,
                        sizeof(past));
            break;
          }
        }
        const absl::Status st = CheckAndImport(backup, r, d, digest);
        PS_FUZZ_CHECK(st.code() == absl::StatusCode::kDataLoss);
        CheckSame(Contents(backup, r), before);
        Copy(primary, backup, r, s);  // the primary sends a copy instead
        break;
      }
    }
  }
  for (int r = 0; r < kRanges; ++r) Ship(primary, backup, r, sync[r]);
  // Stale slots: a range cleared for a copy has a new generation, and the
  // slots handed out before it are refused.
  if (!cached.keys.empty()) {
    std::vector<float> out(cached.keys.size() * static_cast<size_t>(spec.dim));
    const uint64_t old = primary.Layout(cached.range).generation;
    primary.ClearRange(cached.range);
    PS_FUZZ_CHECK(primary.Layout(cached.range).generation != old);
    grads.assign(out.size(), 1.0f);
    PS_FUZZ_CHECK(!primary.PushSlots(cached.range, old, cached.keys,
                                     cached.slots.data(), grads.data(), 1.0f));
    PS_FUZZ_CHECK(!primary.PullSlots(cached.range, old, cached.keys,
                                     cached.slots.data(), out.data()));
  }
  return 0;
}

}  // namespace ps::fuzz
