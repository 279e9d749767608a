// Shared by the libFuzzer targets in fuzz/. Each target is a plain function
// ps::fuzz::Name(data, size) declared below; fuzz_main.cc, compiled with
// -DPS_FUZZ_ENTRY=Name, makes it libFuzzer's LLVMFuzzerTestOneInput, and
// fuzz_replay_test calls it on every file of fuzz/corpus/<target>/ and
// fuzz/regressions/<target>/ in the normal build (so a crash once found stays
// a test). Each returns 0.
//
// A target never crashes on hostile input by design: a crash, a sanitizer
// report or a failed PS_FUZZ_CHECK (a broken invariant) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define PS_FUZZ_CHECK(cond)                                      \
  do {                                                           \
    if (!(cond)) {                                               \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", \
                   __FILE__, __LINE__, #cond);                   \
      std::abort();                                              \
    }                                                            \
  } while (0)

namespace ps::fuzz {
// Drops protobuf's log lines (one per input with a non-UTF-8 string field,
// which the targets then skip as unparsable).
void QuietProtobuf();

int Libsvm(const uint8_t* data, size_t size);
int Criteo(const uint8_t* data, size_t size);
int Config(const uint8_t* data, size_t size);
int Server(const uint8_t* data, size_t size);
int Scheduler(const uint8_t* data, size_t size);
int Wire(const uint8_t* data, size_t size);
int DataPlane(const uint8_t* data, size_t size);
int Files(const uint8_t* data, size_t size);
int Replica(const uint8_t* data, size_t size);
}  // namespace ps::fuzz
