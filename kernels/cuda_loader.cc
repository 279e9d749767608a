// The CUDA entry points of a CUDA build, as the executable sees them: they
// load libps_cuda.so (the CUDA backends, linked against cudart, cuBLAS and
// cuDNN) on first use and forward to it. A machine without NVIDIA device
// nodes never loads it: CudaDeviceAvailable answers UNAVAILABLE "no CUDA
// device found" at once, so a CPU-only worker does not pay the toolkit's
// static initialisation (about 0.5 CPU-s per process, docs/benchmarks.md).
//
// The library is looked for in $PS_CUDA_LIBRARY, next to the executable, in
// the build tree it was built in (PS_CUDA_LIBRARY_PATH), then by the
// dynamic loader's own search.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda_api.h"

namespace ps {

namespace {

using cuda_internal::CudaApi;

bool HasNvidiaDeviceNodes() {
  for (const char* p : {"/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"}) {
    if (access(p, F_OK) == 0) return true;
  }
  return false;
}

std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

struct Loaded {
  const CudaApi* api = nullptr;
  absl::Status status;
};

Loaded Load() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("PS_CUDA_LIBRARY"); env && *env) {
    candidates.push_back(env);
  }
  if (std::string dir = ExecutableDir(); !dir.empty()) {
    candidates.push_back(dir + "/libps_cuda.so");
  }
#ifdef PS_CUDA_LIBRARY_PATH
  candidates.push_back(PS_CUDA_LIBRARY_PATH);
#endif
  candidates.push_back("libps_cuda.so");
  std::vector<std::string> errors;
  for (const std::string& c : candidates) {
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      errors.push_back(e != nullptr ? e : c);
      continue;
    }
    auto* entry = reinterpret_cast<const CudaApi* (*)()>(dlsym(h, "ps_cuda_api"));
    const CudaApi* api = entry != nullptr ? entry() : nullptr;
    if (api == nullptr || api->version != cuda_internal::kCudaApiVersion) {
      errors.push_back(c + ": not this build's libps_cuda.so");
      continue;  // kept loaded: unloading CUDA libraries is not safe
    }
    return Loaded{api, absl::OkStatus()};
  }
  return Loaded{nullptr,
                absl::UnavailableError(absl::StrCat(
                    "no CUDA device found (libps_cuda.so could not be loaded: ",
                    absl::StrJoin(errors, "; "), ")"))};
}

// The library's table, loaded once; or why not.
const Loaded& Library() {
  static const Loaded* loaded = new Loaded(Load());
  return *loaded;
}

}  // namespace

const char* GradientAlgoName(GradientAlgo algo) {
  return algo == GradientAlgo::kScatter ? "scatter" : "segmented";
}

absl::Status CudaDeviceAvailable() {
  if (!HasNvidiaDeviceNodes()) {
    return absl::UnavailableError(
        "no CUDA device found (no NVIDIA device nodes in /dev)");
  }
  const Loaded& lib = Library();
  if (!lib.status.ok()) return lib.status;
  return lib.api->device_available();
}

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo() {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  return Library().api->device_info();
}

absl::StatusOr<double> MeasureDeviceBandwidth(size_t bytes) {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  return Library().api->measure_bandwidth(bytes);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CreateCudaBackend(
    GradientAlgo algo) {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  return Library().api->create_backend(algo);
}

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend() {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  return Library().api->create_mlp_backend();
}

}  // namespace ps
