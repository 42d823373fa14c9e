// Document layouts, the flash varlen autograd node and the masked reference (varlen_attention.h).
#include "worker/engine/varlen_attention.h"

#include <limits>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ops/_flash_attention_backward.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/engine/activation_offload.h"

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// flash-attention's window: keys within `left` positions before the query (-1: unbounded).
int64_t FlashWindowLeft(int64_t window) { return window > 0 ? window - 1 : -1; }

// One autograd node over ATen's flash kernels, on flattened tokens: q [total, heads, head_dim],
// k, v [total, kv_heads, head_dim] (last dim contiguous) -> [total, heads, head_dim]. The
// kernels handle grouped-query heads themselves (dk, dv come back at kv_heads).
struct FlashVarlenFunction : public torch::autograd::Function<FlashVarlenFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& cu_seqlens,
                            int64_t max_length, int64_t window_left) {
    auto [out, logsumexp, rng_state, philox_offset, debug_mask] = at::_flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, /*dropout_p=*/0.0,
        /*is_causal=*/true, /*return_debug_mask=*/false, /*scale=*/std::nullopt,
        /*window_size_left=*/window_left, /*window_size_right=*/0);
    SaveForBackward(ctx, {q, k, v, out, logsumexp});
    ctx->saved_data["cu_seqlens"] = cu_seqlens;
    ctx->saved_data["rng_state"] = rng_state;
    ctx->saved_data["philox_offset"] = philox_offset;
    ctx->saved_data["max_length"] = max_length;
    ctx->saved_data["window_left"] = window_left;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad = grad_outputs[0];
    const variable_list saved = SavedForBackward(ctx);
    if (!grad.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
                                 at::Tensor(), at::Tensor()};
    const at::Tensor cu_seqlens = ctx->saved_data["cu_seqlens"].toTensor();
    const int64_t max_length = ctx->saved_data["max_length"].toInt();
    auto [grad_q, grad_k, grad_v] = at::_flash_attention_backward(
        grad.contiguous(), saved[0], saved[1], saved[2], saved[3], saved[4], cu_seqlens,
        cu_seqlens, max_length, max_length, /*dropout_p=*/0.0, /*is_causal=*/true,
        ctx->saved_data["rng_state"].toTensor(), ctx->saved_data["philox_offset"].toTensor(),
        /*scale=*/std::nullopt, /*window_size_left=*/ctx->saved_data["window_left"].toInt(),
        /*window_size_right=*/0);
    return {grad_q, grad_k, grad_v, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// [batch, heads, seq, head_dim] -> [batch * seq, heads, head_dim]: a view when the tensor lies
// in memory as [batch, seq, heads, head_dim] (the projections' layout), a copy otherwise.
at::Tensor Tokens(const at::Tensor& x) {
  at::Tensor tokens = x.transpose(1, 2).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)});
  return tokens.stride(-1) == 1 ? tokens : tokens.contiguous();
}

}  // namespace

DocumentLayout DocumentLayout::FromPositions(const at::Tensor& position_ids,
                                             const c10::Device& device) {
  TORCH_CHECK(position_ids.dim() == 2 && position_ids.size(1) > 0,
              "position_ids must be [batch, seq] with seq > 0, got ", position_ids.sizes());
  const at::Tensor positions = position_ids.to(at::kCPU, at::kLong);
  const int64_t total = positions.numel();
  TORCH_CHECK(total <= std::numeric_limits<int32_t>::max(),
              "packed batch of ", total, " tokens exceeds int32 offsets");
  const at::Tensor restarts = positions.eq(0);
  at::Tensor starts = restarts.clone();
  starts.select(1, 0).fill_(true);  // every row starts a document
  const at::Tensor offsets = at::cat(
      {at::nonzero(starts.reshape({-1})).reshape({-1}), at::full({1}, total, at::kLong)});

  DocumentLayout layout;
  layout.max_length = (offsets.slice(0, 1) - offsets.slice(0, 0, -1)).max().item<int64_t>();
  layout.cu_seqlens = offsets.to(at::kInt).to(device);
  layout.document_ids = restarts.cumsum(-1).to(device);
  return layout;
}

bool FlashVarlenApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::ScalarType dtype = q.scalar_type();
  const int64_t head_dim = q.size(-1);
  return q.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf) &&
         k.scalar_type() == dtype && v.scalar_type() == dtype && head_dim % 8 == 0 &&
         head_dim <= 256 && at::globalContext().userEnabledFlashSDP();
}

at::Tensor FlashVarlenCausalAttention(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const DocumentLayout& documents,
                                      int64_t window) {
  TORCH_CHECK(FlashVarlenApplies(q, k, v),
              "flash varlen attention needs CUDA bf16/fp16 inputs with head_dim % 8 == 0 and "
              "<= 256, and SDPA's flash backend enabled");
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), head_dim = q.size(3);
  const at::Tensor out = FlashVarlenFunction::apply(Tokens(q), Tokens(k), Tokens(v),
                                                    documents.cu_seqlens, documents.max_length,
                                                    FlashWindowLeft(window));
  return out.view({batch, seq, heads, head_dim}).transpose(1, 2);
}

at::Tensor MaskedVarlenCausalAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const DocumentLayout& documents,
                                       int64_t window) {
  const int64_t seq = q.size(2);
  const int64_t effective_window = window > 0 && seq > window ? window : 0;
  at::Tensor mask;
  {
    std::lock_guard<std::mutex> lock(documents.masks->mutex);
    at::Tensor& cached = documents.masks->by_window[effective_window];
    if (!cached.defined()) {
      const at::Tensor& run = documents.document_ids;
      const at::Tensor same_run = run.unsqueeze(-1).eq(run.unsqueeze(-2));  // [batch, seq, seq]
      at::Tensor allowed = at::ones({seq, seq}, at::dtype(at::kBool).device(q.device())).tril();
      // key > query - window
      if (effective_window > 0) allowed = allowed.triu(-(effective_window - 1));
      cached = at::logical_and(same_run, allowed).unsqueeze(1);  // [batch, 1, seq, seq]
    }
    mask = cached;
  }
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, std::nullopt,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
}

at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const DocumentLayout& documents, int64_t window) {
  return FlashVarlenApplies(q, k, v) ? FlashVarlenCausalAttention(q, k, v, documents, window)
                                     : MaskedVarlenCausalAttention(q, k, v, documents, window);
}

}  // namespace qlora::engine
