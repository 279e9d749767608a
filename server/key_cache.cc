#include "server/key_cache.h"

namespace ps {

std::shared_ptr<const KeyList> KeyCache::Find(int worker, uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = index_.find(Name{worker, id});
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->list;
}

std::shared_ptr<const KeyList> KeyCache::Peek(int worker, uint64_t id) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = index_.find(Name{worker, id});
  return it == index_.end() ? nullptr : it->second->list;
}

void KeyCache::Put(int worker, uint64_t id, std::shared_ptr<const KeyList> list,
                   uint32_t window) {
  const size_t size = list->bytes();
  absl::MutexLock l(&mu_);
  const Name name{worker, id};
  if (auto it = index_.find(name); it != index_.end()) EraseLocked(it->second);
  if (size > budget_) return;
  while (bytes_ + size > budget_ && !lru_.empty()) {
    EraseLocked(std::prev(lru_.end()));
  }
  if (window > 0) {
    // The worker's least recently used lists, from the back: with every
    // worker bounded, at most the sum of their windows are walked.
    auto it = lru_.end();
    while (CountLocked(worker) >= window && it != lru_.begin()) {
      --it;
      if (it->name.first != worker) continue;
      it = EraseLocked(it);
    }
  }
  lru_.push_front(Entry{name, std::move(list)});
  index_[name] = lru_.begin();
  bytes_ += size;
  ++per_worker_[worker];
}

std::list<KeyCache::Entry>::iterator KeyCache::EraseLocked(
    std::list<Entry>::iterator it) {
  bytes_ -= it->list->bytes();
  index_.erase(it->name);
  if (auto w = per_worker_.find(it->name.first);
      w != per_worker_.end() && --w->second == 0) {
    per_worker_.erase(w);
  }
  return lru_.erase(it);
}

size_t KeyCache::CountLocked(int worker) const {
  auto it = per_worker_.find(worker);
  return it == per_worker_.end() ? 0 : it->second;
}

size_t KeyCache::lists_of(int worker) const {
  absl::MutexLock l(&mu_);
  return CountLocked(worker);
}

void KeyCache::Clear() {
  absl::MutexLock l(&mu_);
  lru_.clear();
  index_.clear();
  per_worker_.clear();
  bytes_ = 0;
}

size_t KeyCache::bytes() const {
  absl::MutexLock l(&mu_);
  return bytes_;
}

size_t KeyCache::lists() const {
  absl::MutexLock l(&mu_);
  return lru_.size();
}

int64_t KeyCache::hits() const {
  absl::MutexLock l(&mu_);
  return hits_;
}

int64_t KeyCache::misses() const {
  absl::MutexLock l(&mu_);
  return misses_;
}

}  // namespace ps
