// kernel_bench: throughput of the compute kernels.
//
//   kernel_bench [--rows N] [--cols N] [--nnz N] [--reps N] [--mlp_batch N]
//
// --mlp_batch 0 leaves the MLP out (a sweep of LR batch sizes).
//
// Sparse LR gradient: a power-law CSR batch (rows x nnz per row over cols
// columns). Reported per backend / algorithm:
//  * device: kernels only (batch resident on the device), as effective GB/s
//    = bytes the gradient must read and write (row_ptr, cols, vals, labels,
//    one w read and residual per non-zero, the gradient) / time, and as a
//    fraction of the measured device-to-device copy bandwidth;
//  * sync: LogisticGradient end to end (host copies included);
//  * pipelined: SubmitGradient/CollectGradient keeping two batches in
//    flight, so copies overlap kernels.
// MLP (39 fields x 8, 256-128-1): examples/s of Gradient, GPU vs CPU.
// Without a device it says "no CUDA device found" and reports the CPU only.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda_backend.h"
#include "kernels/mlp.h"

#ifdef PS_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_internal.h"
#endif

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

CsrBatch PowerLawBatch(size_t rows, size_t cols, int nnz, uint32_t seed) {
  std::mt19937_64 rng(seed);
  CsrBatch b;
  b.keys.resize(cols);
  for (size_t j = 0; j < cols; ++j) b.keys[j] = j;
  // Zipf-ish column ids by inverse transform: c = cols^u - 1.
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint32_t> row;
  for (size_t i = 0; i < rows; ++i) {
    row.clear();
    for (int k = 0; k < nnz; ++k) {
      row.push_back(static_cast<uint32_t>(
          std::min<double>(cols - 1, std::pow(double(cols), u(rng)) - 1)));
    }
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    for (uint32_t c : row) {
      b.cols.push_back(c);
      b.vals.push_back(1.0f);
    }
    b.row_ptr.push_back(static_cast<int64_t>(b.cols.size()));
    b.labels.push_back(static_cast<float>(rng() % 2));
  }
  return b;
}

double GradientBytes(const CsrBatch& b) {
  return 8.0 * (b.rows() + 1) + 4.0 * b.nnz() * 3  // cols, vals, w[col]
         + 4.0 * b.rows() + 8.0 * b.nnz()          // labels, residual use
         + 4.0 * b.num_cols();                     // grad
}

#ifdef PS_HAVE_CUDA
// Kernels only, on a resident batch; seconds per gradient.
double DeviceOnly(const CsrBatch& b, GradientAlgo algo, int reps) {
  using namespace cuda_internal;
  const size_t rows = b.rows(), nnz = b.nnz(), cols = b.num_cols();
  int64_t* rp;
  uint32_t* c;
  float *v, *y, *w, *g;
  double *acc, *res, *rl, *loss;
  void* scratch;
  const size_t sb = SegmentedScratchBytes(nnz, cols);
  cudaMalloc(&rp, 8 * (rows + 1));
  cudaMalloc(&c, 4 * nnz);
  cudaMalloc(&v, 4 * nnz);
  cudaMalloc(&y, 4 * rows);
  cudaMalloc(&w, 4 * cols);
  cudaMalloc(&g, 4 * cols);
  cudaMalloc(&acc, 8 * cols);
  cudaMalloc(&res, 8 * rows);
  cudaMalloc(&rl, 8 * rows);
  cudaMalloc(&loss, 8);
  cudaMalloc(&scratch, sb);
  cudaMemcpy(rp, b.row_ptr.data(), 8 * (rows + 1), cudaMemcpyHostToDevice);
  cudaMemcpy(c, b.cols.data(), 4 * nnz, cudaMemcpyHostToDevice);
  cudaMemcpy(v, b.vals.data(), 4 * nnz, cudaMemcpyHostToDevice);
  cudaMemcpy(y, b.labels.data(), 4 * rows, cudaMemcpyHostToDevice);
  cudaMemset(w, 0, 4 * cols);
  auto once = [&] {
    cudaMemsetAsync(loss, 0, 8, nullptr);
    if (algo == GradientAlgo::kScatter) {
      cudaMemsetAsync(acc, 0, 8 * cols, nullptr);
      LaunchRowPass(rp, c, v, y, w, rows, res, rl, acc, nullptr, nullptr);
      LaunchToFloat(acc, cols, g, nullptr);
    } else {
      LaunchRowPass(rp, c, v, y, w, rows, res, rl, nullptr, nullptr, nullptr);
      LaunchSegmentedGradient(rp, c, v, rows, nnz, cols, res, scratch, sb, g,
                              nullptr);
    }
    LaunchSum(rl, rows, loss, nullptr);
  };
  once();
  cudaDeviceSynchronize();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int r = 0; r < reps; ++r) once();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) std::printf("  CUDA error: %s\n", cudaGetErrorString(err));
  for (void* p : {(void*)rp, (void*)c, (void*)v, (void*)y, (void*)w, (void*)g,
                  (void*)acc, (void*)res, (void*)rl, (void*)loss, scratch}) {
    cudaFree(p);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e-3 / reps;
}
#endif

void BenchLr(size_t rows, size_t cols, int nnz, int reps, bool have_cuda) {
  CsrBatch b = PowerLawBatch(rows, cols, nnz, 1);
  std::vector<float> w(cols, 0.01f), g(cols);
  const double bytes = GradientBytes(b);
  std::printf("sparse LR gradient: %zu rows, %zu cols, %zu non-zeros, %.1f MB\n",
              b.rows(), b.num_cols(), b.nnz(), bytes / 1e6);
  {
    auto cpu = CreateBackend("cpu", 1);
    double loss = 0;
    (void)(*cpu)->LogisticGradient(b, w, absl::MakeSpan(g), &loss);  // warm-up
    auto t0 = Clock::now();
    const int cpu_reps = std::max(1, reps / 10);
    for (int r = 0; r < cpu_reps; ++r) {
      (void)(*cpu)->LogisticGradient(b, w, absl::MakeSpan(g), &loss);
    }
    const double s = Seconds(t0, Clock::now()) / cpu_reps;
    std::printf("  cpu (1 thread)        %8.3f ms  %7.2f GB/s effective\n",
                s * 1e3, bytes / s / 1e9);
  }
  if (!have_cuda) return;
#ifdef PS_HAVE_CUDA
  auto bw = MeasureDeviceBandwidth(size_t{1} << 30);
  const double peak = bw.ok() ? *bw : 0;
  std::printf("  device D2D copy bandwidth (measured): %.0f GB/s\n", peak / 1e9);
  for (GradientAlgo algo : {GradientAlgo::kScatter, GradientAlgo::kSegmented}) {
    const double dev = DeviceOnly(b, algo, reps);
    std::printf("  cuda %-10s device %8.3f ms  %7.1f GB/s effective (%.1f%% of D2D)\n",
                GradientAlgoName(algo), dev * 1e3, bytes / dev / 1e9,
                peak > 0 ? 100 * bytes / dev / peak : 0.0);
    auto be = CreateCudaBackend(algo);
    if (!be.ok()) {
      std::printf("  %s\n", be.status().ToString().c_str());
      continue;
    }
    double loss = 0;
    (void)(*be)->LogisticGradient(b, w, absl::MakeSpan(g), &loss);  // warm-up
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      (void)(*be)->LogisticGradient(b, w, absl::MakeSpan(g), &loss);
    }
    const double sync = Seconds(t0, Clock::now()) / reps;
    t0 = Clock::now();
    int64_t pending = *(*be)->SubmitGradient(b, w);
    for (int r = 1; r < reps; ++r) {
      int64_t next = *(*be)->SubmitGradient(b, w);
      (void)(*be)->CollectGradient(pending, absl::MakeSpan(g), &loss);
      pending = next;
    }
    (void)(*be)->CollectGradient(pending, absl::MakeSpan(g), &loss);
    const double piped = Seconds(t0, Clock::now()) / reps;
    std::printf("  cuda %-10s sync   %8.3f ms   pipelined %8.3f ms per batch "
                "(host copies included)\n",
                GradientAlgoName(algo), sync * 1e3, piped * 1e3);
  }
#endif
}

void BenchMlp(size_t batch_rows, int reps, bool have_cuda) {
  MlpShape shape;  // 39 x 8, 256-128-1
  std::mt19937 rng(3);
  MlpBatch b;
  const size_t keys = batch_rows * 10;
  for (size_t j = 0; j < keys; ++j) b.keys.push_back(j);
  for (size_t r = 0; r < batch_rows; ++r) {
    for (int f = 0; f < shape.num_fields; ++f) b.slots.push_back(rng() % keys);
    b.labels.push_back(static_cast<float>(rng() % 2));
  }
  std::vector<float> emb(keys * shape.embedding_dim, 0.01f), gemb(emb.size());
  std::vector<std::vector<float>> layers, gl;
  MlpParams p;
  MlpGrads g;
  for (int l = 0; l < shape.num_layers(); ++l) {
    layers.emplace_back(shape.layer_floats(l), 0.01f);
    gl.emplace_back(shape.layer_floats(l));
  }
  p.emb = emb;
  g.emb = absl::MakeSpan(gemb);
  for (auto& v : layers) p.layers.push_back(v);
  for (auto& v : gl) g.layers.push_back(absl::MakeSpan(v));
  std::printf("MLP gradient (39x8 -> 256 -> 128 -> 1), minibatch %zu:\n",
              batch_rows);
  auto run = [&](MlpBackend* be, int n) {
    double loss = 0;
    (void)be->Gradient(shape, b, p, g, &loss);  // warm-up
    auto t0 = Clock::now();
    for (int r = 0; r < n; ++r) (void)be->Gradient(shape, b, p, g, &loss);
    return n * batch_rows / Seconds(t0, Clock::now());
  };
  auto cpu = CreateCpuMlpBackend();
  const double cpu_eps = run(cpu.get(), std::max(1, reps / 10));
  std::printf("  cpu  %12.0f examples/s\n", cpu_eps);
  if (!have_cuda) return;
  auto gpu = CreateCudaMlpBackend();
  if (!gpu.ok()) {
    std::printf("  %s\n", gpu.status().ToString().c_str());
    return;
  }
  const double gpu_eps = run(gpu->get(), reps);
  std::printf("  cuda %12.0f examples/s  (%.1fx the CPU)\n", gpu_eps,
              gpu_eps / cpu_eps);
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  size_t rows = 200000, cols = 1000000, mlp_batch = 1000;
  int nnz = 39, reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (a == "--rows") rows = v;
    else if (a == "--cols") cols = v;
    else if (a == "--nnz") nnz = static_cast<int>(v);
    else if (a == "--reps") reps = static_cast<int>(v);
    else if (a == "--mlp_batch") mlp_batch = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  absl::Status dev = ps::CudaDeviceAvailable();
  const bool have_cuda = dev.ok();
  if (have_cuda) {
    auto info = ps::GetCudaDeviceInfo();
    std::printf("device: %s, %d SMs, %.0f GiB\n", info->name.c_str(),
                info->sm_count, info->global_memory_bytes / double(1 << 30));
  } else {
    std::printf("%s: reporting the CPU only\n", std::string(dev.message()).c_str());
  }
  ps::BenchLr(rows, cols, nnz, reps, have_cuda);
  if (mlp_batch > 0) ps::BenchMlp(mlp_batch, reps, have_cuda);
  return 0;
}
