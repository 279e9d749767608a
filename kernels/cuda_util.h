// Internal to kernels/ (host code only, never included by .cu files): RAII
// device / pinned buffers and CUDA error conversion shared by the CUDA
// backends.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps::cuda_internal {

inline absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(
      absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

#define PS_CUDA_RETURN(expr, what)                   \
  do {                                               \
    cudaError_t ps_cuda_e_ = (expr);                 \
    if (ps_cuda_e_ != cudaSuccess) return ::ps::cuda_internal::CudaError(ps_cuda_e_, what); \
  } while (0)

// Device memory, grown on demand, contents not kept on growth.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), cap_(o.cap_) {
    o.ptr_ = nullptr;
    o.cap_ = 0;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= cap_) return absl::OkStatus();
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    cap_ = 0;
    bytes = std::max<size_t>(bytes + bytes / 4, 256);
    PS_CUDA_RETURN(cudaMalloc(&ptr_, bytes), "cudaMalloc");
    cap_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t capacity() const { return cap_; }

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

// Pinned host memory, grown on demand.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= cap_) return absl::OkStatus();
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    cap_ = 0;
    bytes = std::max<size_t>(bytes + bytes / 4, 256);
    PS_CUDA_RETURN(cudaMallocHost(&ptr_, bytes), "cudaMallocHost");
    cap_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace ps::cuda_internal
