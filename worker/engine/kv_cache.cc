// KvCache: preallocated per-layer key and value buffers written position after position.
#include "worker/engine/kv_cache.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace qlora::engine {

KvCache::KvCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t capacity,
                 int64_t head_dim, const at::TensorOptions& options)
    : batch_(batch), capacity_(capacity) {
  TORCH_CHECK(layers >= 0 && batch > 0 && kv_heads > 0 && capacity > 0 && head_dim > 0,
              "KvCache: bad sizes");
  for (int64_t i = 0; i < layers; ++i) {
    keys_.push_back(at::empty({batch, kv_heads, capacity, head_dim}, options));
    values_.push_back(at::empty({batch, kv_heads, capacity, head_dim}, options));
  }
}

std::pair<at::Tensor, at::Tensor> KvCache::Append(int64_t layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(keys_.size()), "KvCache: no layer ",
              layer);
  const int64_t added = k.size(2);
  TORCH_CHECK(length_ + added <= capacity_, "KvCache: ", length_ + added,
              " positions exceed the capacity of ", capacity_);
  keys_[layer].narrow(2, length_, added).copy_(k);
  values_[layer].narrow(2, length_, added).copy_(v);
  return {keys_[layer].narrow(2, 0, length_ + added), values_[layer].narrow(2, 0, length_ + added)};
}

void KvCache::Advance(int64_t positions) {
  TORCH_CHECK(positions >= 0 && length_ + positions <= capacity_, "KvCache: bad advance");
  length_ += positions;
}

}  // namespace qlora::engine
