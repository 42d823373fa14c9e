// Where each trainable parameter lives in the flattened buffer that ZeRO partitions (DeepSpeed
// stage_1_and_2.py): parameters back to back in their given order, padded at the end to a
// multiple of 2 x world_size (nccl_start_alignment_factor 2), cut into world_size equal
// partitions. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace qlora::strategy {

// A half-open range of flat indices.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};

// Intersection of two ranges (empty when they do not overlap).
FlatRange Intersect(FlatRange a, FlatRange b);

class FlatLayout {
 public:
  FlatLayout(const std::vector<int64_t>& numels, int world_size);

  int world_size() const { return world_size_; }
  int64_t numel() const { return numel_; }                  // sum of the parameters' sizes
  int64_t padded_numel() const { return padded_numel_; }    // multiple of 2 x world_size
  int64_t partition_numel() const { return padded_numel_ / world_size_; }
  int num_params() const { return static_cast<int>(offsets_.size()); }
  FlatRange Param(int index) const { return {offsets_[index], offsets_[index] + numels_[index]}; }
  FlatRange Partition(int rank) const {
    return {rank * partition_numel(), (rank + 1) * partition_numel()};
  }
  // Element count of each rank's share of `range` (the counts of a reduce-scatter of it).
  std::vector<int64_t> SplitByPartition(FlatRange range) const;

 private:
  int world_size_;
  std::vector<int64_t> numels_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
};

}  // namespace qlora::strategy
