// Offline use of a trained model (ps_predict): loading the shards a job
// wrote to output.model_dir, predicting rows with them exactly as the job's
// final evaluation did, and exporting them for serving (docs/predict.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "data/data.h"
#include "data/metrics.h"
#include "kernels/backend.h"
#include "models/logistic.h"

namespace ps {

// One table of a saved model: every key any server stored, with its value.
struct SavedTable {
  int table = 0;
  int dim = 0;
  std::vector<std::string> files;  // the shards read, by server id
  std::vector<uint64_t> keys;      // ascending
  std::vector<float> values;       // dim floats per key, in keys' order

  size_t size() const { return keys.size(); }
  // The dim values of `key`, or nullptr when no server stored it (a key no
  // training row had: its value is the table's initial one, 0 for LR).
  const float* Find(uint64_t key) const;

  absl::flat_hash_map<uint64_t, uint32_t> index;  // key -> position in keys
};

// Reads table `table` of the model in `dir`: every file
// table-<table>.server-<s>.bin there (Table::SaveBinary's format; each
// server writes the keys it owned). Errors name the file: NOT_FOUND when
// `dir` does not exist or holds no such file; DATA_LOSS or INVALID_ARGUMENT
// for a truncated or corrupt one (Table::ReadBinaryFile); FAILED_PRECONDITION
// when two files disagree on the table's dim, or hold the same key (shards
// of two jobs in one folder: a job with fewer servers leaves an earlier
// job's higher-numbered files in place).
absl::StatusOr<SavedTable> LoadModel(const std::string& dir, int table = 0);

// Predicts every row `reader` yields with the logistic-regression model
// `model` (dim 1; a key it lacks weighs 0) and returns the metrics over all
// rows, through PredictLogistic (models/logistic.h), the job's own
// evaluation path: the same weights give the same probabilities bit for bit
// and the same AUC. A sink (PredictSink) error stops the pass and is
// returned. FAILED_PRECONDITION when model.dim != 1; reader errors as
// RowReader::Next.
absl::StatusOr<EvalMetrics> PredictRows(const SavedTable& model,
                                        RowReader* reader,
                                        ComputeBackend* backend,
                                        const PredictSink& sink);

// Export formats for serving (docs/predict.md).
enum class ExportFormat {
  // "<key>\t<v1> <v2> ... <vdim>" per key with a non-zero value, keys
  // ascending: any table, any data format (keys as common/hash.h computes
  // them from features).
  kKeys,
  // For LR models trained on LIBSVM data: "bias\t<w>" and then
  // "<feature index>\t<w>" per non-zero weight, indices ascending. Fails
  // (FAILED_PRECONDITION, naming a key) when a key is not the key of a
  // LIBSVM index, e.g. for a model trained on Criteo data.
  kLibsvmIndex,
};

// Parses "keys" / "libsvm"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ExportFormat> ParseExportFormat(const std::string& name);

// Writes `model` to `path` in `format`, atomically (a temporary file renamed
// into place); UNAVAILABLE naming the path on an IO error.
absl::Status ExportModel(const SavedTable& model, ExportFormat format,
                         const std::string& path);

}  // namespace ps
