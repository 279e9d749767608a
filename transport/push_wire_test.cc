// PushWire: the zero-copy form of a push is byte for byte a PushRequest,
// whatever fields it has, and keeps the request alive while gRPC holds it.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "transport/data_plane.h"
#include "transport/grpc_transport.h"

namespace ps {
namespace {

using google::protobuf::FieldDescriptor;

// Sets every field of `m` (recursively for messages) to a non-default
// value, so a field PushWire forgets to carry shows up as a difference.
void FillEveryField(google::protobuf::Message* m, int depth = 0) {
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  const google::protobuf::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        if (depth < 2) FillEveryField(r->AddMessage(m, f), depth + 1);
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
        r->AddInt64(m, f, 11);
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
        r->AddInt32(m, f, 11);
      }
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, 3 + i); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, 5 + i); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, 7 + i); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, 9 + i); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, true); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, 1.5f); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, 2.5); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, "abc"); break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnumValue(m, f, f->enum_type()->value(
                                  f->enum_type()->value_count() - 1)->number());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 2) FillEveryField(r->MutableMessage(m, f), depth + 1);
        break;
    }
  }
}

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bb.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

TEST(PushWireTest, LargePushIsAPushRequestWithEveryField) {
  auto req = std::make_shared<proto::PushRequest>();
  FillEveryField(req.get());
  req->set_keys(std::string(8 * 10000, '\x01'));
  req->set_vals(std::string(4 * 100000, '\x02'));
  std::weak_ptr<proto::PushRequest> alive = req;
  grpc::ByteBuffer bb = PushWire(req);
  const proto::PushRequest want = *req;
  req.reset();
  EXPECT_FALSE(alive.expired()) << "the slices keep the request alive";
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(bb.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 4u) << "head+tag, keys, tag, vals";
  proto::PushRequest got;
  ASSERT_TRUE(got.ParseFromString(Flatten(bb)));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want))
      << got.ShortDebugString().substr(0, 400);
  slices.clear();
  bb.Clear();
  EXPECT_TRUE(alive.expired()) << "released with the last slice";
}

TEST(PushWireTest, SmallPushIsSerializedAsUsual) {
  auto req = std::make_shared<proto::PushRequest>();
  FillEveryField(req.get());
  grpc::ByteBuffer bb = PushWire(req);
  EXPECT_EQ(Flatten(bb), req->SerializeAsString());
  // Empty keys (a cached key list) with large values: no keys field.
  req->clear_keys();
  req->set_vals(std::string(kMinZeroCopyBytes, '\x03'));
  proto::PushRequest got;
  ASSERT_TRUE(got.ParseFromString(Flatten(PushWire(req))));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, *req));
}

// ZPush (issue 10): borrowed values are the vals field, each piece a slice
// of the caller's memory that keeps the owner alive.
TEST(PushWireTest, BorrowedValuesAreTheValsFieldAndKeepTheirOwner) {
  auto req = std::make_shared<proto::PushRequest>();
  FillEveryField(req.get());
  req->clear_vals();
  req->set_keys(std::string(8 * 10000, '\x01'));
  auto owner = std::make_shared<std::string>(3 * 50000, '\0');
  for (size_t i = 0; i < owner->size(); ++i) (*owner)[i] = static_cast<char>(i * 7);
  BorrowedValues b;
  b.owner = owner;
  const absl::Span<const char> all(*owner);
  b.pieces = {all.subspan(0, 50000), all.subspan(50000, 0),
              all.subspan(50000, 100000)};
  proto::PushRequest want = *req;
  want.set_vals(*owner);
  std::weak_ptr<std::string> alive = owner;
  grpc::ByteBuffer bb = PushWire(req, &b);
  owner.reset();
  b = BorrowedValues();
  EXPECT_FALSE(alive.expired()) << "the slices keep the owner alive";
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(bb.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 5u) << "head+tag, keys, tag, two pieces";
  proto::PushRequest got;
  ASSERT_TRUE(got.ParseFromString(Flatten(bb)));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want));
  slices.clear();
  bb.Clear();
  EXPECT_TRUE(alive.expired()) << "released with the last slice";

  // Small: serialized as one copy, the same bytes.
  auto small = std::make_shared<proto::PushRequest>();
  small->set_worker_id(3);
  const std::string v(40, '\x09');
  BorrowedValues few{nullptr, {absl::Span<const char>(v)}};
  proto::PushRequest small_want = *small;
  small_want.set_vals(v);
  EXPECT_EQ(Flatten(PushWire(small, &few)), small_want.SerializeAsString());
}

// A worker's push (issue 10): its keys borrowed from the worker's own
// string, the values in the request or borrowed too.
TEST(PushWireTest, BorrowedKeysAreTheKeysFieldAndKeepTheirOwner) {
  auto keys = std::make_shared<std::string>(8 * 10000, '\0');
  for (size_t i = 0; i < keys->size(); ++i) (*keys)[i] = static_cast<char>(i * 5);
  for (bool borrow_vals : {false, true}) {
    auto req = std::make_shared<proto::PushRequest>();
    FillEveryField(req.get());
    req->clear_keys();
    auto vals = std::make_shared<std::string>(4 * 10000, '\x04');
    BorrowedValues b;
    b.keys = absl::Span<const char>(*keys);
    b.keys_owner = keys;
    if (borrow_vals) {
      req->clear_vals();
      b.owner = vals;
      b.pieces = {absl::Span<const char>(*vals)};
    } else {
      req->set_vals(*vals);
    }
    proto::PushRequest want = *req;
    want.set_keys(*keys);
    want.set_vals(*vals);
    std::weak_ptr<std::string> keys_alive = keys;
    grpc::ByteBuffer bb = PushWire(req, &b);
    keys.reset();
    b = BorrowedValues();
    EXPECT_FALSE(keys_alive.expired()) << "the slices keep the keys alive";
    proto::PushRequest got;
    ASSERT_TRUE(got.ParseFromString(Flatten(bb)));
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want))
        << borrow_vals;
    bb.Clear();
    EXPECT_TRUE(keys_alive.expired()) << "released with the last slice";
    keys = std::make_shared<std::string>(want.keys());
  }
  // Small: serialized as one copy, the same bytes.
  auto small = std::make_shared<proto::PushRequest>();
  small->set_worker_id(3);
  small->set_vals(std::string(12, '\x07'));
  const std::string k(16, '\x01');
  BorrowedValues few;
  few.keys = absl::Span<const char>(k);
  proto::PushRequest small_want = *small;
  small_want.set_keys(k);
  EXPECT_EQ(Flatten(PushWire(small, &few)), small_want.SerializeAsString());
}

// The data plane's metas (transport/data_plane.h): every field but the
// ones that travel apart, so a field added to the request and forgotten
// there shows up here.
TEST(DataPlaneHeadTest, PushAndPullHeadsCarryEveryOtherField) {
  proto::PushRequest push;
  FillEveryField(&push);
  proto::PushRequest push_want = push;
  push_want.clear_keys();
  push_want.clear_vals();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      PushHead(push), push_want));
  proto::PullRequest pull;
  FillEveryField(&pull);
  proto::PullRequest pull_want = pull;
  pull_want.clear_keys();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      PullHead(pull), pull_want))
      << PullHead(pull).ShortDebugString();
}

TEST(PullReplyWireTest, IsAPullResponseWithTheSliceAsVals) {
  proto::PullResponse head;
  FillEveryField(&head);
  head.clear_vals();
  std::string vals(4 * 1000, '\x05');
  grpc::Slice slice(vals.size());
  std::memcpy(const_cast<uint8_t*>(slice.begin()), vals.data(), vals.size());
  proto::PullResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(PullReplyWire(head, slice))));
  proto::PullResponse want = head;
  want.set_vals(vals);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want));
  // No values (a pull of no keys): the head alone.
  EXPECT_EQ(Flatten(PullReplyWire(head, grpc::Slice())),
            head.SerializeAsString());
}

}  // namespace
}  // namespace ps
