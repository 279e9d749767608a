// Key caching (the paper's section 4.2): a worker that sends the same key
// list again names it (PushRequest/PullRequest.key_list) instead of sending
// it. The server keeps each named list with what it costs to check and
// resolve: the range runs the routing cuts it into and, per key, the storage
// slot of its table (Table::Resolve), so a push or pull by a cached list does
// no hash lookup and no key validation.
//
// Safety: lists are immutable once made (a re-resolved list replaces the
// old one) and shared with the requests using them; slots carry the range
// generation they were resolved at (Table::generation), and the table
// refuses slots of an older generation (the caller then goes by keys). The
// cache holds at most `budget_bytes` (least recently used lists go first),
// whatever the workers send, and is emptied when the node is reconfigured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ps {

// A run of a key list inside one key range: keys [first, last).
struct RangeRun {
  int range;
  size_t first, last;
};

// One named key list of one worker, as the server resolved it.
struct KeyList {
  int table = 0;
  std::vector<uint64_t> keys;  // ascending, unique, checked
  std::vector<RangeRun> runs;  // as the routing cuts `keys`
  // Per key its slot in the table's range partition (Table::kNoSlot for a
  // key not stored when resolved); per run the generation it was resolved
  // at. Empty when not resolved.
  std::vector<uint32_t> slots;
  std::vector<uint64_t> generations;
  bool complete = false;  // resolved, and every key has a slot
  // Per run, when complete: whether its slots are consecutive (slot k of
  // the run is its first + k: the keys were made by one push, in order).
  std::vector<uint8_t> consecutive;

  size_t bytes() const {
    return sizeof(KeyList) + keys.size() * sizeof(uint64_t) +
           runs.size() * sizeof(RangeRun) + slots.size() * sizeof(uint32_t) +
           generations.size() * sizeof(uint64_t) + consecutive.size();
  }
};

// Thread-safe.
class KeyCache {
 public:
  // budget_bytes 0: caches nothing (every Find misses).
  explicit KeyCache(size_t budget_bytes) : budget_(budget_bytes) {}

  // The list `id` of `worker`, or null; marks it recently used.
  std::shared_ptr<const KeyList> Find(int worker, uint64_t id);
  // Find without marking or counting (what is kept, for tests and status).
  std::shared_ptr<const KeyList> Peek(int worker, uint64_t id) const;
  // Keeps (or replaces) list `id` of `worker`, evicting the least recently
  // used lists beyond the budget (a list larger than the budget is not
  // kept), and the worker's least recently used beyond `window` lists of
  // it (0: no such bound). A worker names only its `window` most recent
  // lists (PushRequest.key_lists): older ones are dead weight, and keeping
  // them until the budget was reached made every new list fresh memory
  // (its page faults were 11 % of a server's CPU in scale.yaml).
  void Put(int worker, uint64_t id, std::shared_ptr<const KeyList> list,
           uint32_t window = 0);
  // Lists kept for `worker`.
  size_t lists_of(int worker) const;
  // Forgets everything (a new view: tables, routing and workers may differ).
  void Clear();

  size_t bytes() const;
  size_t lists() const;
  int64_t hits() const;
  int64_t misses() const;

 private:
  using Name = std::pair<int, uint64_t>;  // (worker, id)
  struct Entry {
    Name name;
    std::shared_ptr<const KeyList> list;
  };

  size_t CountLocked(int worker) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Erases *it; the entry after it.
  std::list<Entry>::iterator EraseLocked(std::list<Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t budget_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<Name, std::list<Entry>::iterator> index_
      ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int, size_t> per_worker_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
