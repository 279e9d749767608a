// What the CPU can run, for code with a vector loop and a portable one
// (x86-64 only; elsewhere every answer is false).
#pragma once

namespace ps {

// AVX2 (256-bit integer vectors, vpermps, the 8-lane blends).
inline bool CpuHasAvx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
#else
  return false;
#endif
}

// AVX-512 Foundation.
inline bool CpuHasAvx512F() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
#else
  return false;
#endif
}

// AVX-512 Foundation and Doubleword/Quadword (vpmullq, the 64-bit compares
// into masks).
inline bool CpuHasAvx512Dq() {
#if defined(__x86_64__)
  return CpuHasAvx512F() && __builtin_cpu_supports("avx512dq") != 0;
#else
  return false;
#endif
}

}  // namespace ps
