// Reading a received message's large bytes fields without copying them into
// protobuf (issue 10). A push's keys and values, a pull's keys: protobuf
// would allocate a string per field and copy every byte into it (zero-
// filling first for large ones); here the field stays where gRPC received
// it when it lies in one slice, and is otherwise copied once into a buffer
// the calling thread keeps warm between requests.
#pragma once

#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include <google/protobuf/message_lite.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

namespace ps {

class WireFields {
 public:
  // Views' alignment: a field is viewed in place only at an address this
  // aligned (keys are uint64, values float32); otherwise it is copied.
  static constexpr size_t kAlign = 8;
  // The scratch buffer a thread keeps between requests is given back when a
  // request needed more than this (a rare huge request does not pin its
  // size on every RPC thread).
  static constexpr size_t kKeepScratchBytes = 8u << 20;

  // kThread: a field that must be copied goes into a buffer the parsing
  // thread keeps warm between requests; the object must then be destroyed
  // on that thread, before its next Parse (a request handled synchronously
  // in the RPC handler). kOwned: into a buffer of this object's own, for
  // views that outlive the handler (a pull that waits).
  enum class Scratchpad { kThread, kOwned };
  explicit WireFields(Scratchpad pad = Scratchpad::kThread) : pad_(pad) {}
  WireFields(const WireFields&) = delete;
  WireFields& operator=(const WireFields&) = delete;
  ~WireFields();

  // Parses the serialized message in `slices` (in order): the length-
  // delimited fields numbered `big` become field(0), field(1), ... (empty
  // when absent; the last occurrence when repeated, as protobuf does), and
  // every other field is parsed into `*meta` (which must have no field
  // numbered as in `big`). INVALID_ARGUMENT names what is malformed: a
  // truncated tag, length or field, a group or reserved wire type, a `big`
  // field that is not length-delimited, or a rest protobuf rejects.
  // The views stay valid while this object lives (they point into `slices`,
  // which it keeps, or into its scratch); call Parse once per object.
  absl::Status Parse(std::vector<grpc::Slice> slices,
                     absl::Span<const int> big,
                     google::protobuf::MessageLite* meta);
  // Same, from a received ByteBuffer (its slices are shared, not copied).
  absl::Status Parse(const grpc::ByteBuffer& buf, absl::Span<const int> big,
                     google::protobuf::MessageLite* meta);

  absl::string_view field(size_t i) const { return views_[i]; }
  // Bytes copied into the scratch (0 when every field was viewed in place).
  size_t copied() const { return copied_; }

 private:
  struct Scratch;
  const Scratchpad pad_;
  std::vector<grpc::Slice> slices_;
  absl::InlinedVector<absl::string_view, 2> views_;
  Scratch* scratch_ = nullptr;  // the thread's, or owned
  bool owns_scratch_ = false;
  std::thread::id parsed_on_;
  size_t copied_ = 0;
};

}  // namespace ps
