// Server-side parameter storage: a table maps 64-bit keys to fixed-length
// float vectors plus their optimizer state, and applies pushed gradients with
// the table's update rule (server/optimizer.h).
//
// Storage is split into `num_ranges` partitions, one per key range of the
// routing table (common/routing.h), each with its own lock, so pushes to
// different ranges proceed in parallel. A partition keeps a hash map from key
// to slot and the slots' floats in fixed-size chunks (value then state,
// contiguous per key), so a push or pull allocates nothing per key except
// when it creates keys. With TableSpec::dense_ids, keys of small feature ids
// find their slot through a table-wide array indexed by the id instead of
// the map (the dense-id layout).
//
// Also here: GradAccumulator, which sums the pushes of one BSP clock so that
// they can be applied as one averaged gradient in a deterministic order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/parallel.h"
#include "server/key_slot_map.h"
#include "server/optimizer.h"

namespace ps {

struct TableSpec {
  int id = 0;
  int dim = 1;  // floats per key, >= 1
  OptimizerConfig optimizer;
  // New values are drawn from U(-init_scale, init_scale), deterministically
  // from (table id, key, element index); 0 means zeros. Must be 0 with ftrl,
  // whose weight is a function of its state (which starts at 0).
  float init_scale = 0;
  // The dense-id layout (issue 10): a key whose feature id (FeatureOf(key),
  // common/hash.h: the inverse of FeatureKey(id), namespace 0) is below
  // this bound finds its storage slot in an array indexed by the id, with
  // no hash lookup; every other key goes through the range's hash map. The
  // contents, files and results are the same either way (only where a
  // key's entry is found differs). Costs 8 bytes of index per id: address
  // space mapped at creation, memory only for the pages of ids used.
  // 0: hash maps only.
  // At most kMaxDenseIds.
  uint64_t dense_ids = 0;
};

// The contents of a binary table file (see Table::SaveBinary).
struct TableFile {
  int table_id = 0;
  int dim = 0;
  std::vector<std::pair<uint64_t, std::vector<float>>> records;  // by key
};

// What a pushing caller knows of its keys. kAscending: strictly ascending,
// so none repeats, as ServerNode has checked of every request's keys and
// cached lists (CheckKeys); a dim-1 FTRL push then updates keys side by side
// without looking for repeats first (a pass over keys a key-cached push
// reads for nothing else: 6 % of its samples). kAny: they are looked at.
enum class KeyOrder { kAny, kAscending };

// Calls fn(first, end) for each maximal run [first, end) of set bits of
// the bitmap words[0, n) (bit b % 64 of word b / 64), ascending: a run
// through whole words costs a test a word.
template <typename Fn>
void ForEachBitRun(const uint64_t* words, size_t n, Fn&& fn) {
  bool in_run = false;
  uint64_t start = 0;
  for (size_t w = 0; w < n; ++w) {
    const uint64_t b = words[w];
    if (in_run ? b == ~uint64_t{0} : b == 0) continue;
    const uint64_t base = uint64_t{w} * 64;
    unsigned at = 0;  // the word's bits below `at` are done
    while (at < 64) {
      if (in_run) {
        const uint64_t clear = ~b >> at;  // the run ends at its lowest bit
        if (clear == 0) break;            // on into the next word
        at += static_cast<unsigned>(__builtin_ctzll(clear));
        fn(start, base + at);
        in_run = false;
      } else {
        const uint64_t set = b >> at;
        if (set == 0) break;
        at += static_cast<unsigned>(__builtin_ctzll(set));
        start = base + at;
        in_run = true;
      }
    }
  }
  if (in_run) fn(start, uint64_t{n} * 64);
}

// Thread-safe: every method may be called concurrently from any thread.
// Calls on different ranges do not contend; pulls of one range share its
// lock, pushes to one range are serialised.
class Table {
 public:
  // INVALID_ARGUMENT when dim < 1, num_ranges < 1, init_scale is negative
  // or not finite, init_scale != 0 with ftrl, or the optimizer config is
  // invalid (the message names the field, see Optimizer::Create).
  // RESOURCE_EXHAUSTED when the dense-id index cannot be mapped;
  // INVALID_ARGUMENT for dense_ids above kMaxDenseIds.
  static absl::StatusOr<std::unique_ptr<Table>> Create(const TableSpec& spec,
                                                       int num_ranges);
  // The config's bound (training.dense_features), 2^32 ids: a 32 GiB index
  // (address space; touched where ids are used).
  static constexpr uint64_t kMaxDenseIds =
      static_cast<uint64_t>(kMaxDenseFeatures);

  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table();

  int id() const { return spec_.id; }
  const TableSpec& spec() const { return spec_; }
  int dim() const { return spec_.dim; }
  int num_ranges() const { return num_ranges_; }
  const Optimizer& optimizer() const { return *optimizer_; }

  // Writes the values of `keys` to out[i*dim ... (i+1)*dim). A key never
  // pushed reads as its initial value and is not inserted.
  // Preconditions: 0 <= range < num_ranges() (checked: aborts, since a bad
  // index is the caller's routing bug, not remote input; validate indices
  // taken from a request against num_ranges() first); a given key is always
  // used with the same range (not checked: otherwise it is stored twice).
  // Keys may come in any order (routing produces them ascending); out has
  // keys.size()*dim floats.
  // Key caching (server/key_cache.h): with `slots`, also writes each key's
  // storage slot to slots[i] (kNoSlot for a key not stored) and the range's
  // generation to *generation, both read under the same lock.
  void Pull(int range, absl::Span<const uint64_t> keys, float* out,
            uint32_t* slots = nullptr, uint64_t* generation = nullptr) const;

  // Applies the gradient scale * grads[i*dim ... (i+1)*dim) to each keys[i]
  // with the optimizer, creating missing keys (initial value, then the
  // update). A key repeated within one call is updated once per occurrence,
  // in order. Preconditions as for Pull.
  // With `slots`, also writes each key's slot (all set: the push stores
  // every key) and the range's generation, as Pull does.
  // `order`: what the caller knows of the keys (KeyOrder).
  // `journal`: marks the rows in the range's delta journal if it is on
  // (StartJournal); *journal is set to whether it was (the push is then
  // recorded). Null: a journal that is on stops (which the next
  // TakeJournal reports).
  // `rows`: when given, each row of at least kParallelRowFloats floats (a
  // dense table's key) is updated in parts of its columns on this runner's
  // threads: every rule updates each element on its own, so the bits are
  // those of one pass. The caller must not itself be a part of a Run on it.
  // `non_finite`: when given, the push is refused whole if any gradient is
  // NaN or infinite: *non_finite is set to true and every row is left as
  // it was (keys the push made stay, at their initial values, and are
  // journaled); else it is set to false. Where ChecksFiniteWhileApplying(),
  // the gradients are checked by the update's own pass (each row's values
  // before it kept aside, and put back on a refusal); elsewhere by a pass
  // of their own before any row changes.
  void Push(int range, absl::Span<const uint64_t> keys, const float* grads,
            float scale, uint32_t* slots = nullptr,
            uint64_t* generation = nullptr, KeyOrder order = KeyOrder::kAny,
            bool* journal = nullptr, ParallelRunner* rows = nullptr,
            bool* non_finite = nullptr);
  // Whether Push and PushSlots check a push's gradients for `non_finite`
  // within their update's pass (SGD on rows of at least kLongRowFloats, on
  // a CPU with AVX2 or AVX-512): a caller that would otherwise check them first
  // (ServerNode) then reads a dense push's values once instead of twice.
  bool ChecksFiniteWhileApplying() const;
  static constexpr size_t kLongRowFloats = 256;
  // A row's length from which Push and PushSlots split its update over
  // `rows` (512 KiB of gradient, as ServerNode checks a push's values in
  // parts from that size).
  static constexpr size_t kParallelRowFloats = size_t{1} << 17;

  // ---- Key caching: by slots, without hash lookups ----
  static constexpr uint32_t kNoSlot = 0xffffffffu;
  // Pull / Push by the slots a Pull or Push wrote for the same keys at
  // `generation`. They return false, having done nothing, when the range's
  // slots have been invalidated since (ClearRange: a new copy of the range
  // arrived); the caller then goes by keys. A kNoSlot entry (a key the
  // Pull did not find) goes by its key: PullSlots reads it as Pull does
  // (stored since, or its initial value), PushSlots creates it as Push does
  // (or finds it, stored since), so a push after the pull of a batch with
  // new keys hashes only those. PushSlots also returns false, having done
  // nothing, for a slot out of the range's bounds. `resolved`, when given,
  // receives every key's slot (the given ones, and those it found or made
  // for kNoSlot entries), for a caller that goes on to name the rows again
  // without looking them up. `journal` as for Push. `complete`: the caller
  // vouches that every slot is one this partition handed out at
  // `generation` (none kNoSlot): a list the server resolved itself and found
  // every key of (KeyList::complete), which the bounds check then skips
  // (slots only grow within a generation). `rows` as for Push.
  // `consecutive`, with `complete`: the caller also vouches that slots[k] is
  // slots[0] + k for every k (a list whose keys one push made in order:
  // KeyList::consecutive), so that the update reads no slot but the first
  // (a key-cached push read 4 bytes of slot a key for nothing else). A list
  // that would run past the partition's slots is taken slot by slot.
  // `non_finite` as for Push.
  bool PullSlots(int range, uint64_t generation,
                 absl::Span<const uint64_t> keys, const uint32_t* slots,
                 float* out) const;
  bool PushSlots(int range, uint64_t generation,
                 absl::Span<const uint64_t> keys, const uint32_t* slots,
                 const float* grads, float scale,
                 KeyOrder order = KeyOrder::kAny, uint32_t* resolved = nullptr,
                 bool* journal = nullptr, bool complete = false,
                 ParallelRunner* rows = nullptr, bool consecutive = false,
                 bool* non_finite = nullptr);

  // Number of keys stored (created by a push).
  size_t size() const;
  // Value elements whose update was left out, over every push so far,
  // because it would have stored a value or optimizer state that is not
  // finite (a gradient too large for single precision; optimizer.h).
  uint64_t non_finite_updates() const;
  // Number of keys with at least one non-zero value element. O(size * dim).
  size_t nonzeros() const;

  // The contents below are gathered one partition at a time: each partition
  // is read atomically, but pushes running concurrently to other ranges may
  // or may not be included. Quiesce pushes for a consistent cut.

  // Writes all keys and values (not optimizer state) in the binary format:
  //   "PSTB", u32 version (1), i32 table id, u32 dim, u64 count,
  //   then count records of (u64 key, dim x f32), ascending by key;
  // all little-endian (host layout). Equal contents give byte-identical
  // files. The file is written beside `path` and renamed over it, so a
  // reader never sees a partial file. Sets *keys_written (may be null).
  // Errors name the path; codes follow errno (NOT_FOUND for a missing
  // directory, PERMISSION_DENIED, RESOURCE_EXHAUSTED for a full disk, ...).
  // `ranges` (issue 9: a server also holds its backups' ranges): only the
  // keys of these ranges; null: every range.
  // `from` (issue 12): write that copy (CopyValues) instead of the live
  // values; `ranges` is then ignored.
  struct ValueCopy {
    std::vector<uint64_t> keys;  // ascending
    std::vector<float> values;   // dim floats per key
  };
  absl::Status SaveBinary(const std::string& path, size_t* keys_written,
                          const std::vector<int>* ranges = nullptr,
                          const ValueCopy* from = nullptr) const;
  // The keys and values of `ranges` (null: all) as they are now (one
  // partition at a time, as the saves), for a later SaveBinary/SaveText.
  ValueCopy CopyValues(const std::vector<int>* ranges) const;

  // Writes the keys with any non-zero value as text lines
  // "key<TAB>v1 v2 ... vdim\n", key in decimal, values in shortest
  // round-trip form, ascending by key. Sets *nonzeros_written (may be null).
  // Errors as for SaveBinary.
  absl::Status SaveText(const std::string& path, size_t* nonzeros_written,
                        const std::vector<int>* ranges = nullptr,
                        const ValueCopy* from = nullptr) const;

  // Reads a file written by SaveBinary. NOT_FOUND (etc., from errno) when
  // it cannot be opened, INVALID_ARGUMENT when it is not a PSTB file,
  // UNIMPLEMENTED for another format version, DATA_LOSS when it is
  // truncated or inconsistent. Errors name the path.
  static absl::StatusOr<TableFile> ReadBinaryFile(const std::string& path);
  // ReadBinaryFile without the header fields.
  static absl::StatusOr<std::vector<std::pair<uint64_t, std::vector<float>>>>
  LoadBinary(const std::string& path);

  // Checkpoints (server/checkpoint.h): whole entries, value AND optimizer
  // state, so that training can continue exactly.
  //
  // Floats per key in an entry: dim value floats, then dim * state_floats
  // optimizer state floats (Optimizer's layout).
  size_t entry_floats() const { return stride_; }
  // Replaces *keys / *entries with every key stored in `range` and its
  // entry (entry_floats() floats each), keys ascending. The range is read
  // under its partition lock: the copy is one state the range was in
  // (per-range consistent), whatever pushes run meanwhile. Preconditions as
  // for Pull.
  void ExportRange(int range, std::vector<uint64_t>* keys,
                   std::vector<float>* entries) const;
  // Appends to *out_keys / *entries each of `keys` stored in `range` and
  // its entry (entry_floats() floats each), once, in the order of their
  // first occurrence in `keys` (which may repeat keys); keys not stored are
  // skipped. Read under the range's partition lock, as ExportRange (a
  // replication delta's rows, issue 9).
  // With `slots` (may be null): slots[i] is where keys[i] is stored, as a
  // Push or Pull at `generation` wrote it (kNoSlot: look it up), used unless
  // the range was cleared since.
  void ExportKeys(int range, absl::Span<const uint64_t> keys,
                  const uint32_t* slots, uint64_t generation,
                  std::vector<uint64_t>* out_keys,
                  std::vector<float>* entries) const;
  // Sets the entry of each keys[i] to entries[i*entry_floats() ...],
  // creating missing keys, under the range's partition lock (keys in any
  // order; a repeated key gets its last entry). A later Pull
  // returns the value, a later Push continues from the state. Preconditions
  // as for Pull.
  void ImportRange(int range, absl::Span<const uint64_t> keys,
                   const float* entries);
  // Removes every key of `range` (a replica about to receive a copy).
  void ClearRange(int range);

  // ---- Replication by slot (issue 9/10; proto RangeCopy.Rows.by_slot) ----
  // A partition's slots are handed out in order, 0, 1, ..., each to one key
  // until the range is cleared (a new generation). A backup that built its
  // partition of a range from nothing but the primary's deltas, in order,
  // has the primary's layout, and takes rows by slot: no key lookup.
  // The arrays are in the bytes of the strings that proto RangeCopy.Rows
  // carries them in (moved there: no copy).
  // The rows below `base_slots` are named by `slots` or, when that would
  // be the larger (more than one row in 32 of the range's slots marked),
  // by `slot_bits`: bit s % 64 of word s / 64 set for slot s (1 bit a slot
  // of the range instead of 32 a row: a busy range's delta is mostly its
  // rows).
  struct DeltaRows {
    std::string slots;      // uint32: rows below `base_slots`, by slot
    std::string slot_bits;  // uint64 words, when not empty: instead of slots
    size_t bit_rows = 0;    // the bits set in slot_bits
    std::string new_keys;  // uint64: slots base_slots, base_slots + 1, ...
    std::string entries;   // float: slots' rows, then new_keys' rows
    size_t rows() const {
      return slots.size() / sizeof(uint32_t) + bit_rows +
             new_keys.size() / sizeof(uint64_t);
    }
    uint32_t base_slots = 0;
    uint32_t num_slots = 0;  // base_slots + new_keys.size()
    uint64_t digest = 0;     // the partition's layout digest at num_slots
  };
  struct PartitionLayout {
    uint32_t slots = 0;
    uint64_t generation = 0;
    uint64_t digest = 0;  // of its keys in slot order (NextDigest)
  };
  PartitionLayout Layout(int range) const;
  // The layout digest of keys k0, k1, ... in slots 0, 1, ...: starting from
  // 0, digest = NextDigest(digest, k) for each.
  static uint64_t NextDigest(uint64_t digest, uint64_t key) {
    return Mix64(digest ^ Mix64(key + 0x6a09e667f3bcc909ULL));
  }
  // ---- The primary's delta journal (by slot) ----
  // While a range's journal is on, each Push or PushSlots asked to (their
  // `journal`) marks every slot it updates in a bitmap and records every
  // key it creates. A delta then reads the marked rows, in slot order (runs
  // of consecutive slots copied in one go). The journal's size is the
  // partition's (a bit a slot, and the keys made since), however many
  // pushes a delta covers: no bound to stop at, no copy of the range
  // forced by a backup slow to take deltas. (A journal of each update's
  // slot and row, kept before, grew with the pushes and had such a bound;
  // it cost about the same CPU: docs/fault_tolerance.md, "Stop 61".)
  // Starts (or restarts, empty) the journal at the range's current slots.
  void StartJournal(int range);
  // Stops it and frees what it held. ClearRange, ImportRange and
  // ImportDelta stop it too (slots made otherwise than by a push), and so
  // does a push not asked to record.
  void StopJournal(int range);
  // Takes what the journal recorded since `base_slots` as rows by slot:
  // the rows of the marked slots below `base_slots`, ascending, then the
  // slots made since in slot order with their keys; each row as it is now.
  // The journal goes on, empty, at the range's slots now.
  // False, taking nothing, when it is off, the range is not at
  // `generation`, or the journal did not start at `base_slots`.
  bool TakeJournal(int range, uint64_t generation, uint32_t base_slots,
                   DeltaRows* out);
  // Checks that rows by slot fit this partition of `range`: exactly
  // `base_slots` slots with layout digest `base_digest` (the primary's
  // keys at the primary's slots), and each of `slots` (or each slot set in
  // `slot_bits`, DeltaRows) below them.
  // DATA_LOSS naming what differs (the primary then sends a copy).
  absl::Status CheckDelta(int range, absl::Span<const uint32_t> slots,
                          absl::Span<const uint64_t> slot_bits,
                          uint32_t base_slots, uint64_t base_digest) const;
  // Writes rows that CheckDelta accepted: `entries` (the rows of `slots`,
  // or of the slots set in `slot_bits` ascending, then new_keys'), creating
  // new_keys at slots base_slots, base_slots + 1, ...
  void ImportDelta(int range, absl::Span<const uint32_t> slots,
                   absl::Span<const uint64_t> slot_bits,
                   absl::Span<const uint64_t> new_keys, const float* entries);

  // All (key, value) pairs, ascending by key. Allocates per key: for tests
  // and model comparison, not for hot paths.
  // `ranges`: only those (null: all).
  std::vector<std::pair<uint64_t, std::vector<float>>> Snapshot(
      const std::vector<int>* ranges = nullptr) const;

 private:
  // A partition's delta journal (StartJournal).
  struct Journal {
    bool on = false;
    uint32_t base = 0;            // the partition's slots when it (re)started
    std::vector<uint64_t> dirty;  // a bit per slot updated since
    std::string new_keys;  // uint64: the keys of slots base, base + 1, ...
  };

  // One range's storage. Slot s lives in chunks[s >> chunk_shift_] at float
  // offset (s & chunk_mask_) * stride_: dim value floats, then
  // dim * state_floats state floats.
  struct Partition {
    mutable absl::Mutex mu;
    // Keys outside the dense-id layout -> slot.
    KeySlotMap slots ABSL_GUARDED_BY(mu);
    // Keys stored through the dense-id index, in the order they were
    // created (for enumeration and ClearRange).
    std::vector<uint64_t> dense_keys ABSL_GUARDED_BY(mu);
    std::vector<std::unique_ptr<float[]>> chunks ABSL_GUARDED_BY(mu);
    // A digest of the keys in slot order (NextDigest): two partitions with
    // the same slots and digest have the same key at every slot.
    uint64_t layout_digest ABSL_GUARDED_BY(mu) = 0;
    uint32_t num_slots ABSL_GUARDED_BY(mu) = 0;
    // Unique in the process; replaced by ClearRange: slots handed out
    // before are void.
    uint64_t generation ABSL_GUARDED_BY(mu) = 0;
    // Value elements whose update was not applied because it would have
    // stored a value or state that is not finite (optimizer.h).
    uint64_t non_finite_updates ABSL_GUARDED_BY(mu) = 0;
    Journal journal ABSL_GUARDED_BY(mu);
  };

  // Unmaps the dense-id index.
  struct Unmapper {
    Unmapper() : base(nullptr), bytes(0) {}
    Unmapper(void* b, size_t n) : base(b), bytes(n) {}
    void operator()(uint64_t* p) const;
    void* base;  // the mapping (the index starts in it, aligned)
    size_t bytes;
  };
  using DenseIndex = std::unique_ptr<uint64_t[], Unmapper>;

  Table(const TableSpec& spec, int num_ranges,
        std::unique_ptr<Optimizer> optimizer, DenseIndex dense_index);

  Partition& partition(int range) const;
  // The floats of slot `slot` of `p`.
  float* SlotData(const Partition& p, uint32_t slot) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // Allocates a new slot in `p` (storage uninitialised).
  uint32_t NewSlot(Partition& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);

  // ---- Finding a key's slot (the hash map, or the dense-id index) ----
  // The dense-id index entry of `key`, or null when the key is not a dense
  // id. An entry is (range << 32) | (slot + 1), 0 when the id is stored in
  // no range. It is written under the lock of its range's partition, and
  // read through atomic_ref (relaxed): a key used with two ranges (against
  // Pull's precondition) then races on nothing, and a range that finds the
  // entry taken by another stores the key in its hash map (stored twice, as
  // it would be without the index). So a dense key of a range is either in
  // the index (naming the range) or in the range's map, never both.
  uint64_t* DenseEntry(uint64_t key) const;
  // The slot of `key` in partition `range`, or kNoSlot.
  uint32_t FindSlot(int range, const Partition& p, uint64_t key) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // The slot of `key` in partition `range`; a new one (storage
  // uninitialised, *inserted set) when it has none.
  uint32_t FindOrNewSlot(int range, Partition& p, uint64_t key,
                         bool* inserted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Starts loading what FindSlot(range, p, key) will read. Always inlined:
  // GCC 12 judges an out-of-line function that only prefetches pure, and
  // drops its calls (it did, with KeySlotMap's prefetch inlined into it).
  [[gnu::always_inline]] void PrefetchKey(const Partition& p, uint64_t key) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // slots[i] = the slot of keys[i] in `p` (kNoSlot when not stored):
  // known[i] where it is a slot of `p` (known may be null; the caller
  // vouches for its generation), else looked up, loading ahead.
  void LookUpSlots(int range, const Partition& p,
                   absl::Span<const uint64_t> keys, const uint32_t* known,
                   uint32_t* slots) const ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // Calls fn(key, slot) for every key stored in `p` (unordered).
  template <typename Fn>
  void ForEachKey(const Partition& p, Fn&& fn) const
      ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // Number of keys stored in `p`.
  static size_t KeyCount(const Partition& p) ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
    return p.slots.size() + p.dense_keys.size();
  }

  // The slot of `key` in `p`, created (rule's initial state, the key's
  // initial value) when it has none.
  // With `journal`, records a created key in the journal.
  template <typename Rule>
  uint32_t SlotOrNew(int range, Partition& p, const Rule& rule, uint64_t key,
                     bool journal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // out[i] = slots[i], or, where that is kNoSlot, SlotOrNew(keys[i]): the
  // absent keys' slots made in key order (as a Push makes them), each
  // looked up ahead. `out` may be `slots`.
  template <typename Rule>
  void SlotsOrNew(int range, Partition& p, const Rule& rule,
                  absl::Span<const uint64_t> keys, const uint32_t* slots,
                  uint32_t* out, bool journal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Applies scale * grads[i*dim ...) to slots[i] (the slot of keys[i]),
  // i < keys.size(), in order.
  // The end of the run of slots from slots[i] (i < n): slots[i],
  // slots[i] + 1, ... in one chunk, so their rows lie side by side.
  size_t RunEnd(const uint32_t* slots, size_t i, size_t n) const;
  // Slots from `slot` to the end of its chunk, `slot` included.
  size_t SlotsToChunkEnd(uint32_t slot) const {
    return size_t{chunk_mask_ - (slot & chunk_mask_)} + 1;
  }
  // AppendRun: the rows of slots [first, end) of `p` appended to `out`, a
  // copy per chunk they span (the caller reserved the room: no resize that
  // zero-fills the bytes first, as libstdc++'s does). WriteRun: those rows
  // set from `entries`; returns the end of what it read.
  void AppendRun(const Partition& p, uint32_t first, uint32_t end,
                 std::string* out) const ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  const float* WriteRun(Partition& p, uint32_t first, uint32_t end,
                        const float* entries)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Whether a push of n keys records in p's journal: on and asked to
  // (journal not null); stops it where it is on but not asked. Sets
  // *journal (when given) to whether the journal was on. Sizes the bitmap
  // for the slots the push may make.
  bool JournalTakes(Partition& p, size_t n, bool* journal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // The update of keys[i] at slots[i]; `consecutive`: slots[i] is
  // slots[0] + i (PushSlots), and only slots[0] is read.
  template <typename Rule>
  void ApplyAt(Partition& p, const Rule& rule, absl::Span<const uint64_t> keys,
               const uint32_t* slots, const float* grads, float scale,
               KeyOrder order, ParallelRunner* rows, bool consecutive = false,
               bool* non_finite = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Marks slots[0 .. n) in p's journal (JournalTakes sized it).
  void MarkJournal(Partition& p, const uint32_t* slots, size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Writes the initial value of `key` (dim floats) to `w`.
  void InitialValue(uint64_t key, float* w) const;

  // Copies keys and values (dim floats each) of every stored key into
  // *keys / *values, ascending by key. With nonzero_only, skips keys whose
  // values are all zero.
  void Gather(bool nonzero_only, const std::vector<int>* ranges,
              std::vector<uint64_t>* keys,
              std::vector<float>* values) const;

  // Constant after construction.
  const TableSpec spec_;
  const int num_ranges_;
  const std::unique_ptr<Optimizer> optimizer_;
  const size_t stride_;        // floats per slot: dim * (1 + state_floats)
  const int chunk_shift_;      // log2(slots per chunk)
  const uint32_t chunk_mask_;  // slots per chunk - 1
  const uint64_t init_seed_;   // mixes the table id into initial values
  // One per range; each guards itself.
  const std::unique_ptr<Partition[]> partitions_;
  // The dense-id index: spec_.dense_ids entries (see DenseEntry), anonymous
  // zero pages (mmap); null when dense_ids is 0. Each entry is guarded by the
  // lock of the partition its range names.
  const DenseIndex dense_index_;
};

// Sums the gradients pushed during one BSP clock, then applies them as one
// update. For a key, the sum adds the pushes' gradients in the order of the
// Add calls; keys are applied in ascending order per range. Callers Add the
// pushes in worker-id order, which makes the result independent of the
// order in which pushes arrived. Thread-safe (one internal lock).
class GradAccumulator {
 public:
  // dim and num_ranges as for the table it will be applied to.
  GradAccumulator(int dim, int num_ranges);

  GradAccumulator(const GradAccumulator&) = delete;
  GradAccumulator& operator=(const GradAccumulator&) = delete;

  int dim() const { return dim_; }
  int num_ranges() const { return num_ranges_; }

  // Adds grads[i*dim ... (i+1)*dim) to the sum of keys[i].
  // Precondition (checked, abort): 0 <= range < num_ranges().
  void Add(int range, absl::Span<const uint64_t> keys, const float* grads);

  // Pushes every range's summed gradients to `table` with `scale` (e.g.
  // 1 / number of workers), keys ascending, one Push per range, then
  // clears the sums. Precondition (checked, abort): table->dim() == dim()
  // and table->num_ranges() == num_ranges(). When `keys_out` (`sums_out`)
  // is given, the keys (sums) pushed are appended to it (uint64 and float
  // bytes; the ranges one after another, ascending). `journal`: as for
  // Table::Push, for every range's push; *journal is set to whether every
  // one was recorded.
  void ApplyTo(Table* table, float scale, std::string* keys_out = nullptr,
               std::string* sums_out = nullptr, bool* journal = nullptr);

  // Distinct (range, key) pairs summed since the last ApplyTo.
  size_t pending_keys() const;

 private:
  struct RangeSums {
    absl::flat_hash_map<uint64_t, uint32_t> index;  // key -> entry
    std::vector<uint64_t> keys;                     // entry -> key
    std::vector<float> sums;                        // entry * dim floats
  };

  const int dim_;
  const int num_ranges_;
  mutable absl::Mutex mu_;
  std::vector<RangeSums> ranges_ ABSL_GUARDED_BY(mu_);
  std::vector<int> touched_ ABSL_GUARDED_BY(mu_);  // ranges with sums
  // Scratch for ApplyTo, kept to avoid reallocating every clock.
  std::vector<uint32_t> order_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> sorted_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<float> sorted_sums_ ABSL_GUARDED_BY(mu_);
};

namespace table_internal {

// The implementations of the dim-1 FTRL update of kFtrlGroup consecutive
// entries (Table::ApplyAt's lanes), so that tests hold each one this CPU
// can run to FtrlRule::Step bit for bit, whichever ApplyAt picks here.
enum class FtrlIsa { kPortable, kAvx2, kAvx512 };
inline constexpr size_t kFtrlGroup = 16;
bool CpuRunsFtrl(FtrlIsa isa);
// The SGD update of a long row checked as it goes (Table::Push's
// `non_finite`, where ChecksFiniteWhileApplying): w[i] updated as
// SgdRule::Apply updates it, its value before kept in old[i], *finite
// cleared where g[i] is NaN or infinite; returns the elements left as they
// were. Each implementation this CPU runs (CpuRunsFtrl), so that tests hold
// them to the rule bit for bit.
size_t SgdRowKeepingWith(FtrlIsa isa, const optimizer_internal::SgdRule& rule,
                         float* w, const float* g, float scale, size_t n,
                         float* old, bool* finite);
// Whether no float32 of `bytes` is NaN or infinite (a trailing partial
// float is no value). ServerNode's check of a push, and Table's where it
// cannot check within the update.
bool AllFinite(absl::string_view bytes);
// Updates the groups * kFtrlGroup entries [w, z, n] from `first` on with
// gradients scale * g[k] and returns how many it left as they were (a
// non-finite result). CpuRunsFtrl(isa) must hold.
size_t FtrlConsecutiveWith(FtrlIsa isa,
                           const optimizer_internal::FtrlRule& rule,
                           float* first, const float* g, float scale,
                           size_t groups = 1);

// The dense-id lookup (TableSpec::dense_ids) of keys[i], i < n, in `range`
// by `isa`'s loop: slots[i] = the slot that index[FeatureOf(keys[i])]
// names when that entry is for `range` (index entries (range << 32) |
// (slot + 1), ids below `limit`), else Table::kNoSlot. False, doing nothing,
// where this CPU cannot run `isa`'s loop; tests hold each to the portable
// one.
bool DenseSlotsWith(FtrlIsa isa, const uint64_t* index, uint64_t limit,
                    int range, const uint64_t* keys, size_t n, uint32_t* slots);

}  // namespace table_internal
}  // namespace ps
