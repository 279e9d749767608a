// CUDA kernels of the MLP backend that are not GEMMs or activations:
// embedding gather/scatter, bias add / bias gradient and the logistic head.
// The host side (cuBLAS, cuDNN, buffers) is kernels/mlp_cuda.cc.

#include <cstdint>

#include "kernels/cuda_internal.h"
#include "kernels/dropout.h"

namespace ps::cuda_internal {
namespace {

constexpr int kBlock = 256;

unsigned Grid(int64_t n) {
  int64_t blocks = (n + kBlock - 1) / kBlock;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535 * 16) blocks = 65535 * 16;
  return static_cast<unsigned>(blocks);
}

__global__ void GatherKernel(const float* __restrict__ emb,
                             const uint32_t* __restrict__ slots, int64_t rows,
                             int fields, int dim, float* __restrict__ x) {
  const int64_t n = rows * fields * dim;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < n; t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bf = t / dim;  // = b * fields + f
    const int k = static_cast<int>(t - bf * dim);
    x[t] = emb[static_cast<int64_t>(slots[bf]) * dim + k];
  }
}

__global__ void ScatterKernel(const float* __restrict__ dx,
                              const uint32_t* __restrict__ slots, int64_t rows,
                              int fields, int dim, float* grad_emb) {
  const int64_t n = rows * fields * dim;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < n; t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bf = t / dim;
    const int k = static_cast<int>(t - bf * dim);
    atomicAdd(&grad_emb[static_cast<int64_t>(slots[bf]) * dim + k], dx[t]);
  }
}

__global__ void AddBiasKernel(const float* __restrict__ w, int in, int out,
                              int64_t rows, float* __restrict__ z) {
  const int64_t n = rows * out;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < n; t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int o = static_cast<int>(t % out);
    z[t] += w[static_cast<int64_t>(o) * (in + 1) + in];
  }
}

// One block per output unit; double sum over rows.
__global__ void BiasGradKernel(const float* __restrict__ dz, int in, int out,
                               int64_t rows, float* __restrict__ gw) {
  __shared__ double partial[kBlock];
  const int o = blockIdx.x;
  double s = 0;
  for (int64_t b = threadIdx.x; b < rows; b += blockDim.x) {
    s += dz[b * out + o];
  }
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    gw[static_cast<int64_t>(o) * (in + 1) + in] = static_cast<float>(partial[0]);
  }
}

__global__ void DropoutKernel(float* x, int64_t n, int layer, uint64_t seed,
                              float rate, float inv_keep) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < n; t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[t] = DropoutUniform(seed, layer, static_cast<uint64_t>(t)) >= rate
               ? x[t] * inv_keep
               : 0.0f;
  }
}

__global__ void LogisticHeadKernel(const float* __restrict__ z,
                                   const float* __restrict__ offset,
                                   const float* __restrict__ labels,
                                   int64_t rows, float* dz, double* row_loss,
                                   float* prob) {
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < rows; b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double m = z[b];
    if (offset != nullptr) m += offset[b];
    double s;
    if (m >= 0) {
      s = 1.0 / (1.0 + exp(-m));
    } else {
      const double e = exp(m);
      s = e / (1.0 + e);
    }
    const double y = labels[b];
    if (dz != nullptr) dz[b] = static_cast<float>(s - y);
    if (row_loss != nullptr) {
      const double zz = y > 0.5 ? -m : m;
      row_loss[b] = fmax(zz, 0.0) + log1p(exp(-fabs(zz)));
    }
    if (prob != nullptr) prob[b] = static_cast<float>(s);
  }
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const float* emb, const uint32_t* slots,
                                  int64_t rows, int fields, int dim, float* x,
                                  cudaStream_t stream) {
  const int64_t n = rows * fields * dim;
  if (n == 0) return cudaSuccess;
  GatherKernel<<<Grid(n), kBlock, 0, stream>>>(emb, slots, rows, fields, dim, x);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingScatter(const float* dx, const uint32_t* slots,
                                   int64_t rows, int fields, int dim,
                                   float* grad_emb, cudaStream_t stream) {
  const int64_t n = rows * fields * dim;
  if (n == 0) return cudaSuccess;
  ScatterKernel<<<Grid(n), kBlock, 0, stream>>>(dx, slots, rows, fields, dim,
                                                grad_emb);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(const float* w, int in, int out, int64_t rows,
                          float* z, cudaStream_t stream) {
  const int64_t n = rows * out;
  if (n == 0) return cudaSuccess;
  AddBiasKernel<<<Grid(n), kBlock, 0, stream>>>(w, in, out, rows, z);
  return cudaGetLastError();
}

cudaError_t LaunchBiasGrad(const float* dz, int in, int out, int64_t rows,
                           float* gw, cudaStream_t stream) {
  if (out == 0) return cudaSuccess;
  BiasGradKernel<<<out, kBlock, 0, stream>>>(dz, in, out, rows, gw);
  return cudaGetLastError();
}

cudaError_t LaunchDropout(float* x, int64_t n, int layer, uint64_t seed,
                          float rate, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // The CPU backend multiplies in double by 1 / (1 - rate); the float
  // product differs from it by at most one rounding.
  const float inv_keep = static_cast<float>(1.0 / (1.0 - rate));
  DropoutKernel<<<Grid(n), kBlock, 0, stream>>>(x, n, layer, seed, rate,
                                                inv_keep);
  return cudaGetLastError();
}

cudaError_t LaunchLogisticHead(const float* z, const float* offset,
                               const float* labels, int64_t rows, float* dz,
                               double* row_loss, float* prob,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LogisticHeadKernel<<<Grid(rows), kBlock, 0, stream>>>(
      z, offset, labels, rows, dz, row_loss, prob);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
