// The Criteo TSV line format, parsed once for every model that reads it:
// logistic regression (OpenCriteo, one-hot features of the present fields)
// and the MLP (OpenCriteoFields, one key per field, an empty field its own
// key). Both readers call ParseCriteoLine and build their rows from
// CriteoFieldKey, so they accept the same lines, give the same keys and
// report a malformed line with the same reason.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ps {

inline constexpr int kCriteoIntFields = 13;  // I1..I13
inline constexpr int kCriteoCatFields = 26;  // C1..C26
// The features of a row: field f < 13 is integer field I(f+1), field
// f >= 13 categorical field C(f-12).
inline constexpr int kCriteoNumFields = kCriteoIntFields + kCriteoCatFields;
// Tab-separated fields of a line: the label and the 39 features.
inline constexpr int kCriteoTsvFields = 1 + kCriteoNumFields;

// One line, split and validated by ParseCriteoLine. The views point into the
// parsed line: valid while it is.
struct CriteoLine {
  float label = 0;  // 0 or 1
  // The text of each feature field; empty: the field is missing.
  std::string_view fields[kCriteoNumFields];
  // The value of each present integer field (unset for a missing one).
  int64_t ints[kCriteoIntFields];

  bool present(int field) const { return !fields[field].empty(); }
};

enum class CriteoParse { kRow, kBlank, kBad };

// Parses one line of "label \t I1..I13 \t C1..C26" (without its '\n'; a
// trailing '\r' is ignored). Returns:
//   kBlank for an empty line (not a row, not an error; *out untouched);
//   kRow with *out set: label an integer, > 0 -> 1, otherwise 0 (an optional
//     leading '+'); each non-empty integer field an int64 (the same);
//     categorical fields any bytes but a tab;
//   kBad with *reason set (and *out unspecified), the first of, in order:
//     "expected 40 tab-separated fields, got N",
//     "bad label 'TEXT'", "bad integer 'TEXT' in field I<n>"
//     (TEXT cut to 64 bytes, then "...").
// Allocates nothing except on the kBad path. Thread-safe (no state).
CriteoParse ParseCriteoLine(std::string_view line, CriteoLine* out,
                            std::string* reason);

// The log^2 bucket of integer value v: floor(ln(v)^2) for v > 2, otherwise v
// itself (so a negative value keeps its own bucket).
int64_t CriteoBucket(int64_t v);

// The feature key of present field `field` of a parsed line (common/hash.h):
// integer field i -> FeatureKey(CriteoBucket(value), i), as a
// two's-complement uint64; categorical field f -> FeatureKey(HashBytes(text),
// f).
uint64_t CriteoFieldKey(const CriteoLine& line, int field);

// The key standing for a missing (empty) field `field`, which the MLP embeds
// as a value of its own: a fixed feature id in the field's namespace,
// distinct from the keys of present values but for a 64-bit collision.
uint64_t MissingFieldKey(int field);

}  // namespace ps
