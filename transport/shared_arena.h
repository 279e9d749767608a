// Shared memory for the data plane's same-host connections (issue 10).
//
// Over a same-host socket a 4 MiB push's values cross the kernel twice (the
// worker's sendmsg copies them into fresh socket buffers, the server's recv
// copies them out): on the 2-vCPU machines of docs/benchmarks.md those two
// copies and their page allocation were 45-50 % of a dense push's CPU. A
// worker that opens a same-host connection can instead hand the server a
// sealed memfd (the "arena") with its hello; from then on a large push's
// values are written once into a slot of the arena and the frame on the
// socket carries only where they lie, and a large pull's answer is written
// by the server into a slot the worker offered.
//
// Who owns what: the worker creates the arena (one per worker process,
// offered to every same-host server it connects to) and alone allocates its
// slots; a slot is the worker's until the request it went with is answered
// (or its connection breaks: the slot is then never reused, since the
// server may still read or write it). A worker may also lend slots to its
// caller (Lend), who writes values there and pushes them without a copy:
// the frame then says where in the arena they lie. The server maps the arena
// only after checking that it cannot shrink (F_SEAL_SHRINK, so no access past
// its end can fault), reads a push's values once, in place, and writes a pull's
// answer only into the slot it was given, bounds-checked. A worker that
// scribbles over a slot while the server reads it changes only its own
// gradient, as it could by sending other values (and the update rules keep a
// weight whose new value would not be finite); keys and metadata never travel
// through the arena (they are checked, then used again), and compressed values
// are copied out before they are decompressed, so nothing the server validates
// can change under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps {

inline constexpr size_t kArenaPage = 4096;

// The worker's side: a memfd of `bytes` (a multiple of kArenaPage), sealed
// against shrinking and growing, mapped read-write, with a first-fit page
// allocator. Thread-safe.
class SharedArena {
 public:
  // UNAVAILABLE when memfd_create, ftruncate, the seals or mmap fail (the
  // caller then sends its values in-band); INVALID_ARGUMENT for a size that
  // is 0, not a multiple of kArenaPage, or 2^32 pages or more.
  static absl::StatusOr<std::unique_ptr<SharedArena>> Create(size_t bytes);
  ~SharedArena();  // unmaps and closes
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  int fd() const { return fd_; }
  size_t size() const { return size_; }
  char* base() const { return base_; }

  // A slot of at least `bytes` (> 0), page-aligned, lowest first (so a
  // light load touches few pages): its first page, or nullopt when no
  // free run is long enough (the caller sends in-band instead).
  std::optional<uint32_t> Allocate(size_t bytes);
  // Returns a slot given by Allocate with the same `bytes`.
  void Free(uint32_t page, size_t bytes);
  // Pages free now (tests).
  size_t free_pages() const;

  // Whether the `n` bytes at `p` lie wholly inside the arena.
  bool Holds(const void* p, size_t n) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    const uintptr_t base = reinterpret_cast<uintptr_t>(base_);
    return at >= base && at - base <= size_ && n <= size_ - (at - base);
  }

  // A slot of at least `bytes` (> 0) for the caller's own values
  // (ClientFactory::SharedMemory): page-aligned, freed when the last copy
  // of the returned pointer goes (which keeps `arena` alive meanwhile);
  // null when no free run is long enough.
  static std::shared_ptr<char> Lend(std::shared_ptr<SharedArena> arena,
                                    size_t bytes);
  // The slot Allocate gave at `page` for `bytes`, as Lend's: freed when the
  // last copy of the returned pointer goes.
  static std::shared_ptr<char> Own(std::shared_ptr<SharedArena> arena,
                                   uint32_t page, size_t bytes);

  // Keeps `owner` for the rest of the process: memory a server may still
  // read through a connection that broke, which nothing may reuse (a
  // stopped server that wakes up reads on). Process-wide; rare.
  static void Quarantine(std::shared_ptr<const void> owner);
  // Owners quarantined so far (tests).
  static size_t quarantined();

 private:
  SharedArena(int fd, char* base, size_t size);
  static uint32_t Pages(size_t bytes) {
    return static_cast<uint32_t>((bytes + kArenaPage - 1) / kArenaPage);
  }

  // Constant after construction.
  const int fd_;
  char* const base_;
  const size_t size_;

  mutable absl::Mutex mu_;
  // Free runs: first page -> pages, never adjacent (merged on Free).
  std::map<uint32_t, uint32_t> free_ ABSL_GUARDED_BY(mu_);
  size_t free_pages_ ABSL_GUARDED_BY(mu_) = 0;
};

// The server's side: a peer's arena, mapped. Immutable once made, so any
// thread may read and write through it.
class SharedMapping {
 public:
  // Takes `fd` (closed on every path). Refused (INVALID_ARGUMENT, with the
  // reason) unless it is a memfd sealed with F_SEAL_SHRINK, of a size that
  // is a positive multiple of kArenaPage and at most `max_bytes`, that can
  // be mapped shared for reading and writing.
  static absl::StatusOr<std::unique_ptr<SharedMapping>> Map(int fd,
                                                            size_t max_bytes);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  size_t size() const { return size_; }
  // The `bytes` at page `page`, or null when they do not lie wholly inside
  // the arena.
  char* At(uint64_t page, uint64_t bytes) const;

 private:
  SharedMapping(char* base, size_t size) : base_(base), size_(size) {}
  char* const base_;
  const size_t size_;
};

}  // namespace ps
