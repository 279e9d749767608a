#include "worker/push_filter.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/value_codec.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// Decodes what Encode appended (one run, its scale).
std::vector<float> Decoded(proto::ValueEncoding e, const std::string& wire,
                           size_t n, float scale) {
  std::vector<float> out(n);
  EXPECT_TRUE(DecodeValues(e, wire.data(), n, scale, out.data()).ok());
  return out;
}

TEST(PushFilter, SignificanceHoldsSmallRowsBackUntilTheyAddUp) {
  PushFilterOptions o;
  o.significant_threshold = 1.0;
  o.key_caching = false;  // leaving rows out is then always smaller
  PushFilter f(o);
  const std::vector<uint64_t> keys = {3, 9};
  std::vector<uint64_t> k;
  std::vector<float> v;
  std::vector<uint32_t> slots;
  // dim 2: key 3 has an element above the threshold, key 9 does not.
  const std::vector<float> g1 = {0.1f, -1.5f, 0.4f, 0.4f};
  f.Filter(0, 2, keys, g1.data(), &k, &v, &slots);
  EXPECT_EQ(k, std::vector<uint64_t>({3}));
  EXPECT_EQ(v, std::vector<float>({0.1f, -1.5f}));
  EXPECT_EQ(slots.size(), 1u);
  // Key 9 again: 0.4 + 0.7 > 1, sent with what was held back.
  const std::vector<float> g2 = {0.0f, 0.0f, 0.7f, -0.1f};
  f.Filter(0, 2, keys, g2.data(), &k, &v, &slots);
  ASSERT_EQ(k, std::vector<uint64_t>({9}));
  EXPECT_FLOAT_EQ(v[0], 1.1f);
  EXPECT_FLOAT_EQ(v[1], 0.3f);
  // Key 3's residual was cleared when it was sent: 0 + 0 is held back.
  EXPECT_EQ(f.residual_keys(), 2u);
}

// With a codec, held-back rows go as zeros: the key list is the caller's.
TEST(PushFilter, HeldBackRowsAreZerosWhenAsked) {
  PushFilterOptions o;
  o.significant_threshold = 1.0;
  o.zero_held_rows = true;
  PushFilter f(o);
  const std::vector<uint64_t> keys = {3, 9};
  std::vector<uint64_t> k;
  std::vector<float> v;
  std::vector<uint32_t> slots;
  const std::vector<float> g1 = {2.0f, 0.5f};
  f.Filter(0, 1, keys, g1.data(), &k, &v, &slots);
  EXPECT_EQ(k, keys);
  EXPECT_EQ(v, std::vector<float>({2.0f, 0.0f}));
  const std::vector<float> g2 = {0.0f, 0.6f};
  f.Filter(0, 1, keys, g2.data(), &k, &v, &slots);
  EXPECT_EQ(k, keys);
  EXPECT_FLOAT_EQ(v[1], 1.1f);  // what was held back, with this push
  EXPECT_EQ(v[0], 0.0f);
  FilterConfig c;
  c.codec = "zstd";
  EXPECT_TRUE(PushFilterOptions::FromConfig(c).zero_held_rows);
}

// With key caching, rows are left out only when that is smaller with the
// kept rows' keys resent than zeros in the cached list.
TEST(PushFilter, KeyCachingLeavesRowsOutOnlyWhenThatIsSmaller) {
  PushFilterOptions o;
  o.significant_threshold = 1.0;
  PushFilter f(o);
  std::vector<uint64_t> k;
  std::vector<float> v;
  std::vector<uint32_t> slots;
  // dim 1: 1 of 2 rows kept: 12 bytes >= 2 * 4: zeros.
  const std::vector<uint64_t> two = {1, 2};
  const std::vector<float> g2 = {5.0f, 0.1f};
  f.Filter(0, 1, two, g2.data(), &k, &v, &slots);
  EXPECT_EQ(k, two);
  EXPECT_EQ(v, std::vector<float>({5.0f, 0.0f}));
  EXPECT_EQ(slots.size(), 2u);
  // 1 of 4 rows kept: 12 bytes < 4 * 4: left out.
  const std::vector<uint64_t> four = {10, 11, 12, 13};
  const std::vector<float> g4 = {0.1f, 5.0f, 0.1f, 0.1f};
  f.Filter(0, 1, four, g4.data(), &k, &v, &slots);
  EXPECT_EQ(k, std::vector<uint64_t>({11}));
  EXPECT_EQ(v, std::vector<float>({5.0f}));
  EXPECT_EQ(slots.size(), 1u);
}

// Error feedback: whatever the encoding loses on one push is sent with the
// next, so the receiver's running sum stays within one rounding step of the
// true sum, however many pushes there are.
TEST(PushFilter, ErrorFeedbackKeepsTheReceiversSumExact) {
  for (proto::ValueEncoding e : {proto::VALUES_F16, proto::VALUES_INT8}) {
    PushFilterOptions o;
    o.encoding = e;
    PushFilter f(o);
    const std::vector<uint64_t> keys = {1, 2, 3};
    std::vector<double> truth(3, 0), received(3, 0);
    for (int step = 0; step < 200; ++step) {
      const std::vector<float> g = {0.001f * (step % 7), -0.3f + 0.01f * step,
                                    1e-5f};
      std::vector<uint64_t> k;
      std::vector<float> v;
      std::vector<uint32_t> slots;
      f.Filter(0, 1, keys, g.data(), &k, &v, &slots);
      ASSERT_EQ(k.size(), 3u);
      std::string wire;
      const float scale = f.Encode(0, 1, slots.data(), 3, v.data(), &wire);
      const std::vector<float> got = Decoded(e, wire, 3, scale);
      for (int i = 0; i < 3; ++i) {
        truth[i] += g[i];
        received[i] += got[i];
      }
    }
    for (int i = 0; i < 3; ++i) {
      // One step of the coarsest encoding of the last push's values.
      EXPECT_NEAR(received[i], truth[i], 0.05) << e << " key " << i;
    }
    // The tiny third value alone would be lost in int8 every time
    // (1e-5 against a scale of ~1.7/127): with feedback it arrives in sum.
    EXPECT_NEAR(received[2], 200 * 1e-5, 0.02) << e;
  }
}

TEST(PushFilter, WithoutFeedbackTheErrorIsDropped) {
  PushFilterOptions o;
  o.encoding = proto::VALUES_INT8;
  o.error_feedback = false;
  PushFilter f(o);
  EXPECT_FALSE(o.keeps_residuals());
  const std::vector<float> v = {1.0f, 1e-4f};
  std::string wire;
  const float scale = f.Encode(0, 1, nullptr, 2, v.data(), &wire);
  const std::vector<float> got = Decoded(proto::VALUES_INT8, wire, 2, scale);
  EXPECT_FLOAT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_EQ(f.residual_keys(), 0u);
}

TEST(PushFilter, OptionsComeFromTheConfig) {
  FilterConfig c;
  EXPECT_FALSE(c.any());
  c.value_encoding = "int8";
  c.codec = "lz4";
  c.significant_threshold = 0.5;
  const PushFilterOptions o = PushFilterOptions::FromConfig(c);
  EXPECT_EQ(o.encoding, proto::VALUES_INT8);
  EXPECT_EQ(o.codec, proto::CODEC_LZ4);
  EXPECT_EQ(o.significant_threshold, 0.5);
  EXPECT_TRUE(o.keeps_residuals());
  EXPECT_EQ(DescribeFilters(c), "significant 0.5, int8, lz4");
  EXPECT_EQ(DescribeFilters(FilterConfig()), "none");
}

}  // namespace
}  // namespace ps
