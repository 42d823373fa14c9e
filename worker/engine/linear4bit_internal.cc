// The helpers linear4bit.cc's autograd nodes share (linear4bit_internal.h): saved data, GEMMs,
// weights kept dequantized, rows with spare columns and the LoRA branch's forward and backward.
#include "worker/engine/linear4bit_internal.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/block_writes.h"
#include "kernels/lora_gradients.h"
#include "kernels/quantize_4bit.h"
#include "kernels/tuned_gemm.h"
#include "worker/engine/adapter_copies.h"
#include "worker/engine/adapter_gradients.h"
#include "worker/engine/aligned_rows.h"
#include "worker/engine/float8_forward.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/linear4bit.h"

namespace qlora::engine::linear4bit_internal {
namespace {

// The weight SaveBase kept (with its shape; no bias).
FrozenWeight SavedFrozenWeight(AutogradContext* ctx, const std::string& prefix) {
  FrozenWeight w;
  auto it = ctx->saved_data.find(prefix + "dense");
  if (it != ctx->saved_data.end()) {
    w.dense = it->second.toTensor();
    w.out_features = w.dense.size(0);
    w.in_features = w.dense.size(1);
  } else {
    w.quantized = FromSaved(ctx, prefix);
    w.out_features = w.quantized->shape.at(0);
    w.in_features = w.quantized->shape.at(1);
    auto dequantized = ctx->saved_data.find(prefix + "dequantized");
    if (dequantized != ctx->saved_data.end()) w.dequantized = dequantized->second.toTensor();
  }
  return w;
}

}  // namespace

kernels::Quantized4bit FromSaved(AutogradContext* ctx, const std::string& prefix) {
  const auto& s = ctx->saved_data;
  auto at = [&](const char* key) -> const c10::IValue& { return s.at(prefix + key); };
  kernels::Quantized4bit q;
  q.packed = at("packed").toTensor();
  q.absmax = at("absmax").toTensor();
  q.double_quant = at("double_quant").toBool();
  if (q.double_quant) {
    q.nested_absmax = at("nested_absmax").toTensor();
    q.nested_code = at("nested_code").toTensor();
    q.nested_offset = static_cast<float>(at("nested_offset").toDouble());
    q.nested_blocksize = at("nested_blocksize").toInt();
  }
  q.type = static_cast<kernels::QuantType>(at("type").toInt());
  q.blocksize = at("blocksize").toInt();
  q.shape = at("shape").toIntVector();
  q.dtype = static_cast<at::ScalarType>(at("dtype").toInt());
  return q;
}

void Save(AutogradContext* ctx, const kernels::Quantized4bit& q, const std::string& prefix) {
  auto& s = ctx->saved_data;
  // Frozen tensors: saving them in saved_data keeps a reference, not a copy.
  s[prefix + "packed"] = q.packed;
  s[prefix + "absmax"] = q.absmax;
  s[prefix + "double_quant"] = q.double_quant;
  if (q.double_quant) {
    s[prefix + "nested_absmax"] = q.nested_absmax;
    s[prefix + "nested_code"] = q.nested_code;
    s[prefix + "nested_offset"] = static_cast<double>(q.nested_offset);
    s[prefix + "nested_blocksize"] = q.nested_blocksize;
  }
  s[prefix + "type"] = static_cast<int64_t>(q.type);
  s[prefix + "blocksize"] = q.blocksize;
  s[prefix + "shape"] = q.shape;
  s[prefix + "dtype"] = static_cast<int64_t>(q.dtype);
}

void SaveGemm(AutogradContext* ctx, kernels::GemmTuner* gemm) {
  ctx->saved_data["gemm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(gemm));
}

kernels::GemmTuner* SavedGemm(AutogradContext* ctx) {
  return reinterpret_cast<kernels::GemmTuner*>(
      static_cast<intptr_t>(ctx->saved_data.at("gemm").toInt()));
}

void SaveCopies(AutogradContext* ctx, AdapterCopies* copies) {
  ctx->saved_data["adapter_copies"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(copies));
}

AdapterCopies* SavedCopies(AutogradContext* ctx) {
  return reinterpret_cast<AdapterCopies*>(
      static_cast<intptr_t>(ctx->saved_data.at("adapter_copies").toInt()));
}

void SaveBase(AutogradContext* ctx, const FrozenWeight& base, const std::string& prefix) {
  if (base.quantized) {
    Save(ctx, *base.quantized, prefix);
    // A view of the job-long buffer: a reference, not a copy.
    if (base.dequantized.defined()) ctx->saved_data[prefix + "dequantized"] = base.dequantized;
  } else {
    ctx->saved_data[prefix + "dense"] = base.dense;
  }
}

at::Tensor SavedBase(AutogradContext* ctx, at::ScalarType dtype, const std::string& prefix) {
  return SavedFrozenWeight(ctx, prefix).Materialize(dtype);
}

at::Tensor StackedWeights(AutogradContext* ctx, const std::vector<std::string>& prefixes,
                          const at::Tensor& below, int64_t in, const at::TensorOptions& options) {
  std::vector<FrozenWeight> weights;
  const int64_t extra = below.defined() ? below.size(0) : 0;
  int64_t rows = extra;
  for (const std::string& prefix : prefixes) {
    weights.push_back(SavedFrozenWeight(ctx, prefix));
    rows += weights.back().out_features;
  }
  std::vector<const FrozenWeight*> views;
  for (const FrozenWeight& w : weights) views.push_back(&w);
  // Kept dequantized: the buffer's own rows, the As written below them (nothing to dequantize).
  at::Tensor stacked = DequantizedRows(views, extra, in, options.dtype().toScalarType());
  const bool held = stacked.defined();
  if (!held) stacked = at::empty({rows, in}, options);
  int64_t row = 0;
  for (const FrozenWeight& w : weights) {
    w.MaterializeInto(stacked.narrow(0, row, w.out_features));
    row += w.out_features;
  }
  if (below.defined() && held) {
    // Noted in the adapters' scope (WriteDequantized), where `below` is their scope copy.
    AdapterCopies* copies =
        ctx->saved_data.count("adapter_copies") > 0 ? SavedCopies(ctx) : nullptr;
    WriteDequantized(copies, {DequantizedAs(stacked.narrow(0, row, below.size(0)), below, copies)});
  } else if (below.defined()) {
    stacked.narrow(0, row, below.size(0)).copy_(below);
  }
  return stacked;
}

at::Tensor InDtype(AdapterCopies* copies, at::TensorList params, at::ScalarType dtype) {
  return copies != nullptr ? copies->Get(params, dtype) : CastAdapters(params, dtype);
}

void Addmm(kernels::GemmTuner* gemm, const at::Tensor& out, const at::Tensor& a,
           const at::Tensor& b, double beta, double alpha, const at::Tensor& c) {
  if (gemm != nullptr) {
    gemm->Addmm(out, a, b, beta, alpha, c);
  } else {
    at::Tensor o = out;
    at::addmm_out(o, c.defined() ? c : out, a, b, beta, alpha);
  }
}

at::Tensor Mm(kernels::GemmTuner* gemm, const at::Tensor& a, const at::Tensor& b, double alpha) {
  if (gemm == nullptr) return alpha == 1.0 ? at::mm(a, b) : at::mm(a, b).mul_(alpha);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  gemm->Addmm(out, a, b, /*beta=*/0.0, alpha);
  return out;
}

void LoraAddmm(kernels::GemmTuner* gemm, const at::Tensor& out, const at::Tensor& a,
               const at::Tensor& b, double beta, double alpha, const at::Tensor& c) {
  RECORD_USER_SCOPE(kLoraRange);
  Addmm(gemm, out, a, b, beta, alpha, c);
}

at::Tensor LoraMm(kernels::GemmTuner* gemm, const at::Tensor& a, const at::Tensor& b,
                  double alpha) {
  RECORD_USER_SCOPE(kLoraRange);
  return Mm(gemm, a, b, alpha);
}

at::Tensor DequantizedRows(const std::vector<const FrozenWeight*>& weights, int64_t extra_rows,
                        int64_t width, at::ScalarType dtype) {
  if (weights.empty() || !weights[0]->dequantized.defined()) return at::Tensor();
  const at::Tensor& first = weights[0]->dequantized;
  const int64_t ld = first.stride(0);
  if (first.scalar_type() != dtype || first.stride(1) != 1 || ld < width) return at::Tensor();
  int64_t rows = 0;
  for (const FrozenWeight* w : weights) {
    const at::Tensor& r = w->dequantized;
    if (!r.defined() || !r.storage().is_alias_of(first.storage()) || r.stride(0) != ld ||
        r.stride(1) != 1 || r.scalar_type() != dtype ||
        r.storage_offset() != first.storage_offset() + rows * ld) {
      return at::Tensor();
    }
    rows += r.size(0);
  }
  const int64_t buffer_rows =
      static_cast<int64_t>(first.storage().nbytes()) / (ld * first.element_size());
  if (extra_rows > 0 && (first.storage_offset() != 0 || rows + extra_rows != buffer_rows)) {
    return at::Tensor();
  }
  if (first.storage_offset() / ld + rows > buffer_rows) return at::Tensor();
  return at::empty({0}, first.options())
      .set_(first.storage(), first.storage_offset(), {rows + extra_rows, width}, {ld, 1});
}

DequantizedWrites DequantizedPackedColumns(const at::Tensor& stacked,
                             const std::vector<const LinearLayer*>& group, at::TensorList b,
                             int64_t in) {
  const int64_t rank_sum = stacked.size(1) - in;
  std::vector<kernels::BlockWrite> blocks;
  bool stable = true;
  int64_t row = 0, offset = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    const int64_t out = group[i]->base.out_features, r = b[i].size(1);
    const kernels::ColumnsAfter adapter{offset, b[i].detach().to(at::kFloat),
                                        group[i]->lora->scale, rank_sum - offset - r};
    for (kernels::BlockWrite& w :
         kernels::ColumnsAfterBlocks(stacked.narrow(0, row, out).narrow(1, 0, in), adapter)) {
      blocks.push_back(std::move(w));
    }
    stable = stable && b[i].scalar_type() == at::kFloat;
    row += out;
    offset += r;
  }
  return MakeDequantizedWrites(std::move(blocks), stable);
}

DequantizedWrites DequantizedAs(const at::Tensor& rows, const at::Tensor& below, AdapterCopies* copies) {
  return MakeDequantizedWrites({{rows, below, 1.0}}, copies != nullptr && copies->in_scope());
}

DequantizedWrites DequantizedWidened(const FrozenWeight& base, int64_t in, const at::Tensor& b, double scale,
                       int64_t offset, at::ScalarType dtype) {
  const at::Tensor wide = DequantizedRows({&base}, 0, in + offset + b.size(1), dtype);
  if (!wide.defined()) return {};
  const kernels::ColumnsAfter adapter{offset, b.detach().to(at::kFloat), scale};
  return MakeDequantizedWrites(kernels::ColumnsAfterBlocks(wide.narrow(1, 0, in), adapter),
                        b.scalar_type() == at::kFloat);
}

at::Tensor PackedColumns(at::TensorList columns) {
  const at::Tensor& first = columns[0];
  if (!first.defined() || first.dim() != 2 || first.stride(1) != 1) return at::Tensor();
  int64_t width = 0;
  for (const at::Tensor& t : columns) {
    if (!t.defined() || t.dim() != 2 || t.stride(1) != 1 || t.stride(0) != first.stride(0) ||
        t.size(0) != first.size(0) || t.scalar_type() != first.scalar_type() ||
        !t.storage().is_alias_of(first.storage()) ||
        t.storage_offset() != first.storage_offset() + width) {
      return at::Tensor();
    }
    width += t.size(1);
  }
  if (first.stride(0) < width) return at::Tensor();
  return at::empty({0}, first.options())
      .set_(first.storage(), first.storage_offset(), {first.size(0), width}, {first.stride(0), 1});
}

bool HasSpareColumns(const at::Tensor& x, int64_t spare) {
  if (spare <= 0 || x.dim() != 2 || x.stride(1) != 1 || x.stride(0) != x.size(1) + spare ||
      x.size(0) == 0) {
    return false;
  }
  const int64_t last = x.storage_offset() + (x.size(0) - 1) * x.stride(0) + x.size(1) + spare;
  return static_cast<int64_t>(x.storage().nbytes()) >= last * x.element_size();
}

at::Tensor WithSpareColumns(const at::Tensor& x, int64_t spare) {
  const int64_t width = x.size(1) + spare;
  return at::empty({0}, x.options()).set_(x.storage(), x.storage_offset(), {x.size(0), width},
                                          {width, 1});
}

at::Tensor WithColumnsAfter(const at::Tensor& rows, int64_t count) {
  if (count <= 0 || rows.dim() != 2) return at::Tensor();
  const int64_t spare = AlignedRow(rows.size(1) + count) - rows.size(1);
  if (!HasSpareColumns(rows, spare)) return at::Tensor();
  return WithSpareColumns(rows, spare).narrow(1, 0, rows.size(1) + count);
}

at::Tensor WidenedWeight(const FrozenWeight& base, int64_t in, const at::Tensor& b, double scale,
                         int64_t offset, at::ScalarType dtype, AdapterCopies* copies) {
  const int64_t out = b.size(0), r = b.size(1);
  at::Tensor wide = DequantizedRows({&base}, 0, in + offset + r, dtype);  // only B's columns to write
  if (wide.defined()) {
    WriteDequantized(copies, {DequantizedWidened(base, in, b, scale, offset, dtype)});
    return wide;
  }
  wide = at::empty({out, AlignedRow(in + offset + r)}, b.options().dtype(dtype))
             .narrow(1, 0, in + offset + r);
  // The product formed in float32 (b's dtype, or b cast exactly) and rounded once.
  const kernels::ColumnsAfter adapter{offset, b.detach().to(at::kFloat), scale};
  base.MaterializeInto(wide.narrow(1, 0, in), &adapter);  // a 4-bit base: one launch for all
  return wide;
}

at::Tensor LoraOutput(const at::Tensor& x, const at::Tensor& ha, const at::Tensor& b,
                      const FrozenWeight& base, double scale, bool value_unused,
                      kernels::GemmTuner* gemm, AdapterCopies* copies,
                      const at::Tensor& residual) {
  if (value_unused) return ValueUnused({x.size(0), base.out_features}, x.options());
  const at::ScalarType dtype = x.scalar_type();
  if (RunsFloat8(base, x)) {  // x W^T in FP8, then the adapter and the residual added
    at::Tensor y = Float8Forward(x, {&base}, HeldRows(base.dequantized, dtype));
    LoraAddmm(gemm, y, ha, InDtype(copies, b, dtype).t(), /*beta=*/1.0, /*alpha=*/scale);
    if (residual.defined()) y.add_(residual);
    return y;
  }
  at::Tensor y = at::empty({x.size(0), base.out_features}, x.options());
  LoraAddmm(gemm, y, ha, InDtype(copies, b, dtype).t(), /*beta=*/residual.defined() ? 1 : 0,
            /*alpha=*/scale, residual);
  Addmm(gemm, y, x, base.Materialize(dtype).t());
  return y;
}

std::pair<at::Tensor, at::Tensor> LoraForward(const at::Tensor& x, const at::Tensor& h,
                                              const at::Tensor& a, const at::Tensor& b,
                                              const FrozenWeight& base, double scale,
                                              bool value_unused, kernels::GemmTuner* gemm,
                                              AdapterCopies* copies,
                                              const at::Tensor& residual) {
  const at::Tensor ha = LoraMm(gemm, h, InDtype(copies, a, x.scalar_type()).t());  // [T, r]
  return {LoraOutput(x, ha, b, base, scale, value_unused, gemm, copies, residual), ha};
}

void LoraGradientPair(kernels::GemmTuner* gemm, const at::Tensor& g, const at::Tensor& b,
                      const at::Tensor& ha, double scale, const at::Tensor& dha,
                      const at::Tensor& db) {
  RECORD_USER_SCOPE(kLoraRange);
  if (kernels::LoraGradientPairFused(g, b, ha, dha, db)) {
    kernels::LoraGradientPair(g, b, ha, scale, dha, db);
    return;
  }
  Addmm(gemm, dha, g, b, /*beta=*/0.0, scale);
  Addmm(gemm, db, g.t(), ha, /*beta=*/0.0, scale);
}

at::Tensor LoraInputGradient(const LoraGradients& d, const at::Tensor& a, at::ScalarType dtype,
                             kernels::GemmTuner* gemm, AdapterCopies* copies) {
  return LoraMm(gemm, d.dha, InDtype(copies, a, dtype));
}

void LoraAGradient(const LoraGradients& d, const at::Tensor& h, kernels::GemmTuner* gemm) {
  LoraAddmm(gemm, d.ab->Slot(0), d.dha.t(), h, /*beta=*/0.0);
}

LoraGradients LoraBackward(const at::Tensor& g, const at::Tensor& h, const at::Tensor& ha,
                           const at::Tensor& a, const at::Tensor& b, double scale,
                           kernels::GemmTuner* gemm, AdapterCopies* copies,
                           bool input_gradient, const at::Tensor& dha_into) {
  const at::ScalarType dtype = ha.scalar_type();
  LoraGradients d;
  d.ab.emplace(std::vector<std::vector<int64_t>>{a.sizes().vec(), b.sizes().vec()},
               ha.options());
  d.dha = dha_into.defined() ? dha_into : at::empty({g.size(0), b.size(1)}, ha.options());
  LoraGradientPair(gemm, g, InDtype(copies, b, dtype), ha, scale, d.dha, d.ab->Slot(1));
  if (h.defined()) LoraAGradient(d, h, gemm);
  if (input_gradient) d.lora_in = LoraInputGradient(d, a, dtype, gemm, copies);
  return d;
}

at::Tensor OwnedColumnsAfter(AutogradContext* ctx, const at::Tensor& g, int64_t r) {
  return ctx->saved_data["owns_gradient_spare_columns"].toBool() ? WithColumnsAfter(g, r)
                                                                 : at::Tensor();
}

at::Tensor InputGradientOverRows(AutogradContext* ctx, const at::Tensor& rows_with_dha,
                                 const at::Tensor& a, kernels::GemmTuner* gemm,
                                 at::Tensor dx) {
  const int64_t in = a.size(1);
  if (!dx.defined()) dx = at::empty({rows_with_dha.size(0), in}, rows_with_dha.options());
  Addmm(gemm, dx, rows_with_dha, StackedWeights(ctx, {""}, a, in, rows_with_dha.options()),
        /*beta=*/0.0);
  return dx;
}

}  // namespace qlora::engine::linear4bit_internal
