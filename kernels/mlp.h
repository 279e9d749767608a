// A dense click-through-rate model: per-field embeddings, concatenated, then
// a multi-layer perceptron with ReLU hidden layers and one logistic output.
// Forward/backward on the CPU (plain loops, kernels/mlp_cpu.cc) or on a GPU
// (cuBLAS GEMMs, cuDNN activations, embedding gather/scatter kernels;
// kernels/mlp_cuda.cc). No CUDA types here.
//
// Parameter layout (the parameter-server tables of models/wide_deep.h use
// exactly these blocks):
//  * embeddings: one row of `embedding_dim` floats per (field, value) key;
//  * layer l (0 .. num_layers()-1): fan_out(l) rows of fan_in(l)+1 floats,
//    row o = [W[o][0] ... W[o][fan_in-1], bias[o]] (row-major, bias last).
// Layer 0 reads the concatenated embeddings (num_fields * embedding_dim
// inputs), hidden layer widths are `hidden`, the last layer has one output:
// the logit. Every hidden layer is followed by ReLU, and in Gradient (never
// in Predict) by inverted dropout: unit o of row b in hidden layer l is kept
// iff DropoutUniform(batch.seed, l, b * width + o) >= dropout, and a kept
// unit is scaled by 1 / (1 - dropout). The mask is a pure function of its
// arguments, so the CPU and CUDA backends drop the same units.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dropout.h"

namespace ps {

struct MlpShape {
  int num_fields = 39;
  int embedding_dim = 8;
  std::vector<int> hidden = {256, 128};
  float dropout = 0.0f;  // share of hidden units dropped in Gradient, [0, 1)

  int input_dim() const { return num_fields * embedding_dim; }
  int num_layers() const { return static_cast<int>(hidden.size()) + 1; }
  int fan_in(int l) const { return l == 0 ? input_dim() : hidden[l - 1]; }
  int fan_out(int l) const {
    return l == num_layers() - 1 ? 1 : hidden[l];
  }
  // Floats of layer l's block: fan_out * (fan_in + 1).
  size_t layer_floats(int l) const {
    return static_cast<size_t>(fan_out(l)) * (fan_in(l) + 1);
  }
};

// OK, or INVALID_ARGUMENT naming the bad field: num_fields, embedding_dim
// and every hidden width must be >= 1, dropout in [0, 1).
absl::Status ValidateMlpShape(const MlpShape& shape);


// A minibatch: row b's field f uses embedding row slots[b * num_fields + f]
// of the batch's unique keys (keys ascending; slot j <-> keys[j]).
struct MlpBatch {
  std::vector<uint64_t> keys;    // unique embedding keys, ascending
  std::vector<uint32_t> slots;   // rows * num_fields entries, each < keys.size()
  std::vector<float> labels;     // 0 or 1 per row
  uint64_t seed = 0;             // picks the dropout mask (MlpShape::dropout)

  size_t rows() const { return labels.size(); }
  size_t num_embeddings() const { return keys.size(); }
  void Clear() {
    keys.clear();
    slots.clear();
    labels.clear();
  }
};

// OK, or INVALID_ARGUMENT saying what is wrong (slot count, a slot out of
// range, a label other than 0/1).
absl::Status ValidateMlpBatch(const MlpShape& shape, const MlpBatch& batch);

// Read-only parameters: emb has num_embeddings * embedding_dim floats (row
// j for keys[j]); layers[l] has layer_floats(l) floats.
struct MlpParams {
  absl::Span<const float> emb;
  std::vector<absl::Span<const float>> layers;
  // Optional, empty or rows() floats: added to row b's logit before the
  // sigmoid. The "wide" part of a wide & deep model (a linear model over the
  // same keys, models/wide_deep.h) enters the network here.
  absl::Span<const float> logit_offset;
};
// Gradient outputs, same sizes as MlpParams; overwritten.
struct MlpGrads {
  absl::Span<float> emb;
  std::vector<absl::Span<float>> layers;
  // Optional, empty or rows() floats: d loss / d logit of row b
  // (= sigmoid(logit) - label), from which the caller forms the gradient of
  // whatever produced logit_offset.
  absl::Span<float> logit;
};

// One device. Not thread-safe (scratch buffers are reused between calls).
class MlpBackend {
 public:
  virtual ~MlpBackend() = default;
  virtual std::string name() const = 0;

  // The gradient of the SUM over rows of the log loss (not the mean; as
  // ComputeBackend::LogisticGradient), and *loss_sum (may be null).
  // Errors: INVALID_ARGUMENT for a bad shape, batch or a size mismatch;
  // INTERNAL for a device error.
  virtual absl::Status Gradient(const MlpShape& shape, const MlpBatch& batch,
                                const MlpParams& params, const MlpGrads& grads,
                                double* loss_sum) = 0;

  // prob[b] = sigmoid(logit of row b); prob has rows() entries. Errors as
  // Gradient.
  virtual absl::Status Predict(const MlpShape& shape, const MlpBatch& batch,
                               const MlpParams& params,
                               absl::Span<float> prob) = 0;
};

// Checks every size of params (and grads, when given) against shape/batch.
absl::Status CheckMlpSizes(const MlpShape& shape, const MlpBatch& batch,
                           const MlpParams& params, const MlpGrads* grads);

std::unique_ptr<MlpBackend> CreateCpuMlpBackend();
// UNAVAILABLE "no CUDA device found" / "built without CUDA support".
absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend();
// "cpu", "cuda" (UNAVAILABLE as above), "auto" (CUDA when usable, else
// CPU); INVALID_ARGUMENT for another name.
absl::StatusOr<std::unique_ptr<MlpBackend>> CreateMlpBackend(
    const std::string& name);

}  // namespace ps
