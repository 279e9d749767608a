#include "data/criteo.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/hash.h"

namespace ps {

namespace {

std::string Quote(std::string_view sv) {
  constexpr size_t kMax = 64;
  // absl::string_view is not std::string_view in this Abseil build.
  const absl::string_view s(sv.data(), std::min(sv.size(), kMax));
  return absl::StrCat("'", s, sv.size() > kMax ? "...'" : "'");
}

// Parses all of s as an int64 (an optional leading '+' allowed).
bool ParseInt64(std::string_view s, int64_t* v) {
  const char* b = s.data();
  const char* e = b + s.size();
  if (b < e && *b == '+') ++b;
  if (b == e || *b == '+') return false;
  auto [p, ec] = std::from_chars(b, e, *v);
  return ec == std::errc() && p == e;
}

}  // namespace

CriteoParse ParseCriteoLine(std::string_view line, CriteoLine* out,
                            std::string* reason) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) return CriteoParse::kBlank;
  // Split: field 0 is the label, 1..39 the features; count the rest.
  std::string_view label;
  const char* p = line.data();
  const char* const e = p + line.size();
  int n = 0;
  while (true) {
    const char* tab = static_cast<const char*>(std::memchr(p, '\t', e - p));
    const char* fe = tab != nullptr ? tab : e;
    if (n == 0) {
      label = std::string_view(p, fe - p);
    } else if (n < kCriteoTsvFields) {
      out->fields[n - 1] = std::string_view(p, fe - p);
    } else {
      n += 1 + static_cast<int>(std::count(fe, e, '\t'));
      break;
    }
    ++n;
    if (tab == nullptr) break;
    p = tab + 1;
  }
  if (n != kCriteoTsvFields) {
    *reason = absl::StrCat("expected ", kCriteoTsvFields,
                           " tab-separated fields, got ", n);
    return CriteoParse::kBad;
  }
  int64_t y;
  if (!ParseInt64(label, &y)) {
    *reason = absl::StrCat("bad label ", Quote(label));
    return CriteoParse::kBad;
  }
  out->label = y > 0 ? 1.0f : 0.0f;
  for (int i = 0; i < kCriteoIntFields; ++i) {
    const std::string_view f = out->fields[i];
    if (!f.empty() && !ParseInt64(f, &out->ints[i])) {
      *reason = absl::StrCat("bad integer ", Quote(f), " in field I", i + 1);
      return CriteoParse::kBad;
    }
  }
  return CriteoParse::kRow;
}

int64_t CriteoBucket(int64_t v) {
  if (v <= 2) return v;
  const double l = std::log(static_cast<double>(v));
  return static_cast<int64_t>(std::floor(l * l));
}

uint64_t CriteoFieldKey(const CriteoLine& line, int field) {
  if (field < kCriteoIntFields) {
    return FeatureKey(static_cast<uint64_t>(CriteoBucket(line.ints[field])),
                      static_cast<uint64_t>(field));
  }
  return FeatureKey(HashBytes(line.fields[field]),
                    static_cast<uint64_t>(field));
}

uint64_t MissingFieldKey(int field) {
  return FeatureKey(0x6d697373696e67ULL /* "missing" */ ^ 0xffff000000000000ULL,
                    static_cast<uint64_t>(field));
}

}  // namespace ps
