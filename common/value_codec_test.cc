#include "common/value_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    const uint16_t back = FloatToHalf(f);
    if ((h & 0x7fff) == 0x7c00) {
      EXPECT_EQ(back, (h & 0x8000) | 0x7bff) << "infinity clamps";
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

#if defined(__FLT16_MAX__)
// Against the compiler's own conversion (round to nearest even), over the
// whole finite half range and below it.
TEST(Half, RoundsLikeTheCompiler) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  int checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t x = bits(rng);
    // Exponents from 2^-30 to 2^16, so subnormals, normals and the
    // clamp are all drawn.
    x = (x & 0x807fffffu) | ((97u + (x >> 23) % 50u) << 23);
    float f;
    std::memcpy(&f, &x, 4);
    if (std::fabs(f) >= 65520.0f) {
      EXPECT_EQ(HalfToFloat(FloatToHalf(f)), std::copysign(65504.0f, f));
      continue;
    }
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(FloatToHalf(f), want) << f;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}
#endif

TEST(ValueEncoding, ErrorIsWhatTheReceiverMisses) {
  const std::vector<float> v = {0.1f, -3.7f, 1e-9f, 70000.0f, 0.0f, 2.5f};
  for (proto::ValueEncoding e :
       {proto::VALUES_F32, proto::VALUES_F16, proto::VALUES_INT8}) {
    std::string wire = "xy";  // appended after what is there
    std::vector<float> err(v.size(), 0.0f);
    const float scale = Int8Scale(v.data(), v.size());
    EncodeValues(e, v.data(), v.size(), scale, &wire, err.data());
    ASSERT_EQ(wire.size(), 2 + v.size() * EncodedValueBytes(e));
    std::vector<float> got(v.size());
    ASSERT_TRUE(
        DecodeValues(e, wire.data() + 2, v.size(), scale, got.data()).ok());
    for (size_t i = 0; i < v.size(); ++i) {
      // Received + error = sent, up to the float rounding of the sum.
      EXPECT_NEAR(got[i] + err[i], v[i], 1e-6f * std::fabs(v[i]))
          << e << " " << i;
      if (e == proto::VALUES_F32) EXPECT_EQ(got[i], v[i]);
    }
  }
}

TEST(ValueEncoding, Int8UsesTheWholeRange) {
  const std::vector<float> v = {-2.0f, 1.0f, 0.0f, 2.0f};
  const float scale = Int8Scale(v.data(), v.size());
  EXPECT_FLOAT_EQ(scale, 2.0f / 127);
  std::string wire;
  EncodeValues(proto::VALUES_INT8, v.data(), v.size(), scale, &wire, nullptr);
  EXPECT_EQ(static_cast<int8_t>(wire[0]), -127);
  EXPECT_EQ(static_cast<int8_t>(wire[3]), 127);
  // All zero: scale 0, every value 0.
  const std::vector<float> zeros(5, 0.0f);
  EXPECT_EQ(Int8Scale(zeros.data(), zeros.size()), 0.0f);
}

TEST(ValueEncoding, BadInputIsRefused) {
  const std::string wire(4, '\x7f');
  float out[4];
  EXPECT_EQ(DecodeValues(proto::VALUES_INT8, wire.data(), 4, -1.0f, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeValues(proto::VALUES_INT8, wire.data(), 4,
                         std::numeric_limits<float>::infinity(), out)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeValues(static_cast<proto::ValueEncoding>(9), wire.data(), 1,
                         1.0f, out)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Codec, ZeroHeavyValuesShrinkAndComeBack) {
  std::vector<float> v(100000, 0.0f);
  for (size_t i = 0; i < v.size(); i += 37) v[i] = 0.001f * i;
  const std::string raw(reinterpret_cast<const char*>(v.data()),
                        v.size() * 4);
  for (proto::ValueCodec c : {proto::CODEC_ZSTD, proto::CODEC_LZ4}) {
    std::string packed, back;
    ASSERT_TRUE(Compress(c, raw, &packed)) << c;
    EXPECT_LT(packed.size(), raw.size() / 4) << c;
    ASSERT_TRUE(Decompress(c, packed, raw.size(), &back).ok()) << c;
    EXPECT_EQ(back, raw) << c;
  }
}

TEST(Codec, IncompressibleInputIsSentAsItIs) {
  std::mt19937 rng(3);
  std::string raw(4096, '\0');
  for (char& ch : raw) ch = static_cast<char>(rng());
  std::string packed;
  EXPECT_FALSE(Compress(proto::CODEC_ZSTD, raw, &packed));
  EXPECT_FALSE(Compress(proto::CODEC_LZ4, raw, &packed));
  EXPECT_FALSE(Compress(proto::CODEC_NONE, raw, &packed));
}

// What a hostile peer can send: a size that is not the real one (a
// decompression bomb claims little and expands to much), garbage, or an
// unknown codec. Always INVALID_ARGUMENT, never more than raw_bytes.
TEST(Codec, CorruptOrMisSizedPayloadsAreRefused) {
  const std::string raw(65536, '\0');
  for (proto::ValueCodec c : {proto::CODEC_ZSTD, proto::CODEC_LZ4}) {
    std::string packed, back;
    ASSERT_TRUE(Compress(c, raw, &packed));
    EXPECT_EQ(Decompress(c, packed, 1024, &back).code(),
              absl::StatusCode::kInvalidArgument)
        << c;
    EXPECT_LE(back.size(), 1024u);
    EXPECT_EQ(Decompress(c, packed, raw.size() + 1, &back).code(),
              absl::StatusCode::kInvalidArgument)
        << c;
    std::string bad = packed;
    for (size_t i = 0; i < bad.size(); i += 3) bad[i] ^= 0x5a;
    EXPECT_FALSE(Decompress(c, bad, raw.size(), &back).ok()) << c;
    EXPECT_EQ(Decompress(c, "garbage", raw.size(), &back).code(),
              absl::StatusCode::kInvalidArgument)
        << c;
  }
  std::string back;
  EXPECT_EQ(Decompress(static_cast<proto::ValueCodec>(7), "x", 1, &back).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
