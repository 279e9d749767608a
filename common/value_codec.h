// Value encodings and compressors for push requests (issue 10: the paper's
// section 4.2). Workers encode; servers decode what a peer sent, so every
// decoder treats its input as untrusted: a malformed payload gets
// INVALID_ARGUMENT, never a crash, and never more memory than the caller's
// bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"

namespace ps {

// IEEE 754 binary16, rounding to nearest even. Finite values beyond the
// half range become +-65504 (the largest finite half: a gradient is never
// turned into an infinity), NaN stays NaN.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// Bytes per value in `e` (4, 2 or 1).
size_t EncodedValueBytes(proto::ValueEncoding e);

// The int8 scale of `n` values: max |v| / 127 (0 when all are 0).
float Int8Scale(const float* v, size_t n);

// Appends `n` values in `e` to `out` (int8: round(v / scale), clamped to
// [-127, 127]; `scale` is ignored otherwise). When `error` is not null,
// error[i] += v[i] - decoded(encoded v[i]) (the rounding error, which error
// feedback adds to the next push). `v` must be finite.
void EncodeValues(proto::ValueEncoding e, const float* v, size_t n,
                  float scale, std::string* out, float* error);

// Decodes `n` values from `in` (n * EncodedValueBytes(e) bytes) into `out`.
// INVALID_ARGUMENT: an unknown encoding, or (int8) a scale that is negative
// or not finite. Decoded values may still be huge; callers check finiteness.
absl::Status DecodeValues(proto::ValueEncoding e, const char* in, size_t n,
                          float scale, float* out);

// Compresses `in` with `c` into `out` (replaced). Returns false, leaving
// `out` unspecified, when `c` is CODEC_NONE or the result would not be
// smaller than `in` (send `in` as it is then).
bool Compress(proto::ValueCodec c, absl::string_view in, std::string* out);

// Decompresses `in` into `out` (replaced), which must come out exactly
// `raw_bytes` long; never writes more than that. INVALID_ARGUMENT: an
// unknown codec, a corrupt payload, or another size.
absl::Status Decompress(proto::ValueCodec c, absl::string_view in,
                        size_t raw_bytes, std::string* out);

// "f32" | "f16" | "int8" and "none" | "zstd" | "lz4" (the config's names).
bool ParseValueEncoding(absl::string_view name, proto::ValueEncoding* e);
bool ParseValueCodec(absl::string_view name, proto::ValueCodec* c);

}  // namespace ps
