// KeySlotMap: a table partition's key -> storage slot map (issue 10), an
// open-addressing hash table with linear probing built to be prefetched.
//
// Why not absl::flat_hash_map: its prefetch(key) loads the control bytes and
// the first of the 16 slots of the key's probe group (4 cache lines of
// 16-byte slots), while the key sits anywhere in the group, so 3 lookups in 4
// still waited on memory: the load of the slot's key was 71 % of
// Table::FindOrNewSlot's samples, and that function 45 % of a 100k
// random-key push's (perf, 2026-11-28). Here a key is in its home line or,
// when that is full, a later one (linear probing, load at most 5/8), and
// Prefetch loads the home line.
//
// Entries lie in 64-byte lines of four, and a key's home is a line: a
// lookup compares the key with the line's four entries at once (no branch
// per entry) and reads on only when the line is full. Linear probing over
// whole lines: a key sits in its home line or a later one, and since
// entries are only ever added at the first empty one from a line's start,
// every line's used entries are a prefix of it (the last used means full).
// One prefetched line answers nearly every lookup: at a load of 5/8 most
// keys are in their home line, where probing by entry (a home entry
// anywhere in a line) read past it for about half of them, a mispredicted
// branch each, and prefetched a second line for every key.
//
// Keys are any uint64_t. Hashing mixes a per-process random seed into the
// key (splitmix64), so keys chosen by a client cannot be made to collide.
// Entries are never removed one by one (Clear removes all), which keeps
// linear probing exact without tombstones.
//
// Not thread-safe: the owner's lock guards it (Table::Partition::mu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "common/hash.h"

namespace ps {

class KeySlotMap {
 public:
  KeySlotMap() = default;
  KeySlotMap(const KeySlotMap&) = delete;
  KeySlotMap& operator=(const KeySlotMap&) = delete;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // The slot stored for `key`, or `none` when it has none.
  uint32_t Find(uint64_t key, uint32_t none) const {
    const Entry* e = FindEntry(key);
    return e == nullptr ? none : e->slot;
  }
  bool Contains(uint64_t key) const { return FindEntry(key) != nullptr; }

  // slots[i] = Find(keys[i], none) for i < n, faster than a Find per key:
  // each key hashed once (a Prefetch then a Find hash it twice), its home
  // line loaded 64 keys ahead (32 in AVX-512), and no call per key. A key
  // found in its home line (nearly all) costs no mispredicted branch.
  // Table::Push and Pull of keys sent.
  // With AVX-512 (F and DQ) where the CPU has it: 8 keys hashed at once,
  // and a line's 4 keys compared with one instruction; with AVX2 (and no
  // AVX-512), 4 keys hashed at once and a line compared with two.
  void FindMany(const uint64_t* keys, size_t n, uint32_t* slots,
                uint32_t none) const;
  // FindMany without vector instructions (what it runs on other CPUs).
  // Public so that tests compare the two on any CPU.
  void FindManyPortable(const uint64_t* keys, size_t n, uint32_t* slots,
                        uint32_t none) const;
  // Whether FindMany runs its AVX-512 loop on this CPU.
  static bool VectorFindMany();
  // Whether FindMany runs its AVX2 loop (AVX2 without AVX-512).
  static bool Avx2FindMany();

  // The slot of `key` (a reference the caller may set), and whether the
  // key was added (its slot then 0). Invalidates earlier references.
  // Grows only to add a key: a key already stored never reallocates.
  std::pair<uint32_t*, bool> TryEmplace(uint64_t key) {
    if (Entry* e = FindEntry(key); e != nullptr) return {&e->slot, false};
    if ((size_ + 1) * 8 > capacity() * 5) Grow();
    Entry& e = FreeEntry(key);
    e = {key, 0, 1};
    ++size_;
    return {&e.slot, true};
  }

  // Starts loading what Find(key) and TryEmplace(key) will read first.
  // Always inlined: GCC 12 judges an out-of-line function that only
  // prefetches pure, and drops its calls, prefetches and all.
  [[gnu::always_inline]] void Prefetch(uint64_t key) const {
    if (lines_ == nullptr) return;
    __builtin_prefetch(&lines_[HomeLine(key)]);
  }

  // Calls fn(key, slot) for every key, in no particular order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (size_t b = 0; b < lines(); ++b) {
      for (const Entry& e : lines_[b].e) {
        if (e.used != 0) fn(e.key, e.slot);
      }
    }
  }

  // The most entries a lookup of a stored key reads (0 when empty): how
  // far linear probing displaced the worst key.
  size_t LongestProbe() const;

  void Clear() {
    lines_.reset();
    line_mask_ = 0;
    size_ = 0;
  }

 private:
  struct Entry {
    uint64_t key;
    uint32_t slot;
    uint32_t used;  // 0: empty
  };
  static_assert(sizeof(Entry) == 16);
  static constexpr size_t kPerLine = 4;
  struct alignas(64) Line {
    Entry e[kPerLine];
  };
  static_assert(sizeof(Line) == 64);
  static constexpr size_t kMinLines = 4;

  // A process-wide random seed (hardware entropy, drawn once).
  static uint64_t Seed();

  size_t lines() const { return lines_ == nullptr ? 0 : line_mask_ + 1; }
  size_t capacity() const { return lines() * kPerLine; }
  size_t HomeLine(uint64_t key) const {
    return static_cast<size_t>(Mix64(key ^ seed_)) & line_mask_;
  }
  // Bit j set where the line's entry j holds `key` (at most one: keys are
  // unique). Only key 0 can equal an empty entry's key (0), so only its
  // lookups test the used flags too. Unrolled: GCC at -O2 kept the loops,
  // their counters' compares and branches a fifth of FindMany's samples.
  static uint32_t Matches(const Line& l, uint64_t key) {
    uint32_t m = 0;
#pragma GCC unroll 4
    for (size_t j = 0; j < kPerLine; ++j) {
      m |= static_cast<uint32_t>(l.e[j].key == key) << j;
    }
    if (key != 0) return m;
    uint32_t used = 0;
#pragma GCC unroll 4
    for (size_t j = 0; j < kPerLine; ++j) {
      used |= static_cast<uint32_t>(l.e[j].used != 0) << j;
    }
    return m & used;
  }
  static bool Full(const Line& l) { return l.e[kPerLine - 1].used != 0; }

  const Entry* FindEntry(uint64_t key) const {
    if (size_ == 0) return nullptr;
    return FindEntryFrom(HomeLine(key), key);
  }
  // FindEntry's probe from line b on (b, the key's home line or one after
  // it, with every line before it full).
  const Entry* FindEntryFrom(size_t b, uint64_t key) const {
    for (;; b = (b + 1) & line_mask_) {
      const Line& l = lines_[b];
      if (const uint32_t m = Matches(l, key); m != 0) {
        return &l.e[__builtin_ctz(m)];
      }
      if (!Full(l)) return nullptr;
    }
  }
  // The slot of `key`, or `none`, once it is known not to be in its home
  // line `l` (line b): past it only when that line is full. The FindMany
  // loops' end for a key their compare of the home line missed.
  uint32_t SlotPastHomeLine(const Line& l, size_t b, uint64_t key,
                            uint32_t none) const {
    if (!Full(l)) return none;
    const Entry* e = FindEntryFrom((b + 1) & line_mask_, key);
    return e == nullptr ? none : e->slot;
  }
  Entry* FindEntry(uint64_t key) {
    return const_cast<Entry*>(std::as_const(*this).FindEntry(key));
  }
  // Where `key` goes: the first empty entry from its home line on. The map
  // must have room (load below 1).
  Entry& FreeEntry(uint64_t key) {
    for (size_t b = HomeLine(key);; b = (b + 1) & line_mask_) {
      for (Entry& e : lines_[b].e) {
        if (e.used == 0) return e;
      }
    }
  }
#if defined(__x86_64__)
  void FindManyAvx512(const uint64_t* keys, size_t n, uint32_t* slots,
                      uint32_t none) const;
  void FindManyAvx2(const uint64_t* keys, size_t n, uint32_t* slots,
                    uint32_t none) const;
#endif
  // Doubles the capacity (kMinLines lines at first) and re-inserts every
  // key.
  void Grow();

  const uint64_t seed_ = Seed();
  std::unique_ptr<Line[]> lines_;
  size_t line_mask_ = 0;  // lines - 1
  size_t size_ = 0;
};

}  // namespace ps
