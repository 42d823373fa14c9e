// References for the varlen attention tests (CPU and CUDA): packed-row layouts, attention run
// one document at a time (offsets from the layout's cu_seqlens, an SDPA call per document), the
// dense block-diagonal mask the model used before varlen attention, and a forward + backward
// that returns the output and the gradients with respect to q, k and v.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include "worker/engine/varlen_attention.h"

namespace qlora::testing {

// Rows of documents given by their lengths (each row's lengths sum to seq).
struct PackedCase {
  std::string name;
  std::vector<std::vector<int64_t>> rows;
  int64_t heads = 4, kv_heads = 4, head_dim = 16;
  int64_t window = 0;
};

inline int64_t RowLength(const PackedCase& c) {
  int64_t n = 0;
  for (int64_t len : c.rows[0]) n += len;
  return n;
}

// [rows, seq] position ids restarting at 0 for every document.
inline at::Tensor PositionIds(const PackedCase& c) {
  std::vector<at::Tensor> rows;
  for (const auto& lengths : c.rows) {
    std::vector<at::Tensor> docs;
    for (int64_t len : lengths) docs.push_back(at::arange(len, at::kLong));
    rows.push_back(at::cat(docs));
  }
  return at::stack(rows);
}

inline std::vector<PackedCase> PackedCases() {
  return {
      {"OneDocPerRow", {{16}, {16}}},
      {"ManyDocs", {{5, 1, 7, 3}, {2, 14}, {16}}},
      {"DocsOfLengthOne", {{1, 1, 1, 1, 1, 1, 1, 1}, {1, 6, 1}}},
      {"Gqa", {{5, 1, 7, 3}, {9, 7}}, 8, 2, 16},
      {"WindowShorterThanDocs", {{9, 7}, {2, 14}}, 4, 2, 16, 3},
      {"WindowOfOne", {{9, 7}}, 4, 4, 16, 1},
  };
}

// Causal attention of one document: q [1, heads, len, d], k, v [1, kv_heads, len, d].
inline at::Tensor DocumentAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    int64_t window) {
  const int64_t len = q.size(2);
  at::Tensor allowed = at::ones({len, len}, at::dtype(at::kBool).device(q.device())).tril();
  if (window > 0) allowed = allowed.triu(-(window - 1));
  return at::scaled_dot_product_attention(q, k, v, allowed, 0.0, false, std::nullopt,
                                          k.size(1) != q.size(1));
}

// The attention one document at a time, cut at the layout's cu_seqlens over the flattened
// batch * seq tokens.
inline at::Tensor PerDocumentAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v,
                                       const engine::DocumentLayout& documents, int64_t window) {
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), d = q.size(3);
  auto tokens = [](const at::Tensor& x) {  // [batch * seq, heads, d]
    return x.transpose(1, 2).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)});
  };
  const at::Tensor qt = tokens(q), kt = tokens(k), vt = tokens(v);
  const at::Tensor offsets = documents.cu_seqlens.cpu().to(at::kLong);
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i + 1 < offsets.numel(); ++i) {
    const int64_t begin = offsets[i].item<int64_t>(), end = offsets[i + 1].item<int64_t>();
    auto doc = [&](const at::Tensor& t) { return t.slice(0, begin, end).transpose(0, 1).unsqueeze(0); };
    outs.push_back(DocumentAttention(doc(qt), doc(kt), doc(vt), window).squeeze(0).transpose(0, 1));
  }
  return at::cat(outs).view({batch, seq, heads, d}).transpose(1, 2);
}

// The packed-row attention the model computed before varlen attention, from position ids alone.
inline at::Tensor OldDenseMaskAttention(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& position_ids,
                                        int64_t window) {
  const int64_t seq = q.size(2);
  const at::Tensor run = position_ids.to(q.device()).eq(0).cumsum(-1);
  const at::Tensor same_run = run.unsqueeze(-1).eq(run.unsqueeze(-2));
  at::Tensor allowed = at::ones({seq, seq}, at::dtype(at::kBool).device(q.device())).tril();
  if (window > 0) allowed = allowed.triu(-(window - 1));
  const at::Tensor mask = at::logical_and(same_run, allowed).unsqueeze(1);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, std::nullopt,
                                          k.size(1) != q.size(1));
}

struct AttentionResult {
  at::Tensor out, grad_q, grad_k, grad_v;
};

using AttentionFn =
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

// Random q, k, v of the case (seeded, float32 on the CPU, then cast and moved), their
// attention, and the gradients of sum(out * weights) for random weights.
inline AttentionResult RunAttention(const PackedCase& c, const AttentionFn& attention,
                                    at::ScalarType dtype, const at::Device& device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const int64_t batch = static_cast<int64_t>(c.rows.size()), seq = RowLength(c);
  // Laid out as the model's projections are: [batch, seq, heads, d] seen as [batch, heads, ...].
  auto input = [&](int64_t heads) {
    return at::randn({batch, seq, heads, c.head_dim}, gen)
        .to(device, dtype)
        .transpose(1, 2)
        .detach()
        .requires_grad_(true);
  };
  const at::Tensor q = input(c.heads), k = input(c.kv_heads), v = input(c.kv_heads);
  const at::Tensor weights = at::randn({batch, c.heads, seq, c.head_dim}, gen).to(device, dtype);
  const at::Tensor out = attention(q, k, v);
  const auto grads = torch::autograd::grad({(out * weights).sum()}, {q, k, v});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

}  // namespace qlora::testing
