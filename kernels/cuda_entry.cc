// libps_cuda.so's one exported symbol: the table of its CUDA entry points
// (kernels/cuda_api.h). The library is linked with -Bsymbolic-functions, so
// these are its own definitions, never the loader's of the same names in
// the executable.
#include "kernels/cuda_api.h"

const ps::cuda_internal::CudaApi* ps_cuda_api() {
  static const ps::cuda_internal::CudaApi api = {
      ps::cuda_internal::kCudaApiVersion,
      &ps::CudaDeviceAvailable,
      &ps::GetCudaDeviceInfo,
      &ps::MeasureDeviceBandwidth,
      &ps::CreateCudaBackend,
      &ps::CreateCudaMlpBackend,
  };
  return &api;
}
