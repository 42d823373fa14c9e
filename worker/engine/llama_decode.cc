// LlamaForCausalLM::ForwardCached: the decoder run a few positions at a time against a KV cache,
// for generation. Plain ops only (no training nodes, no checkpointing): each projection through
// LinearLayer::Forward (4-bit base plus adapter, unmerged), rotary as transformers applies it,
// and SDPA over the cached keys with the mask the new positions need.
#include <optional>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "worker/engine/base_weight_store.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {
namespace {

// Which keys positions [past, past + seq) may see among [0, past + seq): causal, and under a
// sliding window (> 0) only keys > query - window, as transformers masks them. Undefined where
// every query sees every key (one new position outside any window's reach).
at::Tensor CachedAttentionMask(int64_t past, int64_t seq, int64_t window, at::Device device) {
  const int64_t keys = past + seq;
  const bool windowed = window > 0 && keys > window;
  if (seq == 1 && !windowed) return {};
  const at::Tensor query = at::arange(past, keys, at::dtype(at::kLong).device(device)).view({seq, 1});
  const at::Tensor key = at::arange(keys, at::dtype(at::kLong).device(device)).view({1, keys});
  at::Tensor allowed = key <= query;
  if (windowed) allowed = allowed.logical_and(key > query - window);
  return allowed.view({1, 1, seq, keys});
}

}  // namespace

KvCache LlamaForCausalLM::NewKvCache(int64_t batch, int64_t capacity) const {
  return KvCache(config_.num_hidden_layers, batch, config_.num_key_value_heads, capacity,
                 config_.head_dim, at::dtype(compute_dtype_).device(device_));
}

at::Tensor LlamaForCausalLM::LayerForwardCached(const DecoderLayer& layer, int64_t index,
                                                const at::Tensor& x, const at::Tensor& cos,
                                                const at::Tensor& sin, KvCache* cache) const {
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t head_dim = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  auto split = [&](const at::Tensor& t, int64_t h) {
    return t.view({batch, seq, h, head_dim}).transpose(1, 2);
  };
  const at::Tensor n = RmsNorm(x, layer.input_layernorm, eps);
  const at::Tensor q = Rotary(split(layer.q_proj.Forward(n, false), heads), cos, sin);
  const at::Tensor k = Rotary(split(layer.k_proj.Forward(n, false), kv_heads), cos, sin);
  const at::Tensor v = split(layer.v_proj.Forward(n, false), kv_heads);
  const int64_t past = cache->length();
  auto [keys, values] = cache->Append(index, k, v);
  const int64_t window = config_.SlidingLayer(index) ? config_.sliding_window : 0;
  const at::Tensor mask = CachedAttentionMask(past, seq, window, device_);
  const at::Tensor attn = at::scaled_dot_product_attention(
      q, keys, values, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, 0.0, /*is_causal=*/false, std::nullopt, kv_heads != heads);
  const at::Tensor h =
      x + layer.o_proj.Forward(attn.transpose(1, 2).reshape({batch, seq, heads * head_dim}), false);
  const at::Tensor m = RmsNorm(h, layer.post_attention_layernorm, eps);
  const at::Tensor gate = layer.gate_proj.Forward(m, false);
  const at::Tensor up = layer.up_proj.Forward(m, false);
  return h + layer.down_proj.Forward(at::silu(gate) * up, false);
}

at::Tensor LlamaForCausalLM::ForwardCached(const at::Tensor& input_ids, KvCache* cache) const {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, seq], got ", input_ids.sizes());
  TORCH_CHECK(input_ids.size(0) == cache->batch(), "the cache holds ", cache->batch(),
              " rows, input_ids ", input_ids.size(0));
  at::NoGradGuard no_grad;
  const int64_t seq = input_ids.size(1);
  const int64_t past = cache->length();
  const at::Tensor positions =
      at::arange(past, past + seq, at::dtype(at::kLong).device(device_)).unsqueeze(0);
  const auto [cos, sin] = RotaryTables(positions);
  at::Tensor x = EmbedTokens(input_ids);
  const int64_t count = static_cast<int64_t>(layers.size());
  for (int64_t i = 0; i < count; ++i) {
    const std::shared_ptr<const DecoderLayer> whole = WholeLayer(i);
    // The next layer's weights, and after the top one the bottom one for the next step.
    if (base_weights_ != nullptr) base_weights_->Prefetch(i + 1 < count ? i + 1 : 0);
    x = LayerForwardCached(*whole, i, x, cos, sin, cache);
  }
  cache->Advance(seq);
  return RmsNorm(x, norm, config_.rms_norm_eps);
}

}  // namespace qlora::engine
