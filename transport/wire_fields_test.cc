// WireFields: a message read with its large fields left where they were
// received equals what protobuf parses, however the bytes are cut into
// slices, and whatever is malformed is refused.
#include "transport/wire_fields.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace ps {
namespace {

constexpr int kPushBig[] = {proto::PushRequest::kKeysFieldNumber,
                            proto::PushRequest::kValsFieldNumber};

proto::PushRequest SamplePush(int nkeys) {
  proto::PushRequest req;
  req.set_worker_id(3);
  req.set_seq(17);
  req.set_clock(5);
  req.set_epoch(2);
  req.set_table(1);
  req.set_num_examples(64);
  std::string keys, vals;
  for (int i = 0; i < nkeys; ++i) {
    const uint64_t k = 1000 + 7 * static_cast<uint64_t>(i);
    const float v = 0.5f * static_cast<float>(i) - 3.0f;
    keys.append(reinterpret_cast<const char*>(&k), sizeof(k));
    vals.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  req.set_keys(keys);
  req.set_vals(vals);
  for (int r = 0; r < 3; ++r) {
    proto::PushSegment* s = req.add_segments();
    s->set_range(r);
    s->set_seq(100 + r);
    s->set_num_keys(static_cast<uint32_t>(nkeys / 3));
  }
  req.mutable_end_clock()->set_worker_id(3);
  req.mutable_end_clock()->set_clock(5);
  req.set_vals_raw_bytes(9);
  return req;
}

// Slices holding `bytes` cut at `cuts` (ascending offsets), each a copy.
std::vector<grpc::Slice> Cut(const std::string& bytes,
                             const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> out;
  size_t at = 0;
  for (size_t c : cuts) {
    out.emplace_back(bytes.data() + at, c - at);
    at = c;
  }
  out.emplace_back(bytes.data() + at, bytes.size() - at);
  return out;
}

// Parses `slices` and checks the result equals `want` (parsed whole).
void ExpectSame(std::vector<grpc::Slice> slices,
                const proto::PushRequest& want) {
  WireFields w;
  proto::PushRequest meta;
  ASSERT_TRUE(w.Parse(std::move(slices), kPushBig, &meta).ok());
  EXPECT_EQ(w.field(0), want.keys());
  EXPECT_EQ(w.field(1), want.vals());
  EXPECT_TRUE(meta.keys().empty());
  EXPECT_TRUE(meta.vals().empty());
  proto::PushRequest rest = want;
  rest.clear_keys();
  rest.clear_vals();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(meta, rest))
      << meta.DebugString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.field(0).data()) %
                WireFields::kAlign,
            0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.field(1).data()) %
                WireFields::kAlign,
            0u);
}

TEST(WireFieldsTest, EqualsProtobufWhereverTheSlicesAreCut) {
  const proto::PushRequest req = SamplePush(12);
  const std::string bytes = req.SerializeAsString();
  ExpectSame(Cut(bytes, {}), req);
  for (size_t a = 0; a <= bytes.size(); ++a) {
    ExpectSame(Cut(bytes, {a}), req);
  }
  for (size_t a = 0; a <= bytes.size(); a += 3) {
    for (size_t b = a; b <= bytes.size(); b += 5) {
      ExpectSame(Cut(bytes, {a, b}), req);
    }
  }
  // Every byte its own slice, with empty slices between.
  std::vector<size_t> each;
  for (size_t a = 0; a <= bytes.size(); ++a) {
    each.push_back(a);
    each.push_back(a);
  }
  ExpectSame(Cut(bytes, each), req);
}

TEST(WireFieldsTest, AFieldInOneAlignedSliceIsNotCopied) {
  const proto::PushRequest req = SamplePush(30);
  const std::string bytes = req.SerializeAsString();
  const size_t vals_at = bytes.find(req.vals());
  ASSERT_NE(vals_at, std::string::npos);
  // Place the message so that the values start 8-byte aligned.
  std::unique_ptr<uint64_t[]> store(new uint64_t[bytes.size() / 8 + 4]);
  char* base = reinterpret_cast<char*>(store.get());
  char* msg = base + (8 - vals_at % 8) % 8;
  std::memcpy(msg, bytes.data(), bytes.size());
  std::vector<grpc::Slice> one;
  one.emplace_back(msg, bytes.size(), grpc::Slice::STATIC_SLICE);
  WireFields w;
  proto::PushRequest meta;
  ASSERT_TRUE(w.Parse(std::move(one), kPushBig, &meta).ok());
  EXPECT_EQ(w.field(1).data(), msg + vals_at);  // in place
  EXPECT_EQ(w.field(1), req.vals());
  // The keys are misaligned in this placement (unless by chance): copied.
  const size_t keys_at = bytes.find(req.keys());
  if ((reinterpret_cast<uintptr_t>(msg) + keys_at) % 8 != 0) {
    EXPECT_EQ(w.copied(), req.keys().size());
    EXPECT_NE(w.field(0).data(), msg + keys_at);
  }
  EXPECT_EQ(w.field(0), req.keys());
}

TEST(WireFieldsTest, EveryPrefixIsAcceptedExactlyWhenProtobufAcceptsIt) {
  const proto::PushRequest req = SamplePush(6);
  const std::string bytes = req.SerializeAsString();
  for (size_t n = 0; n <= bytes.size(); ++n) {
    const std::string prefix = bytes.substr(0, n);
    proto::PushRequest want;
    const bool pb = want.ParseFromString(prefix);
    WireFields w;
    proto::PushRequest meta;
    std::vector<grpc::Slice> s;
    s.emplace_back(prefix);
    const absl::Status st = w.Parse(std::move(s), kPushBig, &meta);
    EXPECT_EQ(st.ok(), pb) << "prefix of " << n << " bytes: " << st;
    if (!st.ok()) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    EXPECT_EQ(w.field(0), want.keys());
    EXPECT_EQ(w.field(1), want.vals());
  }
}

absl::Status ParseBytes(const std::string& bytes) {
  WireFields w;
  proto::PushRequest meta;
  std::vector<grpc::Slice> s;
  s.emplace_back(bytes);
  return w.Parse(std::move(s), kPushBig, &meta);
}

TEST(WireFieldsTest, MalformedInputIsRefusedWithWhatIsWrong) {
  // Field 7 (vals) as a varint.
  absl::Status st = ParseBytes(std::string("\x38\x05", 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("field 7"), absl::string_view::npos) << st;
  // A start-group wire type.
  st = ParseBytes(std::string("\x0b", 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("wire type 3"), absl::string_view::npos) << st;
  // Field number 0.
  st = ParseBytes(std::string("\x00\x01", 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // A varint of 11 bytes.
  st = ParseBytes(std::string("\x08") + std::string(10, '\xff') + "\x01");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // A length beyond the end.
  st = ParseBytes(std::string("\x3a\x10\x01\x02", 4));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("truncated"), absl::string_view::npos) << st;
  // A huge length (2^63) does not wrap.
  st = ParseBytes(std::string("\x3a") + std::string(8, '\x80') + "\x80\x01");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // The rest malformed for protobuf: segments (9) holding a bad varint.
  st = ParseBytes(std::string("\x4a\x02\x08\xff", 4));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("PushRequest"), absl::string_view::npos) << st;
}

TEST(WireFieldsTest, ARepeatedFieldKeepsItsLastOccurrenceAsProtobufDoes) {
  proto::PushRequest a, b;
  a.set_vals("first...");
  b.set_vals("second..");
  b.set_worker_id(4);
  const std::string bytes = a.SerializeAsString() + b.SerializeAsString();
  proto::PushRequest want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  WireFields w;
  proto::PushRequest meta;
  std::vector<grpc::Slice> s;
  s.emplace_back(bytes);
  ASSERT_TRUE(w.Parse(std::move(s), kPushBig, &meta).ok());
  EXPECT_EQ(w.field(1), want.vals());
  EXPECT_EQ(meta.worker_id(), 4);
  EXPECT_TRUE(w.field(0).empty());
}

TEST(WireFieldsTest, NestedParsesOnOneThreadGetTheirOwnScratch) {
  const proto::PushRequest a = SamplePush(9), b = SamplePush(21);
  const std::string ab = a.SerializeAsString(), bb = b.SerializeAsString();
  for (int round = 0; round < 3; ++round) {  // the thread's buffer reused
    WireFields wa, wb;
    proto::PushRequest ma, mb;
    ASSERT_TRUE(wa.Parse(Cut(ab, {ab.size() / 2}), kPushBig, &ma).ok());
    ASSERT_TRUE(wb.Parse(Cut(bb, {bb.size() / 2}), kPushBig, &mb).ok());
    EXPECT_EQ(wa.field(0), a.keys());
    EXPECT_EQ(wa.field(1), a.vals());
    EXPECT_EQ(wb.field(0), b.keys());
    EXPECT_EQ(wb.field(1), b.vals());
  }
}

TEST(WireFieldsTest, AnOwnedScratchOutlivesItsThread) {
  const proto::PushRequest req = SamplePush(15);
  const std::string bytes = req.SerializeAsString();
  auto w = std::make_unique<WireFields>(WireFields::Scratchpad::kOwned);
  proto::PushRequest meta;
  std::thread([&] {
    ASSERT_TRUE(w->Parse(Cut(bytes, {3, bytes.size() / 2}), kPushBig, &meta)
                    .ok());
  }).join();
  EXPECT_EQ(w->field(0), req.keys());
  EXPECT_EQ(w->field(1), req.vals());
  w.reset();
}

TEST(WireFieldsTest, AnEmptyMessageHasEmptyFields) {
  WireFields w;
  proto::PullRequest meta;
  constexpr int kBig[] = {proto::PullRequest::kKeysFieldNumber};
  ASSERT_TRUE(w.Parse(grpc::ByteBuffer(), kBig, &meta).ok());
  EXPECT_TRUE(w.field(0).empty());
}

}  // namespace
}  // namespace ps
