// The keys and values a decoder has computed so far, per layer, for incremental decoding
// (LlamaForCausalLM::ForwardCached): each layer's buffers are allocated once for the whole
// generation ([batch, kv_heads, capacity, head_dim] in the compute dtype), and each step writes
// its tokens' keys and values after the ones before, so a step reads the prefix in place
// instead of concatenating it again.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::engine {

class KvCache {
 public:
  // Room for `capacity` positions of `batch` rows in each of `layers` layers.
  KvCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
          const at::TensorOptions& options);

  int64_t length() const { return length_; }      // positions written in every layer
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }

  // Writes layer `layer`'s keys and values for positions [length, length + k.size(2)) and
  // returns views of every position written so far in that layer ([batch, kv_heads, length +
  // new, head_dim]). Advance() moves `length` on once every layer has been given its part.
  std::pair<at::Tensor, at::Tensor> Append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  void Advance(int64_t positions);

 private:
  std::vector<at::Tensor> keys_, values_;
  int64_t batch_, capacity_;
  int64_t length_ = 0;
};

}  // namespace qlora::engine
