// The shuffle buffer the file readers are read through when data.shuffle is
// on (worker/data.h, ShuffleOptions): the in-memory half of shuffling data
// larger than memory, after the block-level half (a shard's byte ranges
// visited in a seeded order).
#pragma once

#include <cstdint>
#include <memory>

#include "worker/data.h"

namespace ps {

// Reads `source` through a shuffle buffer of `capacity` rows (>= 1), as
// tf.data's shuffle does: the buffer is kept full from the source, and each
// row handed out is drawn uniformly from it (ShuffleRng(key)). Every row of
// the source comes out exactly once per pass, and none comes out more than
// capacity - 1 places before its place in the source (capacity 1: the
// source's order).
//
// Memory: at most 2 * capacity parsed rows, whatever the source's size (the
// holes rows handed out leave are compacted once there are `capacity` of
// them). Next's errors are the source's; rows the source read before an
// error stay in the buffer and come out later, so a caller that goes on
// after an error (as it may with the source) loses no row. Reset resets the
// source and replays the same order. stats() and path() are the source's:
// stats count rows read from the source, of which up to `capacity` may still
// be in the buffer until the pass ends. Not thread-safe: one caller.
std::unique_ptr<RowReader> NewShuffleBuffer(std::unique_ptr<RowReader> source,
                                            int64_t capacity, uint64_t key);

}  // namespace ps
