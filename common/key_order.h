// Checks of a request's key order (issue 10): a push or pull carries its
// keys ascending and unique, and the server checks every request's before
// it uses them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ps {

// The first i in [1, n) with keys[i] <= keys[i - 1], or n when the keys
// ascend strictly (always for n < 2). In AVX-512 or AVX2 where the CPU
// has it: a
// check of 32 keys is a few instructions and one branch, where the scalar
// loop's compare and branch a key was 5 % of a 100k-key push's samples.
size_t FirstNotAscending(const uint64_t* keys, size_t n);

// FirstNotAscending without vector instructions (what it runs on other
// CPUs). Public so that tests compare the two on any CPU.
size_t FirstNotAscendingPortable(const uint64_t* keys, size_t n);

#if defined(__x86_64__)
// FirstNotAscending's AVX2 loop (CPUs with AVX2 but not AVX-512). Only
// where CpuHasAvx2(); public so that tests run it on any such CPU.
size_t FirstNotAscendingAvx2(const uint64_t* keys, size_t n);
#endif

}  // namespace ps
