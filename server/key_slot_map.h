// KeySlotMap: a table partition's key -> storage slot map (issue 10), an
// open-addressing hash table with linear probing built to be prefetched.
//
// Why not absl::flat_hash_map: its prefetch(key) loads the control bytes and
// the first of the 16 slots of the key's probe group (4 cache lines of
// 16-byte slots), while the key sits anywhere in the group, so 3 lookups in 4
// still waited on memory: the load of the slot's key was 71 % of
// Table::FindOrNewSlot's samples, and that function 45 % of a 100k
// random-key push's (perf, 2026-11-28). Here a key is at its home entry or a
// few after it (linear probing, load at most 5/8), and Prefetch loads the
// line of the home entry and the next one.
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

  // The slot of `key` (a reference the caller may set), and whether the
  // key was added (its slot then 0). Invalidates earlier references.
  // Grows only to add a key: a key already stored never reallocates.
  std::pair<uint32_t*, bool> TryEmplace(uint64_t key) {
    if (entries_ != nullptr) {
      for (size_t i = Home(key);; i = (i + 1) & mask_) {
        Entry& e = entries_[i];
        if (e.used == 0) break;
        if (e.key == key) return {&e.slot, false};
      }
    }
    if ((size_ + 1) * 8 > capacity() * 5) Grow();
    size_t i = Home(key);
    while (entries_[i].used != 0) i = (i + 1) & mask_;
    Entry& e = entries_[i];
    e = {key, 0, 1};
    ++size_;
    return {&e.slot, true};
  }

  // Starts loading what Find(key) and TryEmplace(key) will read first.
  // Always inlined: GCC 12 judges an out-of-line function that only
  // prefetches pure, and drops its calls, prefetches and all.
  [[gnu::always_inline]] void Prefetch(uint64_t key) const {
    if (entries_ == nullptr) return;
    const size_t i = Home(key);
    const Entry* e = entries_.get();
    __builtin_prefetch(e + i);
    // A probe that runs past the home line reads the next one.
    __builtin_prefetch(e + ((i + kPerLine - 1) & mask_));
  }

  // Calls fn(key, slot) for every key, in no particular order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (size_t i = 0; i < capacity(); ++i) {
      if (entries_[i].used != 0) fn(entries_[i].key, entries_[i].slot);
    }
  }

  // The most entries a lookup of a stored key reads (0 when empty): how
  // far linear probing displaced the worst key.
  size_t LongestProbe() const;

  void Clear() {
    entries_.reset();
    mask_ = 0;
    size_ = 0;
  }

 private:
  struct Entry {
    uint64_t key;
    uint32_t slot;
    uint32_t used;  // 0: empty
  };
  static_assert(sizeof(Entry) == 16);
  static constexpr size_t kPerLine = 64 / sizeof(Entry);
  static constexpr size_t kMinCapacity = 16;

  // A process-wide random seed (hardware entropy, drawn once).
  static uint64_t Seed();

  size_t capacity() const { return entries_ == nullptr ? 0 : mask_ + 1; }
  size_t Home(uint64_t key) const {
    return static_cast<size_t>(Mix64(key ^ seed_)) & mask_;
  }
  const Entry* FindEntry(uint64_t key) const {
    if (size_ == 0) return nullptr;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.used == 0) return nullptr;
      if (e.key == key) return &e;
    }
  }
  // Doubles the capacity (kMinCapacity at first) and re-inserts every key.
  void Grow();

  const uint64_t seed_ = Seed();
  std::unique_ptr<Entry[]> entries_;
  size_t mask_ = 0;  // capacity - 1
  size_t size_ = 0;
};

}  // namespace ps
