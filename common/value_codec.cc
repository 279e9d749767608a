#include "common/value_codec.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ps {

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  // 65520 and above round to infinity in binary16: clamped to 65504.
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7bffu);
  if (ax < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded
    // to nearest even by the default rounding mode; 1024 * 2^-24 comes out
    // as the smallest normal, which is the right encoding too.
    float af;
    std::memcpy(&af, &ax, sizeof(af));
    const auto m = static_cast<uint32_t>(std::nearbyint(af * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped
  // mantissa bits to nearest even.
  ax += 0xc8000fffu + ((ax >> 13) & 1u);
  return static_cast<uint16_t>(sign | (ax >> 13));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  uint32_t bits;
  if (e == 0) {
    const float f = static_cast<float>(m) * (1.0f / 16777216.0f);
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (m << 13);
  } else {
    bits = sign | ((e + 112) << 23) | (m << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

size_t EncodedValueBytes(proto::ValueEncoding e) {
  switch (e) {
    case proto::VALUES_F16:
      return 2;
    case proto::VALUES_INT8:
      return 1;
    default:
      return 4;
  }
}

float Int8Scale(const float* v, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m / 127.0f;
}

void EncodeValues(proto::ValueEncoding e, const float* v, size_t n,
                  float scale, std::string* out, float* error) {
  const size_t at = out->size();
  switch (e) {
    case proto::VALUES_F16: {
      out->resize(at + 2 * n);
      char* p = out->data() + at;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToHalf(v[i]);
        std::memcpy(p + 2 * i, &h, 2);
        if (error != nullptr) error[i] += v[i] - HalfToFloat(h);
      }
      return;
    }
    case proto::VALUES_INT8: {
      out->resize(at + n);
      char* p = out->data() + at;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      for (size_t i = 0; i < n; ++i) {
        const float q =
            std::clamp(std::nearbyint(v[i] * inv), -127.0f, 127.0f);
        p[i] = static_cast<char>(static_cast<int8_t>(q));
        if (error != nullptr) error[i] += v[i] - q * scale;
      }
      return;
    }
    default:
      out->append(reinterpret_cast<const char*>(v), n * sizeof(float));
      return;
  }
}

absl::Status DecodeValues(proto::ValueEncoding e, const char* in, size_t n,
                          float scale, float* out) {
  switch (e) {
    case proto::VALUES_F32:
      if (n > 0) std::memcpy(out, in, n * sizeof(float));
      return absl::OkStatus();
    case proto::VALUES_F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return absl::OkStatus();
    case proto::VALUES_INT8:
      if (!(scale >= 0) || !std::isfinite(scale)) {
        return absl::InvalidArgumentError(
            absl::StrCat("int8 values with scale ", scale));
      }
      for (size_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(static_cast<int8_t>(in[i])) * scale;
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown value encoding ", static_cast<int>(e)));
  }
}

namespace {

// One compression and one decompression context per thread: no allocation
// per request once a thread has compressed once.
struct ZstdContexts {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~ZstdContexts() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};
ZstdContexts& Zstd() {
  thread_local ZstdContexts z;
  return z;
}

// Level 1: the fastest of zstd's regular levels; gradients are not text,
// and higher levels gain little on them for several times the CPU.
constexpr int kZstdLevel = 1;

}  // namespace

bool Compress(proto::ValueCodec c, absl::string_view in, std::string* out) {
  if (in.empty()) return false;
  switch (c) {
    case proto::CODEC_ZSTD: {
      out->resize(ZSTD_compressBound(in.size()));
      const size_t n = ZSTD_compressCCtx(Zstd().c, out->data(), out->size(),
                                         in.data(), in.size(), kZstdLevel);
      if (ZSTD_isError(n) || n >= in.size()) return false;
      out->resize(n);
      return true;
    }
    case proto::CODEC_LZ4: {
      if (in.size() > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) return false;
      const int src = static_cast<int>(in.size());
      out->resize(static_cast<size_t>(LZ4_compressBound(src)));
      const int n = LZ4_compress_default(in.data(), out->data(), src,
                                         static_cast<int>(out->size()));
      if (n <= 0 || static_cast<size_t>(n) >= in.size()) return false;
      out->resize(static_cast<size_t>(n));
      return true;
    }
    default:
      return false;
  }
}

absl::Status Decompress(proto::ValueCodec c, absl::string_view in,
                        size_t raw_bytes, std::string* out) {
  switch (c) {
    case proto::CODEC_ZSTD: {
      out->resize(raw_bytes);
      const size_t n = ZSTD_decompressDCtx(Zstd().d, out->data(), raw_bytes,
                                           in.data(), in.size());
      if (ZSTD_isError(n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("zstd values: ", ZSTD_getErrorName(n)));
      }
      if (n != raw_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "zstd values: ", n, " bytes, expected ", raw_bytes));
      }
      return absl::OkStatus();
    }
    case proto::CODEC_LZ4: {
      if (raw_bytes > static_cast<size_t>(LZ4_MAX_INPUT_SIZE) ||
          in.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
        return absl::InvalidArgumentError("lz4 values: too large");
      }
      out->resize(raw_bytes);
      const int n = LZ4_decompress_safe(in.data(), out->data(),
                                        static_cast<int>(in.size()),
                                        static_cast<int>(raw_bytes));
      if (n < 0) return absl::InvalidArgumentError("lz4 values: corrupt");
      if (static_cast<size_t>(n) != raw_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lz4 values: ", n, " bytes, expected ", raw_bytes));
      }
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown values codec ", static_cast<int>(c)));
  }
}

bool ParseValueEncoding(absl::string_view name, proto::ValueEncoding* e) {
  if (name == "f32") *e = proto::VALUES_F32;
  else if (name == "f16") *e = proto::VALUES_F16;
  else if (name == "int8") *e = proto::VALUES_INT8;
  else return false;
  return true;
}

bool ParseValueCodec(absl::string_view name, proto::ValueCodec* c) {
  if (name == "none") *c = proto::CODEC_NONE;
  else if (name == "zstd") *c = proto::CODEC_ZSTD;
  else if (name == "lz4") *c = proto::CODEC_LZ4;
  else return false;
  return true;
}

}  // namespace ps
