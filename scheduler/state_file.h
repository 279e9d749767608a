// The scheduler's state file (scheduler restart, issue 9): written after
// every change that matters, which in a running job is every work unit
// handed out (thousands per epoch). Rewriting it whole through a temporary
// file and a rename cost an open, a truncate and a rename of ext4 metadata
// per unit (0.6-0.7 CPU s of a 3000-unit job). So the file keeps two slots
// and each write overwrites the older one in place (one pwrite), the other
// staying intact: a write torn by a crash leaves the previous state, which
// a restarted scheduler then reads (the unit whose hand-out was being saved
// had not been answered). Each slot carries a sequence number and a CRC-32.
//
// Layout: a 64-byte header ("PSSCHST2", the slot capacity as a little-
// endian uint64, zeros), then slot 0 and slot 1 of `capacity` bytes each:
// sequence (uint64), payload length (uint64), CRC-32 of those 16 bytes and
// the payload (uint32), the payload. A state that outgrows the slots makes
// a new file (temporary, fsync, rename) with larger ones.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

class StateFile {
 public:
  static constexpr uint64_t kHeaderBytes = 64;
  static constexpr uint64_t kSlotHeaderBytes = 20;
  static constexpr uint64_t kMinCapacity = 64 * 1024;

  explicit StateFile(std::string path) : path_(std::move(path)) {}
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  // Saves `payload` as the newest state: into the older slot, fsynced when
  // `sync` (fdatasync). The first write, and one that outgrows the slots,
  // replaces the file whole (made fresh: whatever was at `path` before is
  // not this object's to keep).
  absl::Status Write(const std::string& payload, bool sync);

  // A descriptor of the file the writes go to (a dup: the caller closes
  // it), for an fdatasync made without the lock that serialises the
  // writes, which heartbeats wait on (a sync can take seconds on a busy
  // disk); -1 before the first write, or when dup fails.
  int DupForSync() const;

  // The newest slot's payload with a valid checksum. NOT_FOUND when there
  // is no file; DATA_LOSS, naming the file, when it is not a state file of
  // this format or neither slot is intact.
  static absl::StatusOr<std::string> Read(const std::string& path);

 private:
  absl::Status Create(const std::string& payload, bool sync);
  const std::string path_;
  int fd_ = -1;
  uint64_t capacity_ = 0;  // bytes per slot, header included
  uint64_t seq_ = 0;       // of the newest slot written
};

}  // namespace ps
