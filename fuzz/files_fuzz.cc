// Fuzz target for the files a job reads back (issue 9): a server's
// checkpoint file (server/checkpoint.h), the scheduler's state file
// (scheduler/state_file.h) and a saved table (Table::ReadBinaryFile, what
// ps_predict loads). Byte 0 picks the reader (byte % 3: checkpoint, state
// file, table file); bit 4: the harness writes the right CRC-32s (a
// checkpoint's last 4 bytes, each state file slot's), so that inputs get
// past the checksums to the header and key checks; bit 5: the table a
// checkpoint is restored into uses the dense-id layout. The rest is the
// file.
//
// Checks, besides "no crash, no sanitizer report":
//   * every refusal is DATA_LOSS (INVALID_ARGUMENT or UNIMPLEMENTED for a
//     table file that is not one, or of another version), never a partial
//     result;
//   * an accepted checkpoint file has strictly ascending keys, as many as
//     its header says, and an entry of dim * (1 + state floats) floats
//     each; restored (through a MANIFEST that lists it, into a table made
//     as its header says, on one server that owns every range), it loads
//     every key, and each key's pulled value is the file's, bit for bit;
//     a table whose optimizer keeps another number of state floats than
//     the header says is refused with DATA_LOSS;
//   * an accepted state file's payload fits in the file;
//   * an accepted table file holds records of its dim.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <zlib.h>

#include "common/config.h"
#include "common/logging.h"
#include "common/routing.h"
#include "fuzz/fuzz_util.h"
#include "scheduler/state_file.h"
#include "server/checkpoint.h"
#include "server/table.h"

namespace ps::fuzz {
namespace {

// One folder for every input of this process (a checkpoint is a folder).
const std::string& Dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/ps_fuzz_files_XXXXXX";
    PS_FUZZ_CHECK(::mkdtemp(d.data()) != nullptr);
    return d;
  }();
  static const bool cleanup = (std::atexit([] {
                                 std::error_code ec;
                                 std::filesystem::remove_all(Dir(), ec);
                               }),
                               true);
  (void)cleanup;
  return dir;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  PS_FUZZ_CHECK(f != nullptr);
  PS_FUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) ==
                bytes.size());
  PS_FUZZ_CHECK(std::fclose(f) == 0);
}

void CheckpointFile(std::string bytes, bool fix_crc, bool dense) {
  if (fix_crc && bytes.size() >= 4) {
    const uint32_t crc = static_cast<uint32_t>(
        ::crc32(::crc32(0, nullptr, 0),
                reinterpret_cast<const Bytef*>(bytes.data()),
                static_cast<uInt>(bytes.size() - 4)));
    std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  }
  const std::string dir = Dir();
  const std::string name = CheckpointFileName(0, 0);
  const std::string path = dir + "/" + name;
  ::unlink((dir + "/" + kCheckpointManifestName).c_str());
  WriteFile(path, bytes);
  absl::StatusOr<CheckpointFileContents> c = ReadCheckpointFile(path);
  if (!c.ok()) {
    PS_FUZZ_CHECK(c.status().code() == absl::StatusCode::kDataLoss);
    return;
  }
  const proto::CheckpointHeader& h = c->header;
  const size_t n = c->keys.size();
  PS_FUZZ_CHECK(static_cast<int64_t>(n) == h.keys());
  for (size_t i = 1; i < n; ++i) PS_FUZZ_CHECK(c->keys[i - 1] < c->keys[i]);
  const size_t entry = static_cast<size_t>(h.dim()) *
                       (1 + static_cast<size_t>(h.state_floats()));
  PS_FUZZ_CHECK(c->entries.size() == n * entry);
  PS_FUZZ_CHECK(c->bytes == static_cast<int64_t>(bytes.size()));

  // Restored through a manifest that lists it, into the table its header
  // describes (when the header's optimizer is one a table can have).
  TableSpec spec;
  spec.id = 0;
  spec.dim = h.dim();
  spec.optimizer = OptimizerFromProto(h.optimizer());
  spec.dense_ids = dense ? 4096 : 0;
  absl::StatusOr<Routing> routing = Routing::FromProto(
      BuildHashRing({0}, /*vnodes=*/4, /*epoch=*/1));
  PS_FUZZ_CHECK(routing.ok());
  absl::StatusOr<std::unique_ptr<Table>> table =
      Table::Create(spec, routing->num_ranges());
  if (!table.ok()) return;  // no job could have this table
  std::vector<std::unique_ptr<Table>> tables;
  tables.push_back(std::move(*table));
  proto::CheckpointManifest m;
  m.set_checkpoint_id(h.checkpoint_id());
  m.set_num_servers(1);
  proto::CheckpointFileInfo* f = m.add_files();
  f->set_name(name);
  f->set_server_id(h.server_id());
  f->set_table_id(h.table_id());
  f->set_keys(h.keys());
  f->set_bytes(c->bytes);
  f->set_crc32(c->crc32);
  PS_FUZZ_CHECK(WriteManifest(dir, m).ok());
  RestoreStats stats;
  const absl::Status s = RestoreCheckpoint(dir, 0, *routing, tables, &stats);
  const Table& t = *tables[0];
  const bool fits = h.table_id() == 0 &&
                    h.state_floats() == t.optimizer().state_floats() &&
                    h.optimizer().name() ==
                        OptimizerProto(t.spec().optimizer).name();
  if (!fits) {
    PS_FUZZ_CHECK(s.code() == absl::StatusCode::kDataLoss);
    return;
  }
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  PS_FUZZ_CHECK(s.ok());
  PS_FUZZ_CHECK(stats.keys_loaded == h.keys());
  const size_t dim = static_cast<size_t>(h.dim());
  std::vector<float> got(dim);
  for (size_t i = 0; i < n; ++i) {
    t.Pull(routing->RangeOf(c->keys[i]), absl::MakeConstSpan(&c->keys[i], 1),
           got.data());
    PS_FUZZ_CHECK(std::memcmp(got.data(), c->entries.data() + i * entry,
                              dim * sizeof(float)) == 0);
  }
}

// The CRC-32 of each slot that has a whole payload, written in place (as
// for a checkpoint's fix_crc).
void FixStateCrcs(std::string* file) {
  if (file->size() < StateFile::kHeaderBytes) return;
  uint64_t capacity;
  std::memcpy(&capacity, file->data() + 8, 8);
  if (capacity < StateFile::kSlotHeaderBytes) return;
  for (uint64_t slot = 0; slot < 2; ++slot) {
    if (slot > (file->size() - StateFile::kHeaderBytes) / capacity) return;
    const uint64_t at = StateFile::kHeaderBytes + slot * capacity;
    if (file->size() - at < StateFile::kSlotHeaderBytes) return;
    char* p = file->data() + at;
    uint64_t len;
    std::memcpy(&len, p + 8, 8);
    if (len > file->size() - at - StateFile::kSlotHeaderBytes) continue;
    uLong crc = ::crc32(0L, reinterpret_cast<const Bytef*>(p), 16);
    crc = ::crc32_z(
        crc, reinterpret_cast<const Bytef*>(p + StateFile::kSlotHeaderBytes),
        len);
    const uint32_t c = static_cast<uint32_t>(crc);
    std::memcpy(p + 16, &c, 4);
  }
}

void StateFileBytes(std::string bytes, bool fix_crc) {
  if (fix_crc) FixStateCrcs(&bytes);
  const std::string path = Dir() + "/scheduler.state";
  WriteFile(path, bytes);
  absl::StatusOr<std::string> r = StateFile::Read(path);
  if (!r.ok()) {
    PS_FUZZ_CHECK(r.status().code() == absl::StatusCode::kDataLoss);
    return;
  }
  PS_FUZZ_CHECK(r->size() + StateFile::kHeaderBytes +
                    StateFile::kSlotHeaderBytes <=
                bytes.size());
}

void TableFileBytes(const std::string& bytes) {
  const std::string path = Dir() + "/table-0.server-0.bin";
  WriteFile(path, bytes);
  absl::StatusOr<TableFile> r = Table::ReadBinaryFile(path);
  if (!r.ok()) {
    const absl::StatusCode code = r.status().code();
    PS_FUZZ_CHECK(code == absl::StatusCode::kDataLoss ||
                  code == absl::StatusCode::kInvalidArgument ||
                  code == absl::StatusCode::kUnimplemented);
    return;
  }
  PS_FUZZ_CHECK(r->dim >= 1);
  for (const auto& [key, vals] : r->records) {
    PS_FUZZ_CHECK(vals.size() == static_cast<size_t>(r->dim));
  }
}

}  // namespace

int Files(const uint8_t* data, size_t size) {
  static bool quiet = (InitLogging("fuzz", "off"), true);
  (void)quiet;
  if (size < 1) return 0;
  const uint8_t how = data[0];
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (how % 3) {
    case 0:
      CheckpointFile(bytes, (how & 0x10) != 0, (how & 0x20) != 0);
      break;
    case 1:
      StateFileBytes(bytes, (how & 0x10) != 0);
      break;
    default:
      TableFileBytes(bytes);
      break;
  }
  return 0;
}

}  // namespace ps::fuzz
