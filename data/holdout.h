// The validation split (data.validation_fraction): which training rows are
// held out, and readers that keep one side of the split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "data/data.h"

namespace ps {

// Whether row `row` of `block` is a validation row: a hash of its label,
// keys and value bits, seeded by `seed`, falls below `fraction`. A pure
// function of the row's content, so every reader of the same file (any
// shard, any order, any worker) puts a row on the same side.
bool IsValidationRow(const RowBlock& block, size_t row, uint64_t seed,
                     double fraction);

// The same for a field row (the mlp model's): a hash of its label and its
// keys, seeded by `seed`.
bool IsValidationRow(const FieldBlock& block, size_t row, uint64_t seed,
                     double fraction);

// Wraps `inner` so that only its validation rows (keep_validation) or only
// its training rows (!keep_validation) come out, in inner's order.
// Next/Reset/stats/path follow RowReader's contract; stats() are inner's
// (rows read on both sides). `fraction` in [0, 1].
std::unique_ptr<RowReader> NewHoldoutReader(std::unique_ptr<RowReader> inner,
                                            uint64_t seed, double fraction,
                                            bool keep_validation);
// The same over field rows.
std::unique_ptr<FieldReader> NewFieldHoldoutReader(
    std::unique_ptr<FieldReader> inner, uint64_t seed, double fraction,
    bool keep_validation);

}  // namespace ps
