#include "transport/wire_fields.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace ps {

struct WireFields::Scratch {
  std::unique_ptr<char[]> data;  // operator new[]: aligned for kAlign
  size_t cap = 0;
  bool busy = false;

  char* Get(size_t n) {
    if (cap < n) {
      data.reset();  // the old buffer goes before the new one is made
      data.reset(new char[n]);
      cap = n;
    }
    return data.get();
  }
};

namespace {

// A position in a sequence of slices, read forwards.
class Reader {
 public:
  explicit Reader(const std::vector<grpc::Slice>& slices) : s_(slices) {
    SkipEmpty();
  }

  size_t pos() const { return pos_; }
  bool done() const { return idx_ == s_.size(); }

  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) return false;
      const uint8_t b = s_[idx_].begin()[off_];
      Advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }

  // Skips n bytes; false (and at the end) if fewer are left.
  bool Skip(uint64_t n) {
    while (n > 0) {
      if (done()) return false;
      const size_t here = std::min<uint64_t>(n, s_[idx_].size() - off_);
      Advance(here);
      n -= here;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    off_ += n;
    pos_ += n;
    SkipEmpty();
  }
  void SkipEmpty() {
    while (idx_ < s_.size() && off_ == s_[idx_].size()) {
      ++idx_;
      off_ = 0;
    }
  }

  const std::vector<grpc::Slice>& s_;
  size_t idx_ = 0;
  size_t off_ = 0;
  size_t pos_ = 0;
};

// Global byte offsets of the slices' starts, for random access.
class Index {
 public:
  explicit Index(const std::vector<grpc::Slice>& slices) : s_(slices) {
    starts_.reserve(slices.size());
    size_t at = 0;
    for (const grpc::Slice& s : slices) {
      starts_.push_back(at);
      at += s.size();
    }
  }

  // [pos, pos + n) when it lies within one slice (n > 0), else null.
  const char* Contiguous(size_t pos, size_t n) const {
    const size_t i = Find(pos);
    const size_t off = pos - starts_[i];
    if (off + n > s_[i].size()) return nullptr;
    return reinterpret_cast<const char*>(s_[i].begin()) + off;
  }

  // Copies [pos, pos + n) to dst; the range is known to exist.
  void Copy(size_t pos, size_t n, char* dst) const {
    size_t i = Find(pos);
    size_t off = pos - starts_[i];
    while (n > 0) {
      const size_t here = std::min(n, s_[i].size() - off);
      std::memcpy(dst, s_[i].begin() + off, here);
      dst += here;
      n -= here;
      ++i;
      off = 0;
    }
  }

 private:
  // The non-empty slice holding byte `pos`.
  size_t Find(size_t pos) const {
    size_t i = static_cast<size_t>(
                   std::upper_bound(starts_.begin(), starts_.end(), pos) -
                   starts_.begin()) -
               1;
    while (s_[i].size() == 0) ++i;  // an empty slice shares its start
    return i;
  }

  const std::vector<grpc::Slice>& s_;
  std::vector<size_t> starts_;
};

// A field's payload: its byte offset in the message and its length.
struct Span {
  size_t pos = 0;
  size_t len = 0;
};

// `len` rounded up to WireFields::kAlign (each copied field starts aligned).
size_t Padded(size_t len) {
  return (len + WireFields::kAlign - 1) / WireFields::kAlign *
         WireFields::kAlign;
}

}  // namespace

WireFields::~WireFields() {
  if (scratch_ == nullptr) return;
  if (owns_scratch_) {
    delete scratch_;
    return;
  }
  // The thread's buffer is that thread's alone (a programming error, not
  // something a peer can cause).
  ABSL_RAW_CHECK(parsed_on_ == std::this_thread::get_id(),
                 "WireFields with a thread scratchpad destroyed on another "
                 "thread");
  scratch_->busy = false;
  if (scratch_->cap > kKeepScratchBytes) {
    scratch_->data.reset();
    scratch_->cap = 0;
  }
}

absl::Status WireFields::Parse(const grpc::ByteBuffer& buf,
                               absl::Span<const int> big,
                               google::protobuf::MessageLite* meta) {
  std::vector<grpc::Slice> slices;
  if (buf.Valid() && !buf.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("unreadable message buffer");
  }
  return Parse(std::move(slices), big, meta);
}

absl::Status WireFields::Parse(std::vector<grpc::Slice> slices,
                               absl::Span<const int> big,
                               google::protobuf::MessageLite* meta) {
  slices_ = std::move(slices);
  views_.assign(big.size(), absl::string_view());
  absl::InlinedVector<Span, 2> spans(big.size());
  // The other fields' byte ranges, copied together for protobuf.
  absl::InlinedVector<std::pair<size_t, size_t>, 4> rest;
  Reader r(slices_);
  size_t run_start = 0;
  while (!r.done()) {
    const size_t field_start = r.pos();
    uint64_t tag = 0;
    if (!r.ReadVarint(&tag) || tag > 0xffffffffu || (tag >> 3) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed field tag at byte ", field_start));
    }
    const int number = static_cast<int>(tag >> 3);
    const int wire_type = static_cast<int>(tag & 7);
    const auto which = std::find(big.begin(), big.end(), number);
    uint64_t len = 0;
    bool ok = true;
    switch (wire_type) {
      case 0:
        ok = r.ReadVarint(&len);
        len = 0;
        break;
      case 1:
        len = 8;
        break;
      case 2:
        ok = r.ReadVarint(&len);
        break;
      case 5:
        len = 4;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "field ", number, ": unsupported wire type ", wire_type));
    }
    if (which != big.end() && wire_type != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field ", number, ": wire type ", wire_type,
          ", expected length-delimited bytes"));
    }
    const size_t payload = r.pos();
    if (!ok || !r.Skip(len)) {
      return absl::InvalidArgumentError(
          absl::StrCat("field ", number, " at byte ", field_start,
                       " is truncated"));
    }
    if (which == big.end()) continue;
    if (field_start > run_start) rest.emplace_back(run_start, field_start);
    run_start = r.pos();
    spans[static_cast<size_t>(which - big.begin())] =
        Span{payload, static_cast<size_t>(len)};
  }
  if (r.pos() > run_start) rest.emplace_back(run_start, r.pos());

  const Index index(slices_);
  std::string head;
  for (const auto& [a, b] : rest) {
    const size_t at = head.size();
    head.resize(at + (b - a));
    index.Copy(a, b - a, head.data() + at);
  }
  if (!meta->ParseFromString(head)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", meta->GetTypeName()));
  }

  // Views in place where possible; the rest (non-empty, still without a
  // view) into one scratch buffer.
  size_t need = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].len == 0) continue;
    const char* p = index.Contiguous(spans[i].pos, spans[i].len);
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % kAlign == 0) {
      views_[i] = absl::string_view(p, spans[i].len);
    } else {
      need += Padded(spans[i].len);
    }
  }
  char* dst = nullptr;
  if (need > 0) {
    static thread_local Scratch mine;
    if (pad_ == Scratchpad::kThread && !mine.busy) {
      scratch_ = &mine;
      parsed_on_ = std::this_thread::get_id();
    } else {  // kOwned, or a nested parse on this thread
      scratch_ = new Scratch;
      owns_scratch_ = true;
    }
    scratch_->busy = true;
    dst = scratch_->Get(need);
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].len == 0 || !views_[i].empty()) continue;
    index.Copy(spans[i].pos, spans[i].len, dst);
    views_[i] = absl::string_view(dst, spans[i].len);
    copied_ += spans[i].len;
    dst += Padded(spans[i].len);
  }
  return absl::OkStatus();
}

}  // namespace ps
