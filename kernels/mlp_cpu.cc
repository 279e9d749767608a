// The CPU MLP backend: plain loops, activations and sums in double (so the
// finite-difference gradient check is meaningful), results rounded to float.
// Also the shape/batch checks and the backend factory.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/mlp.h"

namespace ps {

absl::Status ValidateMlpShape(const MlpShape& shape) {
  if (shape.num_fields < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpShape.num_fields must be >= 1, got ", shape.num_fields));
  }
  if (shape.embedding_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpShape.embedding_dim must be >= 1, got ", shape.embedding_dim));
  }
  for (size_t i = 0; i < shape.hidden.size(); ++i) {
    if (shape.hidden[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MlpShape.hidden[", i, "] must be >= 1, got ", shape.hidden[i]));
    }
  }
  if (!(shape.dropout >= 0.0f && shape.dropout < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpShape.dropout must be in [0, 1), got ", shape.dropout));
  }
  return absl::OkStatus();
}

absl::Status ValidateMlpBatch(const MlpShape& shape, const MlpBatch& batch) {
  if (absl::Status s = ValidateMlpShape(shape); !s.ok()) return s;
  const size_t want = batch.rows() * static_cast<size_t>(shape.num_fields);
  if (batch.slots.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpBatch: ", batch.rows(), " rows x ", shape.num_fields,
        " fields need ", want, " slots, got ", batch.slots.size()));
  }
  for (size_t k = 0; k < batch.slots.size(); ++k) {
    if (batch.slots[k] >= batch.num_embeddings()) {
      return absl::InvalidArgumentError(
          absl::StrCat("MlpBatch: slot ", batch.slots[k], " at ", k,
                       " out of range (", batch.num_embeddings(), " keys)"));
    }
  }
  for (size_t b = 0; b < batch.rows(); ++b) {
    if (batch.labels[b] != 0.0f && batch.labels[b] != 1.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MlpBatch: label of row ", b, " is ", batch.labels[b], ", not 0 or 1"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMlpSizes(const MlpShape& shape, const MlpBatch& batch,
                           const MlpParams& params, const MlpGrads* grads) {
  if (absl::Status s = ValidateMlpBatch(shape, batch); !s.ok()) return s;
  const size_t emb = batch.num_embeddings() * shape.embedding_dim;
  const size_t layers = shape.num_layers();
  auto mismatch = [](const char* what, size_t want, size_t got) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP ", what, ": expected ", want, " floats, got ", got));
  };
  if (params.emb.size() != emb) return mismatch("params.emb", emb, params.emb.size());
  if (params.layers.size() != layers) {
    return mismatch("params.layers (count)", layers, params.layers.size());
  }
  for (size_t l = 0; l < layers; ++l) {
    if (params.layers[l].size() != shape.layer_floats(l)) {
      return mismatch("params.layers[l]", shape.layer_floats(l),
                      params.layers[l].size());
    }
  }
  if (!params.logit_offset.empty() && params.logit_offset.size() != batch.rows()) {
    return mismatch("params.logit_offset", batch.rows(),
                    params.logit_offset.size());
  }
  if (grads != nullptr) {
    if (!grads->logit.empty() && grads->logit.size() != batch.rows()) {
      return mismatch("grads.logit", batch.rows(), grads->logit.size());
    }
    if (grads->emb.size() != emb) return mismatch("grads.emb", emb, grads->emb.size());
    if (grads->layers.size() != layers) {
      return mismatch("grads.layers (count)", layers, grads->layers.size());
    }
    for (size_t l = 0; l < layers; ++l) {
      if (grads->layers[l].size() != shape.layer_floats(l)) {
        return mismatch("grads.layers[l]", shape.layer_floats(l),
                        grads->layers[l].size());
      }
    }
  }
  return absl::OkStatus();
}

namespace {

class CpuMlpBackend final : public MlpBackend {
 public:
  std::string name() const override { return "cpu"; }

  absl::Status Gradient(const MlpShape& shape, const MlpBatch& batch,
                        const MlpParams& params, const MlpGrads& grads,
                        double* loss_sum) override {
    if (absl::Status s = CheckMlpSizes(shape, batch, params, &grads); !s.ok()) {
      return s;
    }
    Forward(shape, batch, params, /*train=*/true);
    const int L = shape.num_layers();
    const size_t B = batch.rows();
    const double inv_keep = 1.0 / (1.0 - shape.dropout);
    // Output: d loss / d logit = sigmoid(z) - y.
    double loss = 0;
    std::vector<double>& logits = act_[L];
    delta_.assign(B, 0.0);
    for (size_t b = 0; b < B; ++b) {
      const double z = logits[b];
      loss += LogisticLoss(z, batch.labels[b]);
      delta_[b] = StableSigmoid(z) - batch.labels[b];
      if (!grads.logit.empty()) grads.logit[b] = static_cast<float>(delta_[b]);
    }
    // Backward, layer by layer: delta_ holds d loss / d pre-activation.
    for (int l = L - 1; l >= 0; --l) {
      const int in = shape.fan_in(l), out = shape.fan_out(l);
      const float* W = params.layers[l].data();
      const std::vector<double>& a = act_[l];  // layer input, B x in
      gw_.assign(shape.layer_floats(l), 0.0);
      da_.assign(B * in, 0.0);
      for (size_t b = 0; b < B; ++b) {
        const double* ab = a.data() + b * in;
        double* dab = da_.data() + b * in;
        for (int o = 0; o < out; ++o) {
          const double d = delta_[b * out + o];
          if (d == 0.0) continue;
          double* g = gw_.data() + static_cast<size_t>(o) * (in + 1);
          const float* w = W + static_cast<size_t>(o) * (in + 1);
          for (int i = 0; i < in; ++i) {
            g[i] += d * ab[i];
            dab[i] += d * static_cast<double>(w[i]);
          }
          g[in] += d;
        }
      }
      float* gout = grads.layers[l].data();
      for (size_t k = 0; k < gw_.size(); ++k) gout[k] = static_cast<float>(gw_[k]);
      if (l > 0) {
        // Through the dropout and ReLU of layer l-1: output > 0 <=> the
        // unit was kept and its pre-activation > 0, and then
        // output = pre-activation * inv_keep.
        delta_.assign(B * in, 0.0);
        for (size_t k = 0; k < B * in; ++k) {
          delta_[k] = a[k] > 0.0 ? da_[k] * inv_keep : 0.0;
        }
      }
    }
    // da_ is now d loss / d input: scatter into the embedding rows.
    const int F = shape.num_fields, d = shape.embedding_dim;
    gemb_.assign(grads.emb.size(), 0.0);
    for (size_t b = 0; b < B; ++b) {
      for (int f = 0; f < F; ++f) {
        const size_t row = batch.slots[b * F + f];
        const double* src = da_.data() + b * F * d + static_cast<size_t>(f) * d;
        double* dst = gemb_.data() + row * d;
        for (int k = 0; k < d; ++k) dst[k] += src[k];
      }
    }
    for (size_t k = 0; k < gemb_.size(); ++k) {
      grads.emb[k] = static_cast<float>(gemb_[k]);
    }
    if (loss_sum != nullptr) *loss_sum = loss;
    return absl::OkStatus();
  }

  absl::Status Predict(const MlpShape& shape, const MlpBatch& batch,
                       const MlpParams& params, absl::Span<float> prob) override {
    if (absl::Status s = CheckMlpSizes(shape, batch, params, nullptr); !s.ok()) {
      return s;
    }
    if (prob.size() != batch.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MLP Predict: ", batch.rows(), " rows but prob has ", prob.size()));
    }
    Forward(shape, batch, params, /*train=*/false);
    const std::vector<double>& logits = act_[shape.num_layers()];
    for (size_t b = 0; b < batch.rows(); ++b) {
      prob[b] = static_cast<float>(StableSigmoid(logits[b]));
    }
    return absl::OkStatus();
  }

 private:
  // act_[0] = gathered embeddings (B x input_dim); act_[l+1] = output of
  // layer l (after ReLU for hidden layers; for the last, the logit plus
  // params.logit_offset).
  void Forward(const MlpShape& shape, const MlpBatch& batch,
               const MlpParams& params, bool train) {
    const bool drop = train && shape.dropout > 0.0f;
    const double inv_keep = 1.0 / (1.0 - shape.dropout);
    const int L = shape.num_layers();
    const size_t B = batch.rows();
    const int F = shape.num_fields, d = shape.embedding_dim;
    act_.resize(L + 1);
    act_[0].resize(B * shape.input_dim());
    for (size_t b = 0; b < B; ++b) {
      for (int f = 0; f < F; ++f) {
        const float* src = params.emb.data() + batch.slots[b * F + f] * d;
        double* dst = act_[0].data() + b * F * d + static_cast<size_t>(f) * d;
        for (int k = 0; k < d; ++k) dst[k] = src[k];
      }
    }
    for (int l = 0; l < L; ++l) {
      const int in = shape.fan_in(l), out = shape.fan_out(l);
      const float* W = params.layers[l].data();
      const bool relu = l < L - 1;
      std::vector<double>& y = act_[l + 1];
      y.resize(B * out);
      for (size_t b = 0; b < B; ++b) {
        const double* x = act_[l].data() + b * in;
        for (int o = 0; o < out; ++o) {
          const float* w = W + static_cast<size_t>(o) * (in + 1);
          double z = w[in];
          for (int i = 0; i < in; ++i) z += static_cast<double>(w[i]) * x[i];
          y[b * out + o] = relu ? std::max(z, 0.0) : z;
        }
      }
      if (drop && relu) {
        for (size_t k = 0; k < B * out; ++k) {
          y[k] = DropoutUniform(batch.seed, l, k) >= shape.dropout
                     ? y[k] * inv_keep
                     : 0.0;
        }
      }
    }
    if (!params.logit_offset.empty()) {
      for (size_t b = 0; b < B; ++b) act_[L][b] += params.logit_offset[b];
    }
  }

  std::vector<std::vector<double>> act_;
  std::vector<double> delta_, da_, gw_, gemb_;
};

}  // namespace

std::unique_ptr<MlpBackend> CreateCpuMlpBackend() {
  return std::make_unique<CpuMlpBackend>();
}

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateMlpBackend(
    const std::string& name) {
  if (name == "cpu") return CreateCpuMlpBackend();
  if (name == "cuda" || name == "auto") {
    absl::StatusOr<std::unique_ptr<MlpBackend>> cuda = CreateCudaMlpBackend();
    if (cuda.ok() || name == "cuda") return cuda;
    return CreateCpuMlpBackend();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown MLP backend '", name, "' (expected cpu, cuda or auto)"));
}

}  // namespace ps
