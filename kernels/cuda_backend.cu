// CUDA kernels of the sparse logistic-regression backend (the host side is
// kernels/cuda_backend.cc). Sums that must match the CPU backend are done in
// double, as the CPU does; only their order differs, so results agree to
// ~1e-12 relative before the final rounding to float.

#include <cub/cub.cuh>

#include <cstdint>

#include "kernels/cuda_internal.h"

namespace ps::cuda_internal {
namespace {

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;

__device__ __forceinline__ double StableSigmoidD(double m) {
  if (m >= 0) return 1.0 / (1.0 + exp(-m));
  const double e = exp(m);
  return e / (1.0 + e);
}

__device__ __forceinline__ double SoftplusD(double z) {
  return fmax(z, 0.0) + log1p(exp(-fabs(z)));
}

__device__ __forceinline__ double WarpSum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// One warp per row. The whole warp leaves together (rows is uniform per
// warp), so the shuffles see all 32 lanes.
__global__ void RowPassKernel(const int64_t* __restrict__ row_ptr,
                              const uint32_t* __restrict__ cols,
                              const float* __restrict__ vals,
                              const float* __restrict__ labels,
                              const float* __restrict__ w, int64_t rows,
                              double* residual, double* row_loss,
                              double* grad_acc, float* prob) {
  const int64_t row =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t b = row_ptr[row], e = row_ptr[row + 1];
  double m = 0;
  for (int64_t k = b + lane; k < e; k += 32) {
    m += static_cast<double>(w[cols[k]]) * static_cast<double>(vals[k]);
  }
  m = WarpSum(m);
  const double s = StableSigmoidD(m);
  const double y = labels[row];
  const double r = s - y;
  if (lane == 0) {
    if (residual != nullptr) residual[row] = r;
    if (row_loss != nullptr) {
      row_loss[row] = y > 0.5 ? SoftplusD(-m) : SoftplusD(m);
    }
    if (prob != nullptr) prob[row] = static_cast<float>(s);
  }
  if (grad_acc != nullptr) {
    for (int64_t k = b + lane; k < e; k += 32) {
      atomicAdd(&grad_acc[cols[k]], r * static_cast<double>(vals[k]));
    }
  }
}

__global__ void ToFloatKernel(const double* __restrict__ in, int64_t n,
                              float* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<float>(in[i]);
  }
}

__global__ void SumKernel(const double* __restrict__ in, int64_t n,
                          double* out) {
  __shared__ double partial[kWarpsPerBlock];
  double v = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    v += in[i];
  }
  v = WarpSum(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kWarpsPerBlock ? partial[threadIdx.x] : 0.0;
    v = WarpSum(v);
    if (threadIdx.x == 0) atomicAdd(out, v);
  }
}

__global__ void IotaKernel(uint32_t* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<uint32_t>(i);
  }
}

// row_of[k] = the row of non-zero k; one warp per row.
__global__ void RowOfKernel(const int64_t* __restrict__ row_ptr, int64_t rows,
                            uint32_t* __restrict__ row_of) {
  const int64_t row =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  for (int64_t k = row_ptr[row] + lane; k < row_ptr[row + 1]; k += 32) {
    row_of[k] = static_cast<uint32_t>(row);
  }
}

__device__ __forceinline__ int64_t LowerBound(const uint32_t* a, int64_t n,
                                              uint32_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (a[mid] < v) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One warp per column over the column-sorted copy.
__global__ void ColumnReduceKernel(const uint32_t* __restrict__ sorted_cols,
                                   const uint32_t* __restrict__ sorted_idx,
                                   const uint32_t* __restrict__ row_of,
                                   const float* __restrict__ vals,
                                   const double* __restrict__ residual,
                                   int64_t nnz, int64_t num_cols,
                                   float* __restrict__ grad) {
  const int64_t col =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (col >= num_cols) return;
  int64_t lo = 0, hi = 0;
  if (lane == 0) {
    lo = LowerBound(sorted_cols, nnz, static_cast<uint32_t>(col));
    hi = LowerBound(sorted_cols + lo, nnz - lo, static_cast<uint32_t>(col + 1)) + lo;
  }
  lo = __shfl_sync(0xffffffffu, lo, 0);
  hi = __shfl_sync(0xffffffffu, hi, 0);
  double g = 0;
  for (int64_t p = lo + lane; p < hi; p += 32) {
    const uint32_t k = sorted_idx[p];
    g += residual[row_of[k]] * static_cast<double>(vals[k]);
  }
  g = WarpSum(g);
  if (lane == 0) grad[col] = static_cast<float>(g);
}

unsigned WarpGrid(int64_t warps) {
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

unsigned StrideGrid(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < 4096 ? (blocks < 1 ? 1 : blocks) : 4096);
}

size_t Align(size_t n) { return (n + 255) & ~size_t{255}; }

int Bits(int64_t num_cols) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < num_cols) ++bits;
  return bits;
}

size_t SortTempBytes(int64_t nnz, int64_t num_cols) {
  size_t temp = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, temp,
                                  static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr),
                                  static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr),
                                  static_cast<int>(nnz), 0, Bits(num_cols));
  return temp;
}

}  // namespace

cudaError_t LaunchRowPass(const int64_t* row_ptr, const uint32_t* cols,
                          const float* vals, const float* labels,
                          const float* w, int64_t rows, double* residual,
                          double* row_loss, double* grad_acc, float* prob,
                          cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RowPassKernel<<<WarpGrid(rows), kBlock, 0, stream>>>(
      row_ptr, cols, vals, labels, w, rows, residual, row_loss, grad_acc, prob);
  return cudaGetLastError();
}

cudaError_t LaunchToFloat(const double* grad_acc, int64_t n, float* grad,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ToFloatKernel<<<StrideGrid(n), kBlock, 0, stream>>>(grad_acc, n, grad);
  return cudaGetLastError();
}

cudaError_t LaunchSum(const double* in, int64_t n, double* out,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SumKernel<<<StrideGrid(n), kBlock, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

// Scratch layout: sorted cols | sorted idx | idx (iota) | row_of | cub temp.
size_t SegmentedScratchBytes(int64_t nnz, int64_t num_cols) {
  const size_t arr = Align(sizeof(uint32_t) * static_cast<size_t>(nnz));
  return 4 * arr + Align(SortTempBytes(nnz, num_cols));
}

cudaError_t LaunchSegmentedGradient(const int64_t* row_ptr,
                                    const uint32_t* cols, const float* vals,
                                    int64_t rows, int64_t nnz,
                                    int64_t num_cols, const double* residual,
                                    void* scratch, size_t scratch_bytes,
                                    float* grad, cudaStream_t stream) {
  if (num_cols == 0) return cudaSuccess;
  if (scratch_bytes < SegmentedScratchBytes(nnz, num_cols)) {
    return cudaErrorInvalidValue;
  }
  char* p = static_cast<char*>(scratch);
  const size_t arr = Align(sizeof(uint32_t) * static_cast<size_t>(nnz));
  auto* sorted_cols = reinterpret_cast<uint32_t*>(p);
  auto* sorted_idx = reinterpret_cast<uint32_t*>(p + arr);
  auto* idx = reinterpret_cast<uint32_t*>(p + 2 * arr);
  auto* row_of = reinterpret_cast<uint32_t*>(p + 3 * arr);
  void* temp = p + 4 * arr;
  size_t temp_bytes = scratch_bytes - 4 * arr;
  if (nnz > 0) {
    IotaKernel<<<StrideGrid(nnz), kBlock, 0, stream>>>(idx, nnz);
    if (rows > 0) {
      RowOfKernel<<<WarpGrid(rows), kBlock, 0, stream>>>(row_ptr, rows, row_of);
    }
    cudaError_t e = cub::DeviceRadixSort::SortPairs(
        temp, temp_bytes, cols, sorted_cols, idx, sorted_idx,
        static_cast<int>(nnz), 0, Bits(num_cols), stream);
    if (e != cudaSuccess) return e;
  }
  ColumnReduceKernel<<<WarpGrid(num_cols), kBlock, 0, stream>>>(
      sorted_cols, sorted_idx, row_of, vals, residual, nnz, num_cols, grad);
  return cudaGetLastError();
}

}  // namespace ps::cuda_internal
