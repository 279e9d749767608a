// Internal to kernels/: launchers of the CUDA kernels (defined in the .cu
// files, compiled by nvcc) called from the host-side backend classes
// (compiled by the C++ compiler). Only built when PS_HAVE_CUDA is set; never
// include this from outside kernels/ (backend.h and mlp.h stay CUDA-free).
//
// Every launcher only enqueues work on `stream` and returns the launch
// status (cudaGetLastError); pointers are device pointers unless named h_*.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ps::cuda_internal {

// ---------------------------------------------------------- sparse LR

// Per row i (one warp per row): m = sum_k w[cols[k]] * vals[k] (double),
// residual[i] = sigmoid(m) - labels[i], row_loss[i] = log loss.
// When grad_acc is not null also scatters residual * vals[k] into
// grad_acc[cols[k]] with atomicAdd (the "scatter" gradient).
// When prob is not null writes prob[i] = sigmoid(m) (prediction only).
cudaError_t LaunchRowPass(const int64_t* row_ptr, const uint32_t* cols,
                          const float* vals, const float* labels,
                          const float* w, int64_t rows, double* residual,
                          double* row_loss, double* grad_acc, float* prob,
                          cudaStream_t stream);

// grad[j] = (float) grad_acc[j] for j < n.
cudaError_t LaunchToFloat(const double* grad_acc, int64_t n, float* grad,
                          cudaStream_t stream);

// *out = sum of in[0..n) (double). Uses atomicAdd on *out: zero it first.
cudaError_t LaunchSum(const double* in, int64_t n, double* out,
                      cudaStream_t stream);

// Segmented ("CSC") gradient. Builds on the device a copy of the batch
// sorted by column (stable radix sort of (col, nnz index) pairs, so row order
// is kept inside a column), then reduces each column with one warp:
// grad[j] = sum over the column's non-zeros of residual[row] * val.
// Scratch sizes: see SegmentedScratchBytes.
size_t SegmentedScratchBytes(int64_t nnz, int64_t num_cols);
cudaError_t LaunchSegmentedGradient(const int64_t* row_ptr,
                                    const uint32_t* cols, const float* vals,
                                    int64_t rows, int64_t nnz,
                                    int64_t num_cols, const double* residual,
                                    void* scratch, size_t scratch_bytes,
                                    float* grad, cudaStream_t stream);

// ---------------------------------------------------------------- MLP

// x[b * (F*d) + f*d + k] = emb[slots[b*F + f] * d + k]  for b < rows.
cudaError_t LaunchEmbeddingGather(const float* emb, const uint32_t* slots,
                                  int64_t rows, int fields, int dim, float* x,
                                  cudaStream_t stream);
// grad_emb[slots[b*F+f]*d + k] += dx[b*(F*d) + f*d + k]   (atomicAdd; zero
// grad_emb first).
cudaError_t LaunchEmbeddingScatter(const float* dx, const uint32_t* slots,
                                   int64_t rows, int fields, int dim,
                                   float* grad_emb, cudaStream_t stream);
// z[b*out + o] += w[o*(in+1) + in]   (the bias column of a layer).
cudaError_t LaunchAddBias(const float* w, int in, int out, int64_t rows,
                          float* z, cudaStream_t stream);
// gw[o*(in+1) + in] = sum_b dz[b*out + o]   (the bias gradient).
cudaError_t LaunchBiasGrad(const float* dz, int in, int out, int64_t rows,
                           float* gw, cudaStream_t stream);
// Inverted dropout of a hidden layer's output or gradient, in place:
// x[k] = DropoutUniform(seed, layer, k) >= rate ? x[k] / (1 - rate) : 0 for
// k < n (kernels/dropout.h; the same units as the CPU backend).
cudaError_t LaunchDropout(float* x, int64_t n, int layer, uint64_t seed,
                          float rate, cudaStream_t stream);
// Output layer: per row, with m = z[b] + (offset ? offset[b] : 0) in
// double, p = sigmoid(m); dz[b] = p - labels[b], row_loss[b] = log loss
// (double), prob[b] = p, each when its pointer is not null.
cudaError_t LaunchLogisticHead(const float* z, const float* offset,
                               const float* labels, int64_t rows, float* dz,
                               double* row_loss, float* prob,
                               cudaStream_t stream);

}  // namespace ps::cuda_internal
