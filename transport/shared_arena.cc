#include "transport/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps {

namespace {
absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("shared arena: ", what, ": ", std::strerror(errno)));
}
}  // namespace

absl::StatusOr<std::unique_ptr<SharedArena>> SharedArena::Create(
    size_t bytes) {
  if (bytes == 0 || bytes % kArenaPage != 0 ||
      bytes / kArenaPage >= std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared arena: bad size ", bytes));
  }
  const int fd = ::memfd_create("ps-data-plane", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status s = Errno("ftruncate");
    ::close(fd);
    return s;
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status s = Errno("seals");
    ::close(fd);
    return s;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    absl::Status s = Errno("mmap");
    ::close(fd);
    return s;
  }
  return std::unique_ptr<SharedArena>(
      new SharedArena(fd, static_cast<char*>(p), bytes));
}

SharedArena::SharedArena(int fd, char* base, size_t size)
    : fd_(fd), base_(base), size_(size) {
  absl::MutexLock l(&mu_);
  free_pages_ = size / kArenaPage;
  free_.emplace(0, static_cast<uint32_t>(free_pages_));
}

SharedArena::~SharedArena() {
  ::munmap(base_, size_);
  ::close(fd_);
}

std::shared_ptr<char> SharedArena::Lend(std::shared_ptr<SharedArena> arena,
                                        size_t bytes) {
  if (arena == nullptr || bytes == 0) return nullptr;
  const std::optional<uint32_t> page = arena->Allocate(bytes);
  if (!page.has_value()) return nullptr;
  return Own(std::move(arena), *page, bytes);
}

std::shared_ptr<char> SharedArena::Own(std::shared_ptr<SharedArena> arena,
                                       uint32_t page, size_t bytes) {
  struct Lent {
    Lent(std::shared_ptr<SharedArena> a, uint32_t p, size_t b)
        : arena(std::move(a)), page(p), bytes(b) {}
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;
    ~Lent() { arena->Free(page, bytes); }
    const std::shared_ptr<SharedArena> arena;
    const uint32_t page;
    const size_t bytes;
  };
  char* const at = arena->base() + size_t{page} * kArenaPage;
  auto lent = std::make_shared<Lent>(std::move(arena), page, bytes);
  return std::shared_ptr<char>(std::move(lent), at);
}

namespace {
absl::Mutex quarantine_mu(absl::kConstInit);
// Reachable from a global: leak checkers do not count what it keeps.
std::vector<std::shared_ptr<const void>>* quarantine
    ABSL_GUARDED_BY(quarantine_mu) = nullptr;
}  // namespace

void SharedArena::Quarantine(std::shared_ptr<const void> owner) {
  if (owner == nullptr) return;
  absl::MutexLock l(&quarantine_mu);
  if (quarantine == nullptr) {
    quarantine = new std::vector<std::shared_ptr<const void>>();
  }
  quarantine->push_back(std::move(owner));
}

size_t SharedArena::quarantined() {
  absl::MutexLock l(&quarantine_mu);
  return quarantine == nullptr ? 0 : quarantine->size();
}

std::optional<uint32_t> SharedArena::Allocate(size_t bytes) {
  if (bytes == 0 || bytes > size_) return std::nullopt;
  const uint32_t want = Pages(bytes);
  absl::MutexLock l(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const uint32_t page = it->first;
    const uint32_t left = it->second - want;
    free_.erase(it);
    if (left > 0) free_.emplace(page + want, left);
    free_pages_ -= want;
    return page;
  }
  return std::nullopt;
}

void SharedArena::Free(uint32_t page, size_t bytes) {
  uint32_t n = Pages(bytes);
  absl::MutexLock l(&mu_);
  free_pages_ += n;
  uint32_t first = page;
  auto next = free_.lower_bound(page);
  if (next != free_.end() && next->first == page + n) {
    n += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == page) {
      first = prev->first;
      n += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(first, n);
}

size_t SharedArena::free_pages() const {
  absl::MutexLock l(&mu_);
  return free_pages_;
}

absl::StatusOr<std::unique_ptr<SharedMapping>> SharedMapping::Map(
    int fd, size_t max_bytes) {
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "shared arena: not a memfd that can be sealed");
  }
  if ((seals & F_SEAL_SHRINK) == 0 || (seals & F_SEAL_WRITE) != 0 ||
      (seals & F_SEAL_FUTURE_WRITE) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared arena: seals ", seals,
        ": must be sealed against shrinking and open for writing"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("shared arena: not a regular memfd");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (st.st_size <= 0 || size % kArenaPage != 0 || size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared arena: size ", st.st_size, " is not a multiple of ", kArenaPage,
        " bytes from ", kArenaPage, " to ", max_bytes));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared arena: cannot map it: ", std::strerror(errno)));
  }
  return std::unique_ptr<SharedMapping>(
      new SharedMapping(static_cast<char*>(p), size));
}

SharedMapping::~SharedMapping() { ::munmap(base_, size_); }

char* SharedMapping::At(uint64_t page, uint64_t bytes) const {
  const uint64_t pages = size_ / kArenaPage;
  if (page >= pages) return nullptr;
  const uint64_t off = page * kArenaPage;
  if (bytes > size_ - off) return nullptr;
  return base_ + off;
}

}  // namespace ps
