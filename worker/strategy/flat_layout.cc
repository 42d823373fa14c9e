// FlatLayout arithmetic.
#include "worker/strategy/flat_layout.h"

#include <algorithm>

namespace qlora::strategy {

FlatRange Intersect(FlatRange a, FlatRange b) {
  const FlatRange r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  return r.size() > 0 ? r : FlatRange{r.begin, r.begin};
}

FlatLayout::FlatLayout(const std::vector<int64_t>& numels, int world_size)
    : world_size_(world_size), numels_(numels) {
  for (int64_t n : numels_) {
    offsets_.push_back(numel_);
    numel_ += n;
  }
  const int64_t alignment = 2 * static_cast<int64_t>(world_size_);
  padded_numel_ = std::max<int64_t>(alignment, (numel_ + alignment - 1) / alignment * alignment);
}

std::vector<int64_t> FlatLayout::SplitByPartition(FlatRange range) const {
  std::vector<int64_t> counts(world_size_);
  for (int r = 0; r < world_size_; ++r) counts[r] = Intersect(range, Partition(r)).size();
  return counts;
}

}  // namespace qlora::strategy
