#include "worker/predict.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "models/logistic.h"
#include "server/table.h"

namespace ps {
namespace {

// The server id of a file named "table-<table>.server-<s>.bin", else -1.
int ServerOfShard(absl::string_view name, int table) {
  const std::string prefix = absl::StrCat("table-", table, ".server-");
  if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, ".bin")) {
    return -1;
  }
  int server = -1;
  if (name.empty() || !absl::SimpleAtoi(name, &server) || server < 0) return -1;
  return server;
}

// LIBSVM feature indices this large are taken for another data format's
// keys: a random key passes with probability 2^-16.
constexpr uint64_t kMaxLibsvmIndex = uint64_t{1} << 48;

}  // namespace

const float* SavedTable::Find(uint64_t key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : values.data() + size_t{it->second} * dim;
}

absl::StatusOr<SavedTable> LoadModel(const std::string& dir, int table) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model dir ", dir, ": not a folder (",
                     ec ? ec.message() : "no such folder", ")"));
  }
  std::vector<std::pair<int, std::string>> shards;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const int server =
        ServerOfShard(entry.path().filename().string(), table);
    if (server >= 0) shards.emplace_back(server, entry.path().string());
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot list model dir ", dir, ": ", ec.message()));
  }
  if (shards.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "model dir ", dir, " has no table-", table,
        ".server-<s>.bin file (the output.model_dir of a finished job holds "
        "one per server)"));
  }
  std::sort(shards.begin(), shards.end());

  SavedTable m;
  m.table = table;
  std::vector<uint32_t> file_of;  // per position in keys: the file, for errors
  for (auto& [server, path] : shards) {
    PS_ASSIGN_OR_RETURN(TableFile f, Table::ReadBinaryFile(path));
    if (f.table_id != table) {
      return absl::DataLossError(absl::StrCat(
          "model file ", path, " holds table ", f.table_id, ", not ", table));
    }
    if (m.dim == 0) m.dim = f.dim;
    if (f.dim != m.dim) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model file ", path, " has dim ", f.dim, " but ", m.files.front(),
          " has dim ", m.dim, ": files of different jobs in one folder"));
    }
    const size_t file_index = m.files.size();
    m.files.push_back(path);
    m.keys.reserve(m.keys.size() + f.records.size());
    m.values.reserve(m.values.size() + f.records.size() * m.dim);
    for (auto& [key, vals] : f.records) {
      const uint32_t pos = static_cast<uint32_t>(m.keys.size());
      auto [it, fresh] = m.index.emplace(key, pos);
      if (!fresh) {
        return absl::FailedPreconditionError(absl::StrCat(
            "key ", key, " is in both ", m.files[file_of[it->second]],
            " and ", path,
            ": the folder mixes the shards of two jobs (a job with fewer "
            "servers leaves an earlier job's higher-numbered files); train "
            "into an empty output.model_dir or remove the stale files"));
      }
      file_of.push_back(static_cast<uint32_t>(file_index));
      m.keys.push_back(key);
      m.values.insert(m.values.end(), vals.begin(), vals.end());
    }
    if (m.keys.size() > std::numeric_limits<uint32_t>::max()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "model dir ", dir, ": more than 2^32 keys in table ", table));
    }
  }
  // Keys ascending across files (each file is sorted; servers own disjoint
  // ranges that interleave).
  std::vector<uint32_t> order(m.keys.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return m.keys[a] < m.keys[b]; });
  std::vector<uint64_t> keys(order.size());
  std::vector<float> values(m.values.size());
  for (uint32_t i = 0; i < order.size(); ++i) {
    keys[i] = m.keys[order[i]];
    std::copy_n(m.values.begin() + size_t{order[i]} * m.dim, m.dim,
                values.begin() + size_t{i} * m.dim);
    m.index[keys[i]] = i;
  }
  m.keys = std::move(keys);
  m.values = std::move(values);
  return m;
}

absl::StatusOr<EvalMetrics> PredictRows(const SavedTable& model,
                                        RowReader* reader,
                                        ComputeBackend* backend,
                                        const PredictSink& sink) {
  if (model.dim != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", model.table, " has dim ", model.dim,
        ": predicting needs a logistic-regression model (dim 1)"));
  }
  return PredictLogistic(
      reader, backend,
      [&model](const CsrBatch& batch, std::vector<float>* w) {
        w->resize(batch.keys.size());
        for (size_t j = 0; j < batch.keys.size(); ++j) {
          const float* v = model.Find(batch.keys[j]);
          (*w)[j] = v == nullptr ? 0.0f : *v;
        }
        return absl::OkStatus();
      },
      sink);
}

absl::StatusOr<ExportFormat> ParseExportFormat(const std::string& name) {
  if (name == "keys") return ExportFormat::kKeys;
  if (name == "libsvm") return ExportFormat::kLibsvmIndex;
  return absl::InvalidArgumentError(absl::StrCat(
      "export format '", name, "': expected keys or libsvm"));
}

absl::Status ExportModel(const SavedTable& model, ExportFormat format,
                         const std::string& path) {
  const size_t dim = static_cast<size_t>(model.dim);
  // Lines in output order: (sort key, position in model.keys).
  std::vector<std::pair<uint64_t, uint32_t>> rows;
  bool has_bias = false;
  uint32_t bias_pos = 0;
  const uint64_t bias = BiasKey();
  for (uint32_t i = 0; i < model.keys.size(); ++i) {
    const float* v = model.values.data() + size_t{i} * dim;
    if (std::all_of(v, v + dim, [](float x) { return x == 0.0f; })) continue;
    const uint64_t key = model.keys[i];
    if (format == ExportFormat::kKeys) {
      rows.emplace_back(key, i);
      continue;
    }
    if (key == bias) {
      has_bias = true;
      bias_pos = i;
      continue;
    }
    const uint64_t feature = FeatureOf(key, 0);
    if (feature >= kMaxLibsvmIndex) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key ", key, " is not the key of a LIBSVM feature index (it would "
          "be index ", feature, "): the model was not trained on LIBSVM "
          "data; export it with format keys"));
    }
    rows.emplace_back(feature, i);
  }
  std::sort(rows.begin(), rows.end());

  const std::string temp = path + ".partial";
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", temp, ": ", std::strerror(errno)));
  }
  std::string line;
  char num[64];
  auto append_values = [&](uint32_t pos) {
    const float* v = model.values.data() + size_t{pos} * dim;
    for (size_t j = 0; j < dim; ++j) {
      line.push_back(j == 0 ? '\t' : ' ');
      auto r = std::to_chars(num, num + sizeof(num), v[j]);
      line.append(num, r.ptr);
    }
    line.push_back('\n');
  };
  bool ok = true;
  if (has_bias) {
    line = "bias";
    append_values(bias_pos);
    ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  }
  for (size_t i = 0; ok && i < rows.size(); ++i) {
    line.clear();
    auto r = std::to_chars(num, num + sizeof(num), rows[i].first);
    line.append(num, r.ptr);
    append_values(rows[i].second);
    ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  }
  int write_errno = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    write_errno = errno;
  }
  if (!ok) {
    std::remove(temp.c_str());
    return absl::UnavailableError(absl::StrCat(
        "cannot write ", temp, ": ", std::strerror(write_errno)));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    return absl::UnavailableError(absl::StrCat(
        "cannot rename ", temp, " to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace ps
