// The CUDA MLP backend: cuBLAS SGEMMs for the layers, cuDNN ReLU
// (cudnnActivationForward/Backward), and the kernels of mlp_cuda.cu for the
// embedding gather/scatter, biases and the logistic head. One stream; each
// call is synchronous.
//
// Dropout (training only) multiplies each hidden layer's ReLU output in
// place by its mask / (1 - rate), and the gradient arriving at that output
// by the same before the ReLU backward; cuDNN's ReLU backward then sees a
// dropped unit's y = 0 and dy = 0.
//
// Row-major matrices are handed to column-major cuBLAS as their transposes:
// activations A (B x in, row-major) are the column-major in x B matrix A^T;
// a layer block (out x (in+1), row-major, bias last) is the column-major
// (in+1) x out matrix whose first `in` rows are W^T (leading dim in+1). So
//   Z^T  = W    A^T :  gemm(T, N, m=out, n=B, k=in, W, lda=in+1, A, ldb=in)
//   dA^T = W^T dZ^T :  gemm(N, N, m=in,  n=B, k=out, W, lda=in+1, dZ, ldb=out)
//   dW^T = A^T  dZ  :  gemm(N, T, m=in,  n=out, k=B, A, lda=in, dZ, ldb=out),
//                      written with ldc=in+1 so the bias slot is skipped.
// cuBLAS's default math mode keeps FP32 GEMMs in FP32 (no TF32), which the
// CPU parity tests rely on.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_internal.h"
#include "kernels/cuda_util.h"
#include "kernels/mlp.h"

namespace ps {
namespace {

using cuda_internal::DeviceBuffer;

absl::Status CublasError(cublasStatus_t s, const char* what) {
  return absl::InternalError(absl::StrCat("cuBLAS ", what, ": status ",
                                          static_cast<int>(s)));
}
absl::Status CudnnError(cudnnStatus_t s, const char* what) {
  return absl::InternalError(
      absl::StrCat("cuDNN ", what, ": ", cudnnGetErrorString(s)));
}

#define PS_CUBLAS_RETURN(expr, what)                                   \
  do {                                                                 \
    cublasStatus_t ps_cb_ = (expr);                                    \
    if (ps_cb_ != CUBLAS_STATUS_SUCCESS) return CublasError(ps_cb_, what); \
  } while (0)
#define PS_CUDNN_RETURN(expr, what)                                   \
  do {                                                                \
    cudnnStatus_t ps_cd_ = (expr);                                    \
    if (ps_cd_ != CUDNN_STATUS_SUCCESS) return CudnnError(ps_cd_, what); \
  } while (0)

class CudaMlpBackend final : public MlpBackend {
 public:
  ~CudaMlpBackend() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (act_desc_ != nullptr) cudnnDestroyActivationDescriptor(act_desc_);
    if (tensor_desc_ != nullptr) cudnnDestroyTensorDescriptor(tensor_desc_);
    if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    PS_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                   "cudaStreamCreate");
    PS_CUBLAS_RETURN(cublasCreate(&cublas_), "cublasCreate");
    PS_CUBLAS_RETURN(cublasSetStream(cublas_, stream_), "cublasSetStream");
    PS_CUDNN_RETURN(cudnnCreate(&cudnn_), "cudnnCreate");
    PS_CUDNN_RETURN(cudnnSetStream(cudnn_, stream_), "cudnnSetStream");
    PS_CUDNN_RETURN(cudnnCreateTensorDescriptor(&tensor_desc_),
                    "cudnnCreateTensorDescriptor");
    PS_CUDNN_RETURN(cudnnCreateActivationDescriptor(&act_desc_),
                    "cudnnCreateActivationDescriptor");
    PS_CUDNN_RETURN(cudnnSetActivationDescriptor(act_desc_,
                                                 CUDNN_ACTIVATION_RELU,
                                                 CUDNN_NOT_PROPAGATE_NAN, 0.0),
                    "cudnnSetActivationDescriptor");
    return absl::OkStatus();
  }

  std::string name() const override { return "cuda"; }

  absl::Status Gradient(const MlpShape& shape, const MlpBatch& batch,
                        const MlpParams& params, const MlpGrads& grads,
                        double* loss_sum) override {
    PS_RETURN_IF_ERROR(CheckMlpSizes(shape, batch, params, &grads));
    PS_RETURN_IF_ERROR(Forward(shape, batch, params, /*train=*/true));
    const int L = shape.num_layers();
    const int64_t B = static_cast<int64_t>(batch.rows());
    PS_RETURN_IF_ERROR(d_row_loss_.Reserve(sizeof(double) * (B + 1)));
    PS_RETURN_IF_ERROR(d_loss_.Reserve(sizeof(double)));
    PS_CUDA_RETURN(cudaMemsetAsync(d_loss_.as<double>(), 0, sizeof(double),
                                   stream_),
                   "memset");
    // delta of the logit (B x 1) goes into dz_ of the last layer.
    PS_RETURN_IF_ERROR(d_dz_.Reserve(sizeof(float) * (MaxWidth(shape) * B + 1)));
    PS_RETURN_IF_ERROR(d_da_.Reserve(sizeof(float) * (MaxWidth(shape) * B + 1)));
    PS_CUDA_RETURN(cuda_internal::LaunchLogisticHead(
                       d_z_[L - 1].as<float>(), Offset(params),
                       d_labels_.as<float>(), B, d_dz_.as<float>(),
                       d_row_loss_.as<double>(), nullptr, stream_),
                   "logistic head");
    if (!grads.logit.empty() && B > 0) {
      // Before the backward pass below reuses d_dz_ (same stream: ordered).
      PS_CUDA_RETURN(cudaMemcpyAsync(grads.logit.data(), d_dz_.as<float>(),
                                     sizeof(float) * B, cudaMemcpyDeviceToHost,
                                     stream_),
                     "cudaMemcpy D2H");
    }
    PS_CUDA_RETURN(cuda_internal::LaunchSum(d_row_loss_.as<double>(), B,
                                            d_loss_.as<double>(), stream_),
                   "loss sum");
    const float one = 1.0f, zero = 0.0f;
    for (int l = L - 1; l >= 0; --l) {
      const int in = shape.fan_in(l), out = shape.fan_out(l);
      const float* a_in = l == 0 ? d_x_.as<float>() : d_a_[l - 1].as<float>();
      float* gw = d_gw_[l].as<float>();
      if (B > 0) {
        PS_CUBLAS_RETURN(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, in, out,
                                     static_cast<int>(B), &one, a_in, in,
                                     d_dz_.as<float>(), out, &zero, gw, in + 1),
                         "sgemm dW");
        PS_CUBLAS_RETURN(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, in,
                                     static_cast<int>(B), out, &one,
                                     d_w_[l].as<float>(), in + 1,
                                     d_dz_.as<float>(), out, &zero,
                                     d_da_.as<float>(), in),
                         "sgemm dA");
      } else {
        PS_CUDA_RETURN(cudaMemsetAsync(gw, 0, sizeof(float) * shape.layer_floats(l),
                                       stream_),
                       "memset");
      }
      PS_CUDA_RETURN(cuda_internal::LaunchBiasGrad(d_dz_.as<float>(), in, out, B,
                                                   gw, stream_),
                     "bias grad");
      if (l > 0 && B > 0) {
        if (shape.dropout > 0.0f) {
          // Back through layer l-1's dropout: the same mask and scale.
          PS_CUDA_RETURN(cuda_internal::LaunchDropout(
                             d_da_.as<float>(), B * in, l - 1, batch.seed,
                             shape.dropout, stream_),
                         "dropout backward");
        }
        // dZ_{l-1} = relu'(Z_{l-1}) * dA; written over dz_ (dz_ of layer l
        // is no longer needed once dA and dW are formed). A dropped unit
        // has dA = 0 already.
        PS_RETURN_IF_ERROR(SetTensor(B * in));
        PS_CUDNN_RETURN(cudnnActivationBackward(
                            cudnn_, act_desc_, &one, tensor_desc_,
                            d_a_[l - 1].as<float>(), tensor_desc_,
                            d_da_.as<float>(), tensor_desc_,
                            d_z_[l - 1].as<float>(), &zero, tensor_desc_,
                            d_dz_.as<float>()),
                        "cudnnActivationBackward");
      }
    }
    // d_da_ holds d loss / d X: scatter into the embedding rows.
    const size_t emb_floats = grads.emb.size();
    PS_RETURN_IF_ERROR(d_gemb_.Reserve(sizeof(float) * (emb_floats + 1)));
    PS_CUDA_RETURN(cudaMemsetAsync(d_gemb_.as<float>(), 0,
                                   sizeof(float) * emb_floats, stream_),
                   "memset");
    if (B > 0) {
      PS_CUDA_RETURN(cuda_internal::LaunchEmbeddingScatter(
                         d_da_.as<float>(), d_slots_.as<uint32_t>(), B,
                         shape.num_fields, shape.embedding_dim,
                         d_gemb_.as<float>(), stream_),
                     "embedding scatter");
    }
    // Results back.
    for (int l = 0; l < L; ++l) {
      PS_CUDA_RETURN(cudaMemcpyAsync(grads.layers[l].data(), d_gw_[l].as<float>(),
                                     sizeof(float) * shape.layer_floats(l),
                                     cudaMemcpyDeviceToHost, stream_),
                     "cudaMemcpy D2H");
    }
    if (emb_floats > 0) {
      PS_CUDA_RETURN(cudaMemcpyAsync(grads.emb.data(), d_gemb_.as<float>(),
                                     sizeof(float) * emb_floats,
                                     cudaMemcpyDeviceToHost, stream_),
                     "cudaMemcpy D2H");
    }
    double loss = 0;
    PS_CUDA_RETURN(cudaMemcpyAsync(&loss, d_loss_.as<double>(), sizeof(double),
                                   cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpy D2H");
    PS_CUDA_RETURN(cudaStreamSynchronize(stream_), "MLP gradient");
    if (loss_sum != nullptr) *loss_sum = loss;
    return absl::OkStatus();
  }

  absl::Status Predict(const MlpShape& shape, const MlpBatch& batch,
                       const MlpParams& params, absl::Span<float> prob) override {
    PS_RETURN_IF_ERROR(CheckMlpSizes(shape, batch, params, nullptr));
    if (prob.size() != batch.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MLP Predict: ", batch.rows(), " rows but prob has ", prob.size()));
    }
    PS_RETURN_IF_ERROR(Forward(shape, batch, params, /*train=*/false));
    const int64_t B = static_cast<int64_t>(batch.rows());
    PS_RETURN_IF_ERROR(d_prob_.Reserve(sizeof(float) * (B + 1)));
    PS_CUDA_RETURN(cuda_internal::LaunchLogisticHead(
                       d_z_[shape.num_layers() - 1].as<float>(), Offset(params),
                       d_labels_.as<float>(), B, nullptr, nullptr,
                       d_prob_.as<float>(), stream_),
                   "logistic head");
    if (B > 0) {
      PS_CUDA_RETURN(cudaMemcpyAsync(prob.data(), d_prob_.as<float>(),
                                     sizeof(float) * B, cudaMemcpyDeviceToHost,
                                     stream_),
                     "cudaMemcpy D2H");
    }
    PS_CUDA_RETURN(cudaStreamSynchronize(stream_), "MLP predict");
    return absl::OkStatus();
  }

 private:
  static int64_t MaxWidth(const MlpShape& shape) {
    int64_t w = shape.input_dim();
    for (int h : shape.hidden) w = std::max<int64_t>(w, h);
    return w;
  }

  // The device copy of params.logit_offset made by Forward, or null.
  const float* Offset(const MlpParams& params) {
    return params.logit_offset.empty() ? nullptr : d_offset_.as<float>();
  }

  absl::Status SetTensor(int64_t n) {
    PS_CUDNN_RETURN(cudnnSetTensor4dDescriptor(tensor_desc_, CUDNN_TENSOR_NCHW,
                                               CUDNN_DATA_FLOAT, 1,
                                               static_cast<int>(n), 1, 1),
                    "cudnnSetTensor4dDescriptor");
    return absl::OkStatus();
  }

  absl::Status Upload(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    PS_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                   stream_),
                   "cudaMemcpy H2D");
    return absl::OkStatus();
  }

  // Uploads the batch and parameters and runs the layers: d_z_[l] holds
  // layer l's pre-activation, d_a_[l] its ReLU output (hidden layers).
  absl::Status Forward(const MlpShape& shape, const MlpBatch& batch,
                       const MlpParams& params, bool train) {
    const int L = shape.num_layers();
    const int64_t B = static_cast<int64_t>(batch.rows());
    d_w_.resize(L);
    d_gw_.resize(L);
    d_z_.resize(L);
    d_a_.resize(L);
    PS_RETURN_IF_ERROR(d_emb_.Reserve(sizeof(float) * (params.emb.size() + 1)));
    PS_RETURN_IF_ERROR(d_slots_.Reserve(sizeof(uint32_t) * (batch.slots.size() + 1)));
    PS_RETURN_IF_ERROR(d_labels_.Reserve(sizeof(float) * (B + 1)));
    PS_RETURN_IF_ERROR(d_x_.Reserve(sizeof(float) * (B * shape.input_dim() + 1)));
    // The copies below read pageable host memory and may return before the
    // device has read it; the caller's buffers are only read, and every
    // call ends with a stream synchronise, so that is safe.
    PS_RETURN_IF_ERROR(Upload(d_emb_.as<void>(), params.emb.data(),
                              sizeof(float) * params.emb.size()));
    PS_RETURN_IF_ERROR(Upload(d_slots_.as<void>(), batch.slots.data(),
                              sizeof(uint32_t) * batch.slots.size()));
    PS_RETURN_IF_ERROR(
        Upload(d_labels_.as<void>(), batch.labels.data(), sizeof(float) * B));
    if (!params.logit_offset.empty()) {
      PS_RETURN_IF_ERROR(d_offset_.Reserve(sizeof(float) * (B + 1)));
      PS_RETURN_IF_ERROR(Upload(d_offset_.as<void>(), params.logit_offset.data(),
                                sizeof(float) * B));
    }
    for (int l = 0; l < L; ++l) {
      const size_t n = shape.layer_floats(l);
      PS_RETURN_IF_ERROR(d_w_[l].Reserve(sizeof(float) * n));
      PS_RETURN_IF_ERROR(d_gw_[l].Reserve(sizeof(float) * n));
      PS_RETURN_IF_ERROR(
          d_z_[l].Reserve(sizeof(float) * (B * shape.fan_out(l) + 1)));
      PS_RETURN_IF_ERROR(
          d_a_[l].Reserve(sizeof(float) * (B * shape.fan_out(l) + 1)));
      PS_RETURN_IF_ERROR(
          Upload(d_w_[l].as<void>(), params.layers[l].data(), sizeof(float) * n));
    }
    if (B == 0) return absl::OkStatus();
    PS_CUDA_RETURN(cuda_internal::LaunchEmbeddingGather(
                       d_emb_.as<float>(), d_slots_.as<uint32_t>(), B,
                       shape.num_fields, shape.embedding_dim, d_x_.as<float>(),
                       stream_),
                   "embedding gather");
    const float one = 1.0f, zero = 0.0f;
    for (int l = 0; l < L; ++l) {
      const int in = shape.fan_in(l), out = shape.fan_out(l);
      const float* a_in = l == 0 ? d_x_.as<float>() : d_a_[l - 1].as<float>();
      PS_CUBLAS_RETURN(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, out,
                                   static_cast<int>(B), in, &one,
                                   d_w_[l].as<float>(), in + 1, a_in, in, &zero,
                                   d_z_[l].as<float>(), out),
                       "sgemm forward");
      PS_CUDA_RETURN(cuda_internal::LaunchAddBias(d_w_[l].as<float>(), in, out,
                                                  B, d_z_[l].as<float>(),
                                                  stream_),
                     "add bias");
      if (l < L - 1) {
        PS_RETURN_IF_ERROR(SetTensor(B * out));
        PS_CUDNN_RETURN(cudnnActivationForward(cudnn_, act_desc_, &one,
                                               tensor_desc_, d_z_[l].as<float>(),
                                               &zero, tensor_desc_,
                                               d_a_[l].as<float>()),
                        "cudnnActivationForward");
        if (train && shape.dropout > 0.0f) {
          PS_CUDA_RETURN(cuda_internal::LaunchDropout(
                             d_a_[l].as<float>(), B * out, l, batch.seed,
                             shape.dropout, stream_),
                         "dropout");
        }
      }
    }
    return absl::OkStatus();
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cudnnTensorDescriptor_t tensor_desc_ = nullptr;
  cudnnActivationDescriptor_t act_desc_ = nullptr;

  DeviceBuffer d_emb_, d_slots_, d_labels_, d_x_, d_dz_, d_da_, d_gemb_,
      d_row_loss_, d_loss_, d_prob_, d_offset_;
  std::vector<DeviceBuffer> d_w_, d_gw_, d_z_, d_a_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend() {
  PS_RETURN_IF_ERROR(CudaDeviceAvailable());
  auto b = std::make_unique<CudaMlpBackend>();
  PS_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<MlpBackend>(std::move(b));
}

}  // namespace ps
