// The libFuzzer entry point of one target: compiled once per target with
// -DPS_FUZZ_ENTRY=<function in fuzz_util.h>.
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ps::fuzz::PS_FUZZ_ENTRY(data, size);
}
