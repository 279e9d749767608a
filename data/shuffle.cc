#include "data/shuffle.h"

namespace ps {

std::unique_ptr<RowReader> NewShuffleBuffer(std::unique_ptr<RowReader> source,
                                            int64_t capacity, uint64_t key) {
  return std::make_unique<ShuffleBuffer<RowReader, RowBlock>>(
      std::move(source), capacity, key);
}

std::unique_ptr<FieldReader> NewFieldShuffleBuffer(
    std::unique_ptr<FieldReader> source, int64_t capacity, uint64_t key) {
  return std::make_unique<ShuffleBuffer<FieldReader, FieldBlock>>(
      std::move(source), capacity, key);
}

}  // namespace ps
