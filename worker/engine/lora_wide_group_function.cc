// LoraWideGroupFunction: the LoRA layers that read one input as one autograd node whose forward
// runs GEMMs over the input's widened rows (packed into one GEMM for q/k/v and gate/up).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/fused_elementwise.h"
#include "kernels/quantize_4bit.h"
#include "kernels/tuned_gemm.h"
#include "worker/engine/activation_offload.h"
#include "worker/engine/adapter_copies.h"
#include "worker/engine/aligned_rows.h"
#include "worker/engine/float8_forward.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/linear4bit.h"
#include "worker/engine/linear4bit_internal.h"

namespace qlora::engine::linear4bit_internal {
namespace {

// Uninitialized rows [rows, width] followed by `count` spare columns, padded to aligned rows: the
// layout WithColumnsAfter takes (PackedForward's gate/up rows, PackedGradientRows; the norms lay
// their gradients out the same way, OutputGradientSpareColumns).
at::Tensor RowsWithColumnsAfter(int64_t rows, int64_t width, int64_t count,
                                const at::TensorOptions& options) {
  return at::empty({rows, AlignedRow(width + count)}, options).narrow(1, 0, width);
}

// The rows PackedForward writes: without a rotary (gate/up) they keep sum(r) spare columns
// (aligned) after the outputs, where their gradients come back and GroupBackward writes dh'
// (WithColumnsAfter).
at::Tensor PackedRows(int64_t rows, int64_t total, int64_t rank_sum, bool rotary,
                      const at::TensorOptions& options) {
  return rotary ? at::empty({rows, total}, options)
                : RowsWithColumnsAfter(rows, total, rank_sum, options);
}

// The layers' widened weights stacked into one [sum of out, in + sum of r] weight (layer i's
// rows [W_i | 0 | s_i B_i | 0], its adapter's columns at its offset) and one GEMM of the widened
// rows `wide` [T, in + sum of r] over it.
at::Tensor WidenedPackedForward(const at::Tensor& wide, at::TensorList b,
                                const std::vector<const LinearLayer*>& group,
                                const std::vector<const FrozenWeight*>& bases, int64_t total,
                                bool rotary, kernels::GemmTuner* gemm, AdapterCopies* copies) {
  const int64_t width = wide.size(1);
  const int64_t in = group[0]->base.in_features, rank_sum = width - in;
  // Kept dequantized (dequantized_layers.h): only the adapters' columns are written, all in one
  // launch, and not at all where the adapters' scope has them written (WriteDequantizedAdapters, or
  // an earlier micro-batch); else each layer's launch writes its rows whole, zeros around its
  // own B.
  at::Tensor stacked = DequantizedRows(bases, 0, width, wide.scalar_type());
  if (stacked.defined()) {
    WriteDequantized(copies, {DequantizedPackedColumns(stacked, group, b, in)});
  } else {
    stacked = at::empty({total, AlignedRow(width)}, wide.options()).narrow(1, 0, width);
    int64_t row = 0, offset = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      const LinearLayer& layer = *group[i];
      const int64_t out = layer.base.out_features;
      const kernels::ColumnsAfter adapter{offset, b[i].detach().to(at::kFloat), layer.lora->scale,
                                          rank_sum - offset - b[i].size(1)};
      layer.base.MaterializeInto(stacked.narrow(0, row, out).narrow(1, 0, in), &adapter);
      row += out;
      offset += b[i].size(1);
    }
  }
  const at::Tensor packed = PackedRows(wide.size(0), total, rank_sum, rotary, wide.options());
  Addmm(gemm, packed, wide, stacked.t(), 0.0);
  return packed;
}

// The same with the base in FP8 (float8_forward.h): one FP8 GEMM of x over the stacked weights,
// then each layer's columns += s_i ha_i B_i^T from the rank-r projections in wide's spare columns.
at::Tensor Float8PackedForward(const at::Tensor& wide, at::TensorList b,
                               const std::vector<const LinearLayer*>& group,
                               const std::vector<const FrozenWeight*>& bases, int64_t total,
                               bool rotary, kernels::GemmTuner* gemm, AdapterCopies* copies) {
  const int64_t in = group[0]->base.in_features, rank_sum = wide.size(1) - in;
  const at::ScalarType dtype = wide.scalar_type();
  const at::Tensor packed =
      Float8Forward(wide.narrow(1, 0, in), bases, DequantizedRows(bases, 0, in, dtype),
                    PackedRows(wide.size(0), total, rank_sum, rotary, wide.options()));
  int64_t row = 0, offset = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    const int64_t out = group[i]->base.out_features, r = b[i].size(1);
    LoraAddmm(gemm, packed.narrow(1, row, out), wide.narrow(1, in + offset, r),
              InDtype(copies, b[i], dtype).t(), /*beta=*/1.0, /*alpha=*/group[i]->lora->scale);
    row += out;
    offset += r;
  }
  return packed;
}

// The packed form of LoraWideGroupFunction's forward (SharedInputForward over equally wide
// layers without biases): the packed outputs [T, sum of out] of WidenedPackedForward (or
// Float8PackedForward); with a rotary (q/k/v), then the rotation of the first two layers'
// columns (q and k) in place, in one pass. Returns each layer's columns (views of the packed
// rows).
variable_list PackedForward(const at::Tensor& wide, at::TensorList b,
                            const std::vector<const LinearLayer*>& group,
                            const SharedInputRotary* rotary, kernels::GemmTuner* gemm,
                            AdapterCopies* copies) {
  int64_t total = 0;
  std::vector<const FrozenWeight*> bases;
  for (const LinearLayer* layer : group) {
    total += layer->base.out_features;
    bases.push_back(&layer->base);
  }
  const at::Tensor packed =
      RunsFloat8(*bases[0], wide.narrow(1, 0, bases[0]->in_features))
          ? Float8PackedForward(wide, b, group, bases, total, rotary != nullptr, gemm, copies)
          : WidenedPackedForward(wide, b, group, bases, total, rotary != nullptr, gemm, copies);
  if (rotary != nullptr) {
    // q's and k's columns are side by side: one pass rotates both, as the heads of one tensor.
    const int64_t rotated = group[0]->base.out_features + group[1]->base.out_features;
    at::Tensor heads =
        packed.narrow(1, 0, rotated)
            .view({rotary->batch, rotary->seq, rotated / rotary->head_dim, rotary->head_dim})
            .transpose(1, 2);
    kernels::RotaryForwardInPlace(heads, rotary->cos, rotary->sin);
  }
  variable_list outputs;
  int64_t row = 0;
  for (const LinearLayer* layer : group) {
    outputs.push_back(packed.narrow(1, row, layer->base.out_features));
    row += layer->base.out_features;
  }
  return outputs;
}

// Rows [T, sum of widths] with `spare` columns after them (RowsWithColumnsAfter) for the
// gradients `grads` [T, width_i] to be written into side by side, or an undefined tensor where
// one is missing.
at::Tensor PackedGradientRows(const variable_list& grads, int64_t spare) {
  int64_t total = 0;
  for (const at::Tensor& g : grads) {
    if (!g.defined() || g.dim() != 2) return at::Tensor();
    total += g.size(1);
  }
  return RowsWithColumnsAfter(grads[0].size(0), total, spare, grads[0].options());
}

// LoraGroupFunction's layers with their forward as GEMMs over widened rows, for x [T, in] whose
// rows have SharedInputSpareColumns spare columns (sum(r_i) rounded up to aligned rows;
// HasSpareColumns): the rank-r projections x [A_1; ...; A_n]^T are written in the first sum(r_i)
// of them, so that each layer's output is one GEMM,
//   y_i = [x | ha_1 .. ha_i] [W_i | 0 | s_i B_i]^T
// with no pass writing s_i ha_i B_i^T for the base GEMM to read back and add to (for q/k/v and
// gate/up at 7B, micro-batch 4: 550 MB written and read a layer). The extra columns cost one more
// K step of each GEMM (K = in + 16..48 is one 64-wide step more than in); backward is
// LoraGroupFunction's (GroupBackward), reading ha where forward wrote it. Same inputs and outputs
// as LoraGroupFunction, and the same values up to rounding (fused_paths_test). Packed
// (SharedInputForward's equally wide layers: q/k/v, gate/up) forward is PackedForward, with
// `rotary` (q/k/v) rotating q and k, and backward first rotates their gradients back (with
// packed_gradients into packed rows with spare columns, as gate/up's come back by themselves, so
// that x's gradient is one GEMM with the low-rank term inside: GroupBackward).
struct LoraWideGroupFunction : public torch::autograd::Function<LoraWideGroupFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList a,
                               at::TensorList b, const std::vector<const LinearLayer*>* group,
                               bool value_unused, bool packed, const SharedInputRotary* rotary,
                               const NormedInput* normed) {
    const at::ScalarType dtype = x.scalar_type();
    const size_t n = group->size();
    std::vector<int64_t> ranks;
    int64_t rank_sum = 0;
    for (size_t i = 0; i < n; ++i) {
      ranks.push_back(a[i].size(0));
      rank_sum += ranks.back();
    }
    kernels::GemmTuner* gemm = (*group)[0]->gemm;
    AdapterCopies* copies = (*group)[0]->adapter_copies;
    SaveGemm(ctx, gemm);
    SaveCopies(ctx, copies);
    const int64_t rows = x.size(0), in = x.size(1);
    const at::Tensor wide = WithSpareColumns(x, x.stride(0) - in);
    LoraAddmm(gemm, wide.narrow(1, in, rank_sum), x, InDtype(copies, a, dtype).t(),
              /*beta=*/0.0);
    variable_list outputs;
    std::vector<double> scales;
    if (packed) {
      outputs = PackedForward(wide.narrow(1, 0, in + rank_sum), b, *group, rotary, gemm, copies);
    }
    if (packed && rotary != nullptr) {
      ctx->saved_data["rotary_cos"] = rotary->cos;
      ctx->saved_data["rotary_sin"] = rotary->sin;
      ctx->saved_data["rotary_shape"] =
          std::vector<int64_t>{rotary->batch, rotary->seq, rotary->head_dim};
      ctx->saved_data["packed_gradients"] = rotary->packed_gradients;
    }
    int64_t offset = 0;
    std::optional<kernels::Float8Rows> x8;
    for (size_t i = 0; i < n; ++i) {
      const LinearLayer& layer = *(*group)[i];
      const int64_t out = layer.base.out_features;
      if (!packed && value_unused) {
        outputs.push_back(ValueUnused({rows, out}, x.options()));
      } else if (!packed && RunsFloat8(layer.base, x)) {
        if (!x8) x8 = kernels::QuantizeRowsFloat8(x);  // once for the layers
        at::Tensor y = Float8Forward(*x8, dtype, {&layer.base},
                                     HeldRows(layer.base.dequantized, dtype));
        LoraAddmm(gemm, y, wide.narrow(1, in + offset, ranks[i]),
                  InDtype(copies, b[i], dtype).t(), /*beta=*/1.0, /*alpha=*/layer.lora->scale);
        outputs.push_back(y);
      } else if (!packed) {
        at::Tensor y = at::empty({rows, out}, x.options());
        Addmm(gemm, y, wide.narrow(1, 0, in + offset + ranks[i]),
              WidenedWeight(layer.base, in, b[i], layer.lora->scale, offset, dtype, copies).t(),
              0.0);
        outputs.push_back(y);
      }
      SaveBase(ctx, layer.base, std::to_string(i) + ".");
      scales.push_back(layer.lora->scale);
      offset += ranks[i];
    }
    if (normed != nullptr) {
      // Not x's rows: the norm's source and rstd (the norm node keeps them too: one storage, one
      // offloading trip) and ha, out of the spare columns (small: stays on the device).
      ctx->saved_data["norm_weight"] = normed->weight;  // frozen: kept by reference
      SaveGroup(ctx,
                {normed->source.reshape({rows, in}), normed->rstd.reshape({rows}),
                 wide.narrow(1, in, rank_sum).clone(at::MemoryFormat::Contiguous)},
                a, b, ranks, scales);
    } else {
      SaveGroup(ctx, {x}, a, b, ranks, scales);
    }
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = SavedForBackward(ctx);
    // x's rows with their spare columns (restored with them too), or the norm's source rows.
    const at::Tensor& x = saved[0];
    std::optional<NormedInput> normed;
    if (ctx->saved_data.count("norm_weight") > 0) {
      normed = NormedInput{at::Tensor(), saved[1], ctx->saved_data["norm_weight"].toTensor()};
    }
    int64_t rank_sum = 0;
    for (int64_t r : ctx->saved_data["ranks"].toIntVector()) rank_sum += r;
    const at::Tensor ha =
        normed ? saved[2]
               : WithSpareColumns(x, x.stride(0) - x.size(1)).narrow(1, x.size(1), rank_sum);
    if (ctx->saved_data.count("rotary_shape") > 0) {  // packed: q's and k's gradients rotated back
      const std::vector<int64_t> shape = ctx->saved_data["rotary_shape"].toIntVector();
      const at::Tensor cos = ctx->saved_data["rotary_cos"].toTensor();
      const at::Tensor sin = ctx->saved_data["rotary_sin"].toTensor();
      auto heads = [&](const at::Tensor& rows) {  // [T, out] as [batch, heads, seq, head_dim]
        return rows.reshape({shape[0], shape[1], rows.size(1) / shape[2], shape[2]})
            .transpose(1, 2);
      };
      // Where x's gradient is wanted (and packed_gradients), the gradients go packed into rows
      // with spare columns (q's and k's rotated back into them, v's copied: 64 MB a layer at 7B,
      // micro-batch 4) for GroupBackward's one GEMM over [g_q g_k g_v | dh'] (two base GEMMs'
      // passes over dx and the rank-r pass fewer).
      const at::Tensor packed =
          ctx->needs_input_grad(0) && ctx->saved_data["packed_gradients"].toBool()
              ? PackedGradientRows(grad_outputs, rank_sum)
              : at::Tensor();
      if (packed.defined()) {
        // q's and k's rotated back and v's copied, in one pass (one launch).
        at::Tensor all =  // a view of the packed rows
            packed.view({shape[0], shape[1], packed.size(1) / shape[2], shape[2]}).transpose(1, 2);
        kernels::RotaryBackwardAndCopyInto(
            {heads(grad_outputs[0]), heads(grad_outputs[1])},
            grad_outputs.size() > 2 ? heads(grad_outputs[2]) : at::Tensor(), cos, sin, all);
        int64_t column = 0;
        for (at::Tensor& g : grad_outputs) {
          const int64_t width = g.size(1);
          g = packed.narrow(1, column, width);
          column += width;
        }
      } else {
        for (size_t i = 0; i < 2 && i < grad_outputs.size(); ++i) {
          const at::Tensor g = grad_outputs[i];
          if (!g.defined()) continue;
          grad_outputs[i] =
              kernels::RotaryBackward(heads(g), cos, sin).transpose(1, 2).reshape(g.sizes());
        }
      }
    }
    variable_list grads = GroupBackward(ctx, x, ha, at::TensorList(saved).slice(normed ? 3 : 1),
                                        grad_outputs, normed ? &*normed : nullptr);
    grads.emplace_back();  // packed
    grads.emplace_back();  // rotary
    grads.emplace_back();  // normed
    return grads;
  }
};

}  // namespace

variable_list ApplyLoraWideGroup(const at::Tensor& x, at::TensorList a, at::TensorList b,
                                 const std::vector<const LinearLayer*>* group, bool value_unused,
                                 bool packed, const SharedInputRotary* rotary,
                                 const NormedInput* normed) {
  return LoraWideGroupFunction::apply(x, a, b, group, value_unused, packed, rotary, normed);
}

}  // namespace qlora::engine::linear4bit_internal
