#include "scheduler/state_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'S', 'C', 'H', 'S', 'T', '2'};

// The slot's header and payload as written: sequence, length, CRC-32.
std::string Slot(uint64_t seq, const std::string& payload) {
  std::string out(StateFile::kSlotHeaderBytes, '\0');
  absl::little_endian::Store64(out.data(), seq);
  absl::little_endian::Store64(out.data() + 8, payload.size());
  uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(out.data()), 16);
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(payload.data()),
                payload.size());
  absl::little_endian::Store32(out.data() + 16, static_cast<uint32_t>(crc));
  out += payload;
  return out;
}

absl::Status WriteAllAt(int fd, const std::string& bytes, off_t offset,
                        const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done,
                               offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

StateFile::~StateFile() {
  if (fd_ >= 0) ::close(fd_);
}

int StateFile::DupForSync() const {
  return fd_ < 0 ? -1 : ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
}

absl::Status StateFile::Create(const std::string& payload, bool sync) {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  // Room for the state to double before the file is made again.
  uint64_t capacity = kMinCapacity;
  while (capacity < 2 * (kSlotHeaderBytes + payload.size())) capacity *= 2;
  std::string head(kHeaderBytes, '\0');
  std::memcpy(head.data(), kMagic, sizeof(kMagic));
  absl::little_endian::Store64(head.data() + 8, capacity);
  const std::string tmp = absl::StrCat(path_, ".tmp");
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
                        0600);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp));
  }
  absl::Status s = WriteAllAt(fd, head + Slot(0, payload), 0, tmp);
  if (s.ok() && sync && ::fsync(fd) != 0) {
    s = absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync ", tmp));
  }
  if (s.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) {
    s = absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", tmp, " to ",
                                                path_));
  }
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  fd_ = fd;  // the renamed file, written in place from now on
  capacity_ = capacity;
  seq_ = 0;
  return absl::OkStatus();
}

absl::Status StateFile::Write(const std::string& payload, bool sync) {
  if (fd_ < 0 || kSlotHeaderBytes + payload.size() > capacity_) {
    return Create(payload, sync);
  }
  const uint64_t seq = seq_ + 1;
  const off_t offset =
      static_cast<off_t>(kHeaderBytes + (seq % 2) * capacity_);
  if (absl::Status s = WriteAllAt(fd_, Slot(seq, payload), offset, path_);
      !s.ok()) {
    return s;
  }
  if (sync && ::fdatasync(fd_) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync ", path_));
  }
  seq_ = seq;
  return absl::OkStatus();
}

absl::StatusOr<std::string> StateFile::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec) && !ec) {
      return absl::NotFoundError(absl::StrCat("no scheduler state ", path));
    }
    // There, but not readable: not to be taken for "no state" (the job
    // would start afresh).
    return absl::DataLossError(absl::StrCat("cannot read scheduler state ",
                                            path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("cannot read scheduler state ",
                                            path));
  }
  const std::string file = ss.str();
  if (file.size() < kHeaderBytes ||
      std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(
        "scheduler state ", path, " is malformed (not a version 2 state "
        "file)"));
  }
  const uint64_t capacity = absl::little_endian::Load64(file.data() + 8);
  bool found = false;
  uint64_t best_seq = 0;
  std::string best;
  for (uint64_t slot = 0; slot < 2 && capacity >= kSlotHeaderBytes; ++slot) {
    const uint64_t at = kHeaderBytes + slot * capacity;
    if (at < kHeaderBytes || at > file.size() ||
        file.size() - at < kSlotHeaderBytes) {
      continue;  // never written, or cut short
    }
    const char* p = file.data() + at;
    const uint64_t seq = absl::little_endian::Load64(p);
    const uint64_t len = absl::little_endian::Load64(p + 8);
    if (len > capacity - kSlotHeaderBytes ||
        len > file.size() - at - kSlotHeaderBytes) {
      continue;
    }
    uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(p), 16);
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(p + kSlotHeaderBytes),
                  len);
    if (static_cast<uint32_t>(crc) != absl::little_endian::Load32(p + 16)) {
      continue;  // torn by a crash, or damaged
    }
    if (!found || seq > best_seq) {
      found = true;
      best_seq = seq;
      best.assign(p + kSlotHeaderBytes, len);
    }
  }
  if (!found) {
    return absl::DataLossError(absl::StrCat(
        "scheduler state ", path, " is damaged (no slot with a valid "
        "checksum)"));
  }
  return best;
}

}  // namespace ps
