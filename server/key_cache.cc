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

void KeyCache::Put(int worker, uint64_t id,
                   std::shared_ptr<const KeyList> list) {
  const size_t size = list->bytes();
  absl::MutexLock l(&mu_);
  const Name name{worker, id};
  if (auto it = index_.find(name); it != index_.end()) EraseLocked(it->second);
  if (size > budget_) return;
  while (bytes_ + size > budget_ && !lru_.empty()) {
    EraseLocked(std::prev(lru_.end()));
  }
  lru_.push_front(Entry{name, std::move(list)});
  index_[name] = lru_.begin();
  bytes_ += size;
}

void KeyCache::EraseLocked(std::list<Entry>::iterator it) {
  bytes_ -= it->list->bytes();
  index_.erase(it->name);
  lru_.erase(it);
}

void KeyCache::Clear() {
  absl::MutexLock l(&mu_);
  lru_.clear();
  index_.clear();
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
