// Causal attention within the documents of packed rows (variable-length attention): a token
// attends to the earlier tokens of its own document only, optionally within a sliding window.
//
// A document starts at each position id 0 and at the start of every row (so a row's leading
// tokens before its first 0 form one document, as do padding runs). The layout keeps both
// forms the two paths need, computed once per forward pass and shared by all layers:
//
//   flash  (CUDA, bf16/fp16, head_dim % 8 == 0 and <= 256): ATen's flash-attention varlen
//          kernels over the flattened [batch * seq, heads, head_dim] tokens, split by
//          cu_seqlens; memory and time as for unpacked causal attention (no mask).
//   masked (everywhere else: CPU, fp32): SDPA with the dense block-diagonal causal mask
//          [batch, 1, seq, seq], the computation packed rows always had (fp32 results exact).
//
// Windows follow transformers: query i keeps key j when i - window < j <= i (window 0: none).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace qlora::engine {

struct DocumentLayout {
  // [batch, seq] int64 on the attention's device: each token's document, counted within its row
  // (for the masked path).
  at::Tensor document_ids;
  // [documents + 1] int32 on the attention's device: where each document starts in the
  // flattened batch * seq tokens, then the total (for the flash path).
  at::Tensor cu_seqlens;
  int64_t max_length = 0;  // the longest document, in tokens
  // The masked path's [batch, 1, seq, seq] masks by window, built on first use and then shared
  // by every layer (and every copy of this layout, e.g. a checkpoint's) of one forward pass.
  struct MaskCache {
    std::mutex mutex;
    std::map<int64_t, at::Tensor> by_window;
  };
  std::shared_ptr<MaskCache> masks = std::make_shared<MaskCache>();

  // position_ids [batch, seq] (int, any device; on the host the layout costs no device
  // synchronization, on a GPU one small copy back). Throws c10::Error on a bad shape.
  static DocumentLayout FromPositions(const at::Tensor& position_ids, const c10::Device& device);
};

// q [batch, heads, seq, head_dim]; k, v [batch, kv_heads, seq, head_dim] with kv_heads dividing
// heads (grouped-query attention) -> [batch, heads, seq, head_dim] in q's dtype; differentiable
// in q, k and v. Scale 1 / sqrt(head_dim). Dispatches to the flash path when it can run.
at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const DocumentLayout& documents, int64_t window);

// Whether VarlenCausalAttention takes the flash path for these inputs (and SDPA's flash
// backend is enabled: at::globalContext().setSDPUseFlash(false) forces the masked path).
bool FlashVarlenApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The two paths, for tests. The flash one throws c10::Error where FlashVarlenApplies is false.
at::Tensor FlashVarlenCausalAttention(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const DocumentLayout& documents,
                                      int64_t window);
at::Tensor MaskedVarlenCausalAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const DocumentLayout& documents,
                                       int64_t window);

}  // namespace qlora::engine
