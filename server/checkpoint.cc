#include "server/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"

namespace ps {
namespace {

constexpr char kMagic[4] = {'P', 'S', 'C', 'K'};
// magic, version, header length.
constexpr size_t kPrefixBytes = 12;
constexpr size_t kCrcBytes = 4;
// Bounds that keep a corrupt header from making us compute absurd sizes.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxStateFloats = 16;
constexpr uint32_t kMaxHeaderBytes = 1 << 20;
constexpr char kConsistency[] =
    "per-range consistent: each key range was copied under its partition "
    "lock (a state it really had); ranges were copied one after another "
    "while training ran; BSP pushes of a clock not yet applied are not "
    "included";

absl::Status ErrnoError(int err, absl::string_view what,
                        const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

absl::Status Corrupt(const std::string& path, absl::string_view why) {
  return absl::DataLossError(
      absl::StrCat("checkpoint file ", path, ": ", why));
}

// zlib's crc32 over any length (its length argument is 32-bit).
uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

// Appends to a file through one buffer, computing the crc of what it wrote.
class CrcWriter {
 public:
  CrcWriter() = default;
  CrcWriter(const CrcWriter&) = delete;
  CrcWriter& operator=(const CrcWriter&) = delete;
  ~CrcWriter() {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoError(errno, "cannot create", path);
    crc_ = Crc32(0, nullptr, 0);
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, size_t n) {
    crc_ = Crc32(crc_, data, n);
    return WriteRaw(data, n);
  }
  // The crc of everything written so far, then fsync and close.
  absl::Status Finish() {
    const uint32_t crc = crc_;
    PS_RETURN_IF_ERROR(WriteRaw(&crc, sizeof(crc)));
    PS_RETURN_IF_ERROR(Flush());
    if (::fsync(fd_) != 0) return ErrnoError(errno, "cannot fsync", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return ErrnoError(errno, "cannot write", path_);
    return absl::OkStatus();
  }
  uint32_t crc() const { return crc_; }
  int64_t bytes() const { return bytes_; }

 private:
  absl::Status WriteRaw(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    bytes_ += static_cast<int64_t>(n);
    if (buf_.size() + n > kBufferBytes) PS_RETURN_IF_ERROR(Flush());
    if (n >= kBufferBytes) return WriteFd(p, n);
    buf_.append(p, n);
    return absl::OkStatus();
  }
  absl::Status Flush() {
    PS_RETURN_IF_ERROR(WriteFd(buf_.data(), buf_.size()));
    buf_.clear();
    return absl::OkStatus();
  }
  absl::Status WriteFd(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "cannot write", path_);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  static constexpr size_t kBufferBytes = 1 << 20;
  int fd_ = -1;
  std::string path_;
  std::string buf_;
  uint32_t crc_ = 0;
  int64_t bytes_ = 0;
};

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoError(err, "cannot read", path);
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

// Parses "ckpt-<id>"; false for anything else.
bool ParseFolderName(const std::string& name, int64_t* id) {
  if (!absl::StartsWith(name, "ckpt-")) return false;
  return absl::SimpleAtoi(name.substr(5), id) && *id >= 0;
}

// Every ckpt-<id> folder under dir: id -> complete (has a MANIFEST).
std::map<int64_t, bool> ScanFolders(const std::string& checkpoint_dir) {
  std::map<int64_t, bool> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(checkpoint_dir, ec);
  if (ec) return out;
  for (const auto& entry : it) {
    int64_t id = 0;
    if (!entry.is_directory(ec) ||
        !ParseFolderName(entry.path().filename().string(), &id)) {
      continue;
    }
    out[id] = std::filesystem::exists(entry.path() / kCheckpointManifestName, ec);
  }
  return out;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string CheckpointFolderName(int64_t id) {
  return absl::StrCat("ckpt-", id);
}

std::string CheckpointFileName(int table_id, int server_id) {
  return absl::StrCat("table-", table_id, ".server-", server_id, ".ckpt");
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(err, "cannot fsync", dir);
  return absl::OkStatus();
}

absl::Status WriteCheckpointFile(const std::string& dir, const Table& table,
                                 absl::Span<const int> ranges,
                                 proto::CheckpointHeader header,
                                 proto::CheckpointFileInfo* info) {
  const size_t entry = table.entry_floats();
  // One copy of this server's shard of the table, range by range.
  std::vector<uint64_t> keys, range_keys;
  std::vector<float> entries, range_entries;
  for (int r : ranges) {
    table.ExportRange(r, &range_keys, &range_entries);
    keys.insert(keys.end(), range_keys.begin(), range_keys.end());
    entries.insert(entries.end(), range_entries.begin(), range_entries.end());
  }
  // Ranges are disjoint key intervals, but not given in key order.
  std::vector<size_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return keys[a] < keys[b]; });

  header.set_format_version(kCheckpointFormatVersion);
  header.set_table_id(table.id());
  header.set_dim(table.dim());
  *header.mutable_optimizer() = OptimizerProto(table.spec().optimizer);
  header.mutable_optimizer()->set_init_scale(table.spec().init_scale);
  header.set_state_floats(table.optimizer().state_floats());
  header.set_keys(static_cast<int64_t>(keys.size()));
  header.set_consistency(kConsistency);
  header.set_created_unix_ms(NowUnixMs());
  const std::string header_bytes = header.SerializeAsString();

  const std::string name = CheckpointFileName(table.id(), header.server_id());
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = path + ".partial";
  CrcWriter w;
  absl::Status s = [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(w.Open(tmp));
    const uint32_t version = kCheckpointFormatVersion;
    const uint32_t header_len = static_cast<uint32_t>(header_bytes.size());
    PS_RETURN_IF_ERROR(w.Write(kMagic, sizeof(kMagic)));
    PS_RETURN_IF_ERROR(w.Write(&version, sizeof(version)));
    PS_RETURN_IF_ERROR(w.Write(&header_len, sizeof(header_len)));
    PS_RETURN_IF_ERROR(w.Write(header_bytes.data(), header_bytes.size()));
    for (size_t i : order) {
      PS_RETURN_IF_ERROR(w.Write(&keys[i], sizeof(uint64_t)));
    }
    for (size_t i : order) {
      PS_RETURN_IF_ERROR(
          w.Write(entries.data() + i * entry, entry * sizeof(float)));
    }
    const uint32_t crc = w.crc();
    PS_RETURN_IF_ERROR(w.Finish());
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return ErrnoError(errno, "cannot rename into", path);
    }
    info->set_crc32(crc);
    return absl::OkStatus();
  }();
  if (!s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  info->set_name(name);
  info->set_server_id(header.server_id());
  info->set_table_id(table.id());
  info->set_keys(static_cast<int64_t>(keys.size()));
  info->set_bytes(w.bytes());
  return absl::OkStatus();
}

absl::StatusOr<CheckpointFileContents> ReadCheckpointFile(
    const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::string data, ReadWholeFile(path));
  const size_t size = data.size();
  if (size < kPrefixBytes + kCrcBytes) {
    return Corrupt(path, absl::StrCat("truncated (", size, " bytes)"));
  }
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return Corrupt(path, "not a checkpoint file (bad magic)");
  }
  uint32_t version = 0, header_len = 0;
  std::memcpy(&version, data.data() + 4, 4);
  std::memcpy(&header_len, data.data() + 8, 4);
  if (version != kCheckpointFormatVersion) {
    return Corrupt(path, absl::StrCat("format version ", version,
                                      " (this build reads ",
                                      kCheckpointFormatVersion, ")"));
  }
  if (header_len > kMaxHeaderBytes ||
      kPrefixBytes + header_len + kCrcBytes > size) {
    return Corrupt(path, absl::StrCat("truncated or corrupt header (length ",
                                      header_len, ", file ", size, " bytes)"));
  }
  CheckpointFileContents out;
  if (!out.header.ParseFromArray(data.data() + kPrefixBytes,
                                 static_cast<int>(header_len))) {
    return Corrupt(path, "header does not parse");
  }
  const proto::CheckpointHeader& h = out.header;
  if (h.dim() < 1 || h.dim() > kMaxDim || h.state_floats() < 0 ||
      h.state_floats() > kMaxStateFloats || h.keys() < 0) {
    return Corrupt(path, absl::StrCat("header out of range (dim ", h.dim(),
                                      ", state floats ", h.state_floats(),
                                      ", keys ", h.keys(), ")"));
  }
  const uint64_t entry = static_cast<uint64_t>(h.dim()) *
                         (1 + static_cast<uint64_t>(h.state_floats()));
  const uint64_t per_key = 8 + 4 * entry;
  const uint64_t body = size - kPrefixBytes - header_len - kCrcBytes;
  if (static_cast<uint64_t>(h.keys()) > body / per_key ||
      body != static_cast<uint64_t>(h.keys()) * per_key) {
    return Corrupt(
        path, absl::StrCat(body < static_cast<uint64_t>(h.keys()) * per_key
                               ? "truncated"
                               : "trailing bytes",
                           ": the header says ", h.keys(), " keys of ",
                           per_key, " bytes, the file has ", body,
                           " bytes of them"));
  }
  uint32_t stored = 0;
  std::memcpy(&stored, data.data() + size - kCrcBytes, kCrcBytes);
  const uint32_t computed = Crc32(Crc32(0, nullptr, 0), data.data(),
                                  size - kCrcBytes);
  if (stored != computed) {
    return Corrupt(path, absl::StrCat("checksum mismatch (stored ", stored,
                                      ", computed ", computed, ")"));
  }
  const size_t n = static_cast<size_t>(h.keys());
  const char* p = data.data() + kPrefixBytes + header_len;
  out.keys.resize(n);
  // Not with 0 keys: memcpy's pointers must not be null even then (the
  // empty vectors' data() are), and UBSan said so (fuzz_files).
  if (n > 0) std::memcpy(out.keys.data(), p, n * 8);
  for (size_t i = 1; i < n; ++i) {
    if (out.keys[i] <= out.keys[i - 1]) {
      return Corrupt(path, absl::StrCat("keys not ascending at ", i));
    }
  }
  out.entries.resize(n * entry);
  if (n > 0) {
    std::memcpy(out.entries.data(), p + n * 8, n * entry * sizeof(float));
  }
  out.crc32 = stored;
  out.bytes = static_cast<int64_t>(size);
  return out;
}

absl::Status WriteManifest(const std::string& dir,
                           const proto::CheckpointManifest& manifest) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(manifest, &text)) {
    return absl::InternalError("cannot print the checkpoint manifest");
  }
  const std::string path = absl::StrCat(dir, "/", kCheckpointManifestName);
  const std::string tmp = path + ".partial";
  absl::Status s = [&]() -> absl::Status {
    const int fd =
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(errno, "cannot create", tmp);
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const int err = errno;
        ::close(fd);
        return ErrnoError(err, "cannot write", tmp);
      }
      done += static_cast<size_t>(w);
    }
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(err, "cannot fsync", tmp);
    }
    if (::close(fd) != 0) return ErrnoError(errno, "cannot write", tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return ErrnoError(errno, "cannot rename into", path);
    }
    return SyncDir(dir);
  }();
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

absl::StatusOr<proto::CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kCheckpointManifestName);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, " is not a checkpoint: it has no ",
                     kCheckpointManifestName, " (incomplete or not one)"));
  }
  PS_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  proto::CheckpointManifest m;
  if (!google::protobuf::TextFormat::ParseFromString(text, &m)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", path, ": does not parse"));
  }
  for (const proto::CheckpointFileInfo& f : m.files()) {
    if (f.name().empty() || absl::StrContains(f.name(), "/")) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint manifest ", path, ": bad file name '", f.name(), "'"));
    }
  }
  return m;
}

std::vector<int64_t> ListCheckpoints(const std::string& checkpoint_dir) {
  std::vector<int64_t> out;
  for (const auto& [id, complete] : ScanFolders(checkpoint_dir)) {
    if (complete) out.push_back(id);
  }
  return out;
}

int64_t MaxCheckpointId(const std::string& checkpoint_dir) {
  auto folders = ScanFolders(checkpoint_dir);
  return folders.empty() ? 0 : folders.rbegin()->first;
}

absl::StatusOr<std::string> FindLatestCheckpoint(
    const std::string& checkpoint_dir) {
  std::vector<int64_t> ids = ListCheckpoints(checkpoint_dir);
  if (ids.empty()) {
    return absl::NotFoundError(absl::StrCat("no complete checkpoint in ",
                                            checkpoint_dir));
  }
  return absl::StrCat(checkpoint_dir, "/", CheckpointFolderName(ids.back()));
}

absl::Status PruneCheckpoints(const std::string& checkpoint_dir, int keep) {
  std::vector<int64_t> complete = ListCheckpoints(checkpoint_dir);
  if (static_cast<int>(complete.size()) <= keep) return absl::OkStatus();
  const int64_t oldest_kept = complete[complete.size() - std::max(keep, 0)];
  absl::Status first;
  for (const auto& [id, is_complete] : ScanFolders(checkpoint_dir)) {
    if (id >= oldest_kept) break;
    const std::string dir =
        absl::StrCat(checkpoint_dir, "/", CheckpointFolderName(id));
    std::error_code ec;
    if (is_complete) {
      std::filesystem::remove(
          std::filesystem::path(dir) / kCheckpointManifestName, ec);
    }
    if (!ec) std::filesystem::remove_all(dir, ec);
    if (ec && first.ok()) {
      first = absl::UnavailableError(
          absl::StrCat("cannot delete old checkpoint ", dir, ": ",
                       ec.message()));
    }
  }
  return first;
}

namespace {

// Reads one file of the manifest and checks it against its entry.
absl::StatusOr<CheckpointFileContents> ReadListedFile(
    const std::string& dir, const proto::CheckpointManifest& m,
    const proto::CheckpointFileInfo& f) {
  const std::string path = absl::StrCat(dir, "/", f.name());
  auto c = ReadCheckpointFile(path);
  if (!c.ok()) {
    // A listed file that is gone is lost data, not a missing checkpoint.
    if (absl::IsNotFound(c.status())) {
      return absl::DataLossError(c.status().message());
    }
    return c.status();
  }
  if (c->bytes != f.bytes() || c->crc32 != f.crc32()) {
    return Corrupt(path, absl::StrCat("does not match the manifest (",
                                      c->bytes, " bytes, crc ", c->crc32,
                                      "; manifest: ", f.bytes(), " bytes, crc ",
                                      f.crc32(), ")"));
  }
  if (c->header.checkpoint_id() != m.checkpoint_id() ||
      c->header.server_id() != f.server_id() ||
      c->header.table_id() != f.table_id()) {
    return Corrupt(path, absl::StrCat("belongs to checkpoint ",
                                      c->header.checkpoint_id(), " server ",
                                      c->header.server_id(), " table ",
                                      c->header.table_id(), ", not to this one"));
  }
  return c;
}

}  // namespace

absl::Status VerifyCheckpoint(const std::string& dir, int64_t* keys) {
  PS_ASSIGN_OR_RETURN(proto::CheckpointManifest m, ReadManifest(dir));
  int64_t total = 0;
  for (const proto::CheckpointFileInfo& f : m.files()) {
    PS_ASSIGN_OR_RETURN(CheckpointFileContents c, ReadListedFile(dir, m, f));
    total += c.header.keys();
  }
  if (keys != nullptr) *keys = total;
  return absl::OkStatus();
}

absl::Status RestoreCheckpoint(const std::string& dir, int server_id,
                               const Routing& routing,
                               const std::vector<std::unique_ptr<Table>>& tables,
                               RestoreStats* stats) {
  PS_ASSIGN_OR_RETURN(proto::CheckpointManifest m, ReadManifest(dir));
  RestoreStats st;
  std::vector<std::string> names;
  for (const proto::CheckpointFileInfo& f : m.files()) {
    PS_ASSIGN_OR_RETURN(CheckpointFileContents c, ReadListedFile(dir, m, f));
    const std::string path = absl::StrCat(dir, "/", f.name());
    const proto::CheckpointHeader& h = c.header;
    if (h.table_id() < 0 || h.table_id() >= static_cast<int>(tables.size())) {
      return Corrupt(path, absl::StrCat("table ", h.table_id(),
                                        " is not a table of this job"));
    }
    Table& table = *tables[h.table_id()];
    const std::string want = OptimizerProto(table.spec().optimizer).name();
    if (h.dim() != table.dim() ||
        h.state_floats() != table.optimizer().state_floats() ||
        h.optimizer().name() != want) {
      return Corrupt(path, absl::StrCat(
                               "table ", h.table_id(), " has dim ", h.dim(),
                               " and optimizer ", h.optimizer().name(),
                               " there; this job's has dim ", table.dim(),
                               " and optimizer ", want));
    }
    const size_t entry = table.entry_floats();
    int64_t loaded = 0;
    // Keys are ascending, so each range's keys form runs; import run by run.
    size_t i = 0;
    while (i < c.keys.size()) {
      const int range = routing.RangeOf(c.keys[i]);
      size_t j = i + 1;
      while (j < c.keys.size() && routing.RangeOf(c.keys[j]) == range) ++j;
      // A backup holds its ranges too (replication, issue 9).
      if (routing.OwnerOfRange(range) == server_id ||
          routing.IsBackupOf(range, server_id)) {
        table.ImportRange(range,
                          absl::MakeConstSpan(c.keys.data() + i, j - i),
                          c.entries.data() + i * entry);
        loaded += static_cast<int64_t>(j - i);
      }
      i = j;
    }
    ++st.files;
    st.keys_read += h.keys();
    st.keys_loaded += loaded;
    names.push_back(absl::StrCat(f.name(), " (", loaded, " of ", h.keys(),
                                 " keys)"));
  }
  PS_LOG_INFO("S[{}] restored checkpoint {} from {}: {} keys of {} in {} "
              "files: {}",
              server_id, m.checkpoint_id(), dir, st.keys_loaded, st.keys_read,
              st.files, absl::StrJoin(names, ", "));
  if (stats != nullptr) *stats = st;
  return absl::OkStatus();
}

}  // namespace ps
