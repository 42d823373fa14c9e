// Linear4bit's autograd function, frozen weights and the LoRA branch.
#include "worker/engine/linear4bit.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/fused_elementwise.h"
#include "kernels/lora_gradients.h"
#include "worker/engine/activation_offload.h"
#include "worker/engine/adapter_gradients.h"
#include "worker/engine/aligned_rows.h"
#include "worker/engine/fused_ops.h"

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rank-r GEMMs (LoraAddmm, LoraMm, LoraGradientPair) run inside a profiler range of this name:
// their enclosing ops show the layer's shapes, not r, so bench/attribute_profile.py tells them
// from the base GEMMs by it. Without a profiler a range is a flag test.
constexpr const char* kLoraRange = "qlora::lora";

// Rebuilds the kernels' descriptor from what forward saved in the context.
// (`prefix` tells apart the weights of a node that keeps several.)
kernels::Quantized4bit FromSaved(AutogradContext* ctx, const std::string& prefix = "") {
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

// The layers' GEMM tuner in autograd's saved data, as its address (see LinearLayer::gemm).
void SaveGemm(AutogradContext* ctx, kernels::GemmTuner* gemm) {
  ctx->saved_data["gemm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(gemm));
}

kernels::GemmTuner* SavedGemm(AutogradContext* ctx) {
  return reinterpret_cast<kernels::GemmTuner*>(
      static_cast<intptr_t>(ctx->saved_data.at("gemm").toInt()));
}

// The layers' adapter copies in autograd's saved data, as their address (see
// LinearLayer::adapter_copies).
void SaveCopies(AutogradContext* ctx, AdapterCopies* copies) {
  ctx->saved_data["adapter_copies"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(copies));
}

AdapterCopies* SavedCopies(AutogradContext* ctx) {
  return reinterpret_cast<AdapterCopies*>(
      static_cast<intptr_t>(ctx->saved_data.at("adapter_copies").toInt()));
}

// An adapter tensor (or several, concatenated along dim 0) in the compute dtype: the scope's
// copy where the layers have AdapterCopies, else a cast.
at::Tensor InDtype(AdapterCopies* copies, at::TensorList params, at::ScalarType dtype) {
  return copies != nullptr ? copies->Get(params, dtype) : CastAdapters(params, dtype);
}

// out = beta * out + alpha * (a b) through the tuner, or ATen's GEMM without one; with c,
// out = beta * c + alpha * (a b) (c read, never written: GemmTuner::Addmm).
void Addmm(kernels::GemmTuner* gemm, const at::Tensor& out, const at::Tensor& a,
           const at::Tensor& b, double beta = 1.0, double alpha = 1.0,
           const at::Tensor& c = at::Tensor()) {
  if (gemm != nullptr) {
    gemm->Addmm(out, a, b, beta, alpha, c);
  } else {
    at::Tensor o = out;
    at::addmm_out(o, c.defined() ? c : out, a, b, beta, alpha);
  }
}

// alpha * a [m, k] b [k, n] as a new [m, n] tensor (with the tuner alpha scales inside the
// GEMM, sparing a pass over the product).
at::Tensor Mm(kernels::GemmTuner* gemm, const at::Tensor& a, const at::Tensor& b,
              double alpha = 1.0) {
  if (gemm == nullptr) return alpha == 1.0 ? at::mm(a, b) : at::mm(a, b).mul_(alpha);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  gemm->Addmm(out, a, b, /*beta=*/0.0, alpha);
  return out;
}

// x [..., k] b [k, n] as [..., n], through the tuner when there is one.
at::Tensor Matmul(kernels::GemmTuner* gemm, const at::Tensor& x, const at::Tensor& b) {
  if (gemm == nullptr) return at::matmul(x, b);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = b.size(1);
  return Mm(gemm, x.reshape({-1, x.size(-1)}), b).view(sizes);
}

// Addmm and Mm for the rank-r GEMMs, inside a kLoraRange profiler range.
void LoraAddmm(kernels::GemmTuner* gemm, const at::Tensor& out, const at::Tensor& a,
               const at::Tensor& b, double beta = 1.0, double alpha = 1.0,
               const at::Tensor& c = at::Tensor()) {
  RECORD_USER_SCOPE(kLoraRange);
  Addmm(gemm, out, a, b, beta, alpha, c);
}

at::Tensor LoraMm(kernels::GemmTuner* gemm, const at::Tensor& a, const at::Tensor& b,
                  double alpha = 1.0) {
  RECORD_USER_SCOPE(kLoraRange);
  return Mm(gemm, a, b, alpha);
}

void Save(AutogradContext* ctx, const kernels::Quantized4bit& q, const std::string& prefix = "") {
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

// The weight in dtype: `resident` where it is one of that dtype (resident_weights.h), else
// dequantized (a temporary).
at::Tensor ResidentOrDequantized(const at::Tensor& resident, const kernels::Quantized4bit& q,
                                 at::ScalarType dtype) {
  return resident.defined() && resident.scalar_type() == dtype ? resident
                                                               : DequantizeWeight(q, dtype);
}

// resident: the weight held dequantized (FrozenWeight::resident), or null / undefined.
struct Linear4bitFunction : public torch::autograd::Function<Linear4bitFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const kernels::Quantized4bit* weight, bool value_unused,
                            kernels::GemmTuner* gemm, const at::Tensor* resident) {
    Save(ctx, *weight);
    SaveGemm(ctx, gemm);
    const at::Tensor held = resident != nullptr ? *resident : at::Tensor();
    if (held.defined()) ctx->saved_data["resident"] = held;
    ctx->saved_data["compute_dtype"] = static_cast<int64_t>(x.scalar_type());
    if (value_unused) {  // only the graph is used: backward needs W alone
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes.back() = weight->shape[0];
      return ValueUnused(sizes, x.options());
    }
    return Matmul(gemm, x, ResidentOrDequantized(held, *weight, x.scalar_type()).t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["compute_dtype"].toInt());
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_x;
    if (grad.defined() && ctx->needs_input_grad(0)) {
      auto held = ctx->saved_data.find("resident");
      grad_x = Matmul(SavedGemm(ctx), grad.to(dtype),
                      ResidentOrDequantized(
                          held != ctx->saved_data.end() ? held->second.toTensor() : at::Tensor(),
                          FromSaved(ctx), dtype));
    }
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The base weight of a LoRA layer as autograd's saved data: 4-bit (the kernels' descriptor, as
// Linear4bitFunction keeps it) or dense.
void SaveBase(AutogradContext* ctx, const FrozenWeight& base, const std::string& prefix = "") {
  if (base.quantized) {
    Save(ctx, *base.quantized, prefix);
    // A view of the job-long buffer: a reference, not a copy.
    if (base.resident.defined()) ctx->saved_data[prefix + "resident"] = base.resident;
  } else {
    ctx->saved_data[prefix + "dense"] = base.dense;
  }
}

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
    auto resident = ctx->saved_data.find(prefix + "resident");
    if (resident != ctx->saved_data.end()) w.resident = resident->second.toTensor();
  }
  return w;
}

// Rows [sum of out + extra_rows, width] of the buffer the weights' resident views lie in
// (resident_weights.h), where each weight has one in `dtype`, adjacent in the given order, in
// rows at least `width` wide; with extra_rows, only where those rows end the buffer (its rows
// below the group's weights, which callers write: never another weight's). Else an undefined
// tensor (the caller dequantizes into a buffer of its own).
at::Tensor ResidentRows(const std::vector<const FrozenWeight*>& weights, int64_t extra_rows,
                        int64_t width, at::ScalarType dtype) {
  if (weights.empty() || !weights[0]->resident.defined()) return at::Tensor();
  const at::Tensor& first = weights[0]->resident;
  const int64_t ld = first.stride(0);
  if (first.scalar_type() != dtype || first.stride(1) != 1 || ld < width) return at::Tensor();
  int64_t rows = 0;
  for (const FrozenWeight* w : weights) {
    const at::Tensor& r = w->resident;
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

// A 64-bit digest of the blocks: destinations, sources, shapes, strides, dtypes and scales.
uint64_t BlocksSignature(const std::vector<kernels::BlockWrite>& blocks) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over 64-bit words
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const kernels::BlockWrite& b : blocks) {
    mix(reinterpret_cast<uintptr_t>(b.out.data_ptr()));
    for (int64_t v : {b.out.size(0), b.out.size(1), b.out.stride(0)}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(b.out.scalar_type()));
    if (b.source.defined()) {
      mix(reinterpret_cast<uintptr_t>(b.source.const_data_ptr()));
      mix(static_cast<uint64_t>(b.source.stride(0)));
      mix(static_cast<uint64_t>(b.source.scalar_type()));
    } else {
      mix(0);
    }
    uint64_t scale_bits = 0;
    std::memcpy(&scale_bits, &b.scale, sizeof(scale_bits));
    mix(scale_bits);
  }
  return h;
}

}  // namespace

HeldWrites MakeHeldWrites(std::vector<kernels::BlockWrite> blocks, bool stable) {
  HeldWrites w;
  w.signature = BlocksSignature(blocks);
  w.key = blocks.empty() ? nullptr : blocks[0].out.data_ptr();
  w.blocks = std::move(blocks);
  w.stable = stable;
  return w;
}

namespace {

// The adapter columns after rows [out_i, in] of a packed group's weights stacked in `stacked`
// [sum of out, in + sum of r]: [0 | scale_i B_i | 0] (each B float32, as ColumnsAfter takes it),
// noted in the adapters' scope where every B is the float32 adapter itself.
HeldWrites HeldPackedColumns(const at::Tensor& stacked,
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
  return MakeHeldWrites(std::move(blocks), stable);
}

// The As in the compute dtype (`below`) written into the rows under a held group's weights
// (`rows`), noted in the adapters' scope where `below` is their scope copy.
HeldWrites HeldAs(const at::Tensor& rows, const at::Tensor& below, AdapterCopies* copies) {
  return MakeHeldWrites({{rows, below, 1.0}}, copies != nullptr && copies->in_scope());
}

}  // namespace

void WriteHeld(AdapterCopies* copies, const std::vector<HeldWrites>& writes) {
  std::vector<kernels::BlockWrite> blocks;
  std::vector<const HeldWrites*> to_note;
  for (const HeldWrites& w : writes) {
    if (w.blocks.empty()) continue;
    const bool noted = w.stable && copies != nullptr;
    if (noted && copies->Written(w.key, w.signature)) continue;
    blocks.insert(blocks.end(), w.blocks.begin(), w.blocks.end());
    if (noted) to_note.push_back(&w);
  }
  kernels::WriteBlocks(blocks);
  for (const HeldWrites* w : to_note) copies->NoteWritten(w->key, w->signature);
}

namespace {

// The weight SaveBase kept, in dtype (dequantized, or the dense weight cast).
at::Tensor SavedBase(AutogradContext* ctx, at::ScalarType dtype, const std::string& prefix = "") {
  return SavedFrozenWeight(ctx, prefix).Materialize(dtype);
}

// The frozen weights saved under `prefixes` (SaveBase), dequantized (or cast) into the rows of one
// [sum of out + rows of `below`, in] buffer, `below` (the As [sum of r, in] in the compute dtype,
// or undefined) under them: the right operand of an input-gradient GEMM over packed rows.
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
  // Held dequantized: the buffer's own rows, the As written below them (nothing to dequantize).
  at::Tensor stacked = ResidentRows(views, extra, in, options.dtype().toScalarType());
  const bool held = stacked.defined();
  if (!held) stacked = at::empty({rows, in}, options);
  int64_t row = 0;
  for (const FrozenWeight& w : weights) {
    w.MaterializeInto(stacked.narrow(0, row, w.out_features));
    row += w.out_features;
  }
  if (below.defined() && held) {
    // Noted in the adapters' scope (WriteHeld), where `below` is their scope copy.
    AdapterCopies* copies = ctx->saved_data.count("adapter_copies") > 0 ? SavedCopies(ctx) : nullptr;
    WriteHeld(copies, {HeldAs(stacked.narrow(0, row, below.size(0)), below, copies)});
  } else if (below.defined()) {
    stacked.narrow(0, row, below.size(0)).copy_(below);
  }
  return stacked;
}

// The rows [T, sum of widths] whose column blocks the tensors in `columns` are, side by side in
// order (PackedForward's outputs, or gradients written over them), or an undefined tensor.
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

// Whether rows x [T, in] begin rows of in + spare values (x.stride(0) == in + spare, within
// x's storage): the spare columns a producer left for the widened GEMMs (ResidualRmsNorm's
// spare_columns).
bool HasSpareColumns(const at::Tensor& x, int64_t spare) {
  if (spare <= 0 || x.dim() != 2 || x.stride(1) != 1 || x.stride(0) != x.size(1) + spare ||
      x.size(0) == 0) {
    return false;
  }
  const int64_t last = x.storage_offset() + (x.size(0) - 1) * x.stride(0) + x.size(1) + spare;
  return static_cast<int64_t>(x.storage().nbytes()) >= last * x.element_size();
}

// x's rows with their spare columns, [T, in + spare], as a tensor of its own (its own version
// counter: writing the spare columns is not an in-place change of x for autograd).
at::Tensor WithSpareColumns(const at::Tensor& x, int64_t spare) {
  const int64_t width = x.size(1) + spare;
  return at::empty({0}, x.options()).set_(x.storage(), x.storage_offset(), {x.size(0), width},
                                          {width, 1});
}

// Uninitialized rows [rows, width] followed by `count` spare columns, padded to aligned rows: the
// layout WithColumnsAfter takes (PackedForward's gate/up rows, PackedGradientRows; the norms lay
// their gradients out the same way, OutputGradientSpareColumns).
at::Tensor RowsWithColumnsAfter(int64_t rows, int64_t width, int64_t count,
                                const at::TensorOptions& options) {
  return at::empty({rows, AlignedRow(width + count)}, options).narrow(1, 0, width);
}

// rows [T, width] with the `count` columns after them, [T, width + count], as a tensor of its own
// (WithSpareColumns), where the rows lie as RowsWithColumnsAfter lays them out; else an undefined
// tensor.
at::Tensor WithColumnsAfter(const at::Tensor& rows, int64_t count) {
  if (count <= 0 || rows.dim() != 2) return at::Tensor();
  const int64_t spare = AlignedRow(rows.size(1) + count) - rows.size(1);
  if (!HasSpareColumns(rows, spare)) return at::Tensor();
  return WithSpareColumns(rows, spare).narrow(1, 0, rows.size(1) + count);
}

// WidenedWeight's columns for a weight held dequantized: [0 | scale B] after its rows in its
// buffer (noted in the adapters' scope where B is the float32 adapter itself), or none.
HeldWrites HeldWidened(const FrozenWeight& base, int64_t in, const at::Tensor& b, double scale,
                       int64_t offset, at::ScalarType dtype) {
  const at::Tensor wide = ResidentRows({&base}, 0, in + offset + b.size(1), dtype);
  if (!wide.defined()) return {};
  const kernels::ColumnsAfter adapter{offset, b.detach().to(at::kFloat), scale};
  return MakeHeldWrites(kernels::ColumnsAfterBlocks(wide.narrow(1, 0, in), adapter),
                        b.scalar_type() == at::kFloat);
}

// Layer i's weight widened for rows [x | h A_1^T | ... | h A_n^T]: [W_i | 0 | scale_i B_i], the
// base weight [out, in] (dequantized), zeros over the adapters before i (`offset` columns), then
// scale_i * B_i [out, r_i] rounded once to dtype. Rows [T, in + offset + r_i] times its transpose
// are x W_i^T + scale_i (x A_i^T) B_i^T in one GEMM, summed in float32 and rounded once.
at::Tensor WidenedWeight(const FrozenWeight& base, int64_t in, const at::Tensor& b, double scale,
                         int64_t offset, at::ScalarType dtype, AdapterCopies* copies) {
  const int64_t out = b.size(0), r = b.size(1);
  at::Tensor wide = ResidentRows({&base}, 0, in + offset + r, dtype);  // only B's columns to write
  if (wide.defined()) {
    WriteHeld(copies, {HeldWidened(base, in, b, scale, offset, dtype)});
    return wide;
  }
  wide = at::empty({out, AlignedRow(in + offset + r)}, b.options().dtype(dtype))
             .narrow(1, 0, in + offset + r);
  // The product formed in float32 (b's dtype, or b cast exactly) and rounded once.
  const kernels::ColumnsAfter adapter{offset, b.detach().to(at::kFloat), scale};
  base.MaterializeInto(wide.narrow(1, 0, in), &adapter);  // a 4-bit base: one launch for all
  return wide;
}

// y = scale * (h A^T) B^T written by the rank-r GEMM from ha = h A^T (beta = 0), then
// y += x W^T accumulated by the base GEMM (beta = 1), for rows x [T, in]; unset with value_unused.
// With `residual` (rows [T, out] of the residual stream): y = residual + scale * (h A^T) B^T
// from the rank-r GEMM (the residual as its C), then the base GEMM: the decoder's residual add
// inside the GEMMs, with no pass of its own over the stream.
at::Tensor LoraOutput(const at::Tensor& x, const at::Tensor& ha, const at::Tensor& b,
                      const FrozenWeight& base, double scale, bool value_unused,
                      kernels::GemmTuner* gemm, AdapterCopies* copies,
                      const at::Tensor& residual = at::Tensor()) {
  if (value_unused) return ValueUnused({x.size(0), base.out_features}, x.options());
  at::Tensor y = at::empty({x.size(0), base.out_features}, x.options());
  const at::ScalarType dtype = x.scalar_type();
  LoraAddmm(gemm, y, ha, InDtype(copies, b, dtype).t(), /*beta=*/residual.defined() ? 1 : 0,
            /*alpha=*/scale, residual);
  Addmm(gemm, y, x, base.Materialize(dtype).t());
  return y;
}

// The LoRA layer's forward for rows x [T, in] with the adapters' input h (x, or dropout(x)):
// {LoraOutput, h A^T}.
std::pair<at::Tensor, at::Tensor> LoraForward(const at::Tensor& x, const at::Tensor& h,
                                              const at::Tensor& a, const at::Tensor& b,
                                              const FrozenWeight& base, double scale,
                                              bool value_unused, kernels::GemmTuner* gemm,
                                              AdapterCopies* copies,
                                              const at::Tensor& residual = at::Tensor()) {
  const at::Tensor ha = LoraMm(gemm, h, InDtype(copies, a, x.scalar_type()).t());  // [T, r]
  return {LoraOutput(x, ha, b, base, scale, value_unused, gemm, copies, residual), ha};
}

// dh' = (g B) * scale [T, r] and dB = g^T (h A^T) * scale [out, r] into dha and db: one pass
// over g where the kernel takes these tensors (kernels/lora_gradients.h), else two GEMMs.
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

// LoraGradientPair for each of a grouped layer's adapters: one launch for all where the kernel
// takes them together (kernels::LoraGradientPairsFused).
void LoraGradientPairs(kernels::GemmTuner* gemm,
                       const std::vector<kernels::LoraGradientPairOperands>& pairs) {
  if (kernels::LoraGradientPairsFused(pairs)) {
    RECORD_USER_SCOPE(kLoraRange);
    kernels::LoraGradientPairs(pairs);
    return;
  }
  for (const kernels::LoraGradientPairOperands& p : pairs) {
    LoraGradientPair(gemm, p.g, p.b, p.ha, p.scale, p.dha, p.db);
  }
}

struct LoraGradients {
  at::Tensor dha;      // dh' [T, r]
  at::Tensor lora_in;  // dh' A [T, in]: the adapters' part of the input gradient
  // dA [r, in] (slot 0) and dB [out, r] (slot 1) in the compute dtype, cast together (Cast).
  std::optional<AdapterGradients> ab;
  // {dA, dB} in the adapters' dtype.
  std::vector<at::Tensor> Cast(const at::Tensor& a) const { return ab->Cast(a.scalar_type()); }
};

// dh = dh' A [T, in], the adapters' part of the input gradient.
at::Tensor LoraInputGradient(const LoraGradients& d, const at::Tensor& a, at::ScalarType dtype,
                             kernels::GemmTuner* gemm, AdapterCopies* copies) {
  return LoraMm(gemm, d.dha, InDtype(copies, a, dtype));
}

// dA = dh'^T h into its slot.
void LoraAGradient(const LoraGradients& d, const at::Tensor& h, kernels::GemmTuner* gemm) {
  LoraAddmm(gemm, d.ab->Slot(0), d.dha.t(), h, /*beta=*/0.0);
}

// The adapters' gradients for g [T, out] (in ha's dtype), each GEMM writing its result's layout
// (no transposed copies; dh' and dB from one pass over g where LoraGradientPair's kernel runs):
//   dh' = (g B) * scale [T, r];  dh = dh' A;  dA = dh'^T h;  dB = g^T (h A^T) * scale
// Without `input_gradient`, dh is left to the caller (LoraInputGradient), who may free h first;
// without h (undefined), dA is left to the caller too (LoraAGradient), who makes h later.
// dh' goes into `dha_into` where given (the spare columns after g's rows: InputGradientOverRows).
LoraGradients LoraBackward(const at::Tensor& g, const at::Tensor& h, const at::Tensor& ha,
                           const at::Tensor& a, const at::Tensor& b, double scale,
                           kernels::GemmTuner* gemm, AdapterCopies* copies,
                           bool input_gradient = true, const at::Tensor& dha_into = {}) {
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

// The gradient g [T, out] with r columns after its rows for dh' (WithColumnsAfter), where the
// node owns its output gradient's spare columns (saved as "owns_gradient_spare_columns": the
// model knows that nothing else writes there) and g has them; else an undefined tensor.
at::Tensor OwnedColumnsAfter(AutogradContext* ctx, const at::Tensor& g, int64_t r) {
  return ctx->saved_data["owns_gradient_spare_columns"].toBool() ? WithColumnsAfter(g, r)
                                                                 : at::Tensor();
}

// A LoRA layer's input gradient [T, in] from rows [g | dh'] [T, out + r] (g's rows with dh' in
// their spare columns: WithColumnsAfter) as one GEMM over the saved frozen weight with the
// adapter's A [r, in] under it: dx = g W + dh' A, summed in float32 and rounded once (the
// separate rank-r GEMM wrote dh' A [T, in] for the base GEMM to read back and add to). Into `dx`
// where given (rows [T, in]), else a new tensor.
at::Tensor InputGradientOverRows(AutogradContext* ctx, const at::Tensor& rows_with_dha,
                                 const at::Tensor& a, kernels::GemmTuner* gemm,
                                 at::Tensor dx = {}) {
  const int64_t in = a.size(1);
  if (!dx.defined()) dx = at::empty({rows_with_dha.size(0), in}, rows_with_dha.options());
  Addmm(gemm, dx, rows_with_dha, StackedWeights(ctx, {""}, a, in, rows_with_dha.options()),
        /*beta=*/0.0);
  return dx;
}

// x = silu(gate) * up [T, I] written into rows of AlignedRow(I + r) values and ha = x A^T [T, r]
// into the first r of their spare columns (views of those rows): what the down projection's
// widened GEMM (DownOverWidenedRows) reads. A recomputation makes ha by the same call, so a
// checkpointed layer's adapter gradients have a plain layer's bits.
std::pair<at::Tensor, at::Tensor> SwigluIntoWidenedRows(const at::Tensor& gate, const at::Tensor& up,
                                                        const at::Tensor& a,
                                                        kernels::GemmTuner* gemm,
                                                        AdapterCopies* copies) {
  const int64_t in = gate.size(1), r = a.size(0);
  const at::Tensor x = kernels::SwigluForwardWithSpareColumns(gate, up, AlignedRow(in + r) - in);
  const at::Tensor ha = WithSpareColumns(x, x.stride(0) - in).narrow(1, in, r);
  LoraAddmm(gemm, ha, x, InDtype(copies, a, x.scalar_type()).t(), /*beta=*/0.0);
  return {x, ha};
}

// y = [x | x A^T] [W | scale B]^T, plus the residual as the GEMM's C where there is one: the
// projection, its adapter and the decoder's residual add as one GEMM over SwigluIntoWidenedRows'
// rows (no rank-r GEMM writing scale (x A^T) B^T for the base GEMM to read back).
at::Tensor DownOverWidenedRows(const at::Tensor& x, const at::Tensor& b, const FrozenWeight& base,
                               double scale, kernels::GemmTuner* gemm, AdapterCopies* copies,
                               const at::Tensor& residual) {
  const int64_t in = x.size(1), r = b.size(1);
  const at::Tensor wide = WithSpareColumns(x, x.stride(0) - in).narrow(1, 0, in + r);
  at::Tensor y = at::empty({x.size(0), base.out_features}, x.options());
  Addmm(gemm, y, wide, WidenedWeight(base, in, b, scale, 0, x.scalar_type(), copies).t(),
        /*beta=*/residual.defined() ? 1.0 : 0.0, /*alpha=*/1.0, residual);
  return y;
}

// The down projection with its adapter applied to silu(gate) * up, as one node (plus the
// residual stream, where given). The same values and gradients as Swiglu followed by
// LoraLinearFunction (without dropout; with a residual or widened rows, up to where the sums are
// rounded: fused_paths_test), in one of two modes:
//   plain (a layer whose saved tensors live from forward to backward): keeps gate and up (which
//     SwiGLU's backward needs anyway) but not their product x, the projection's input
//     ([T, intermediate], the largest tensor a layer would otherwise save): SwiGLU's backward,
//     which reads gate and up anyway, writes x again (the same bits) for the adapter's A
//     gradient, taken last (no pass of its own over gate and up to recompute it); with
//     lean_backward, x is recomputed first and freed before dx is allocated (one
//     [T, intermediate] less at this backward, one pass more);
//   value_unused (a checkpointed layer's recomputation, which lives one layer's backward): keeps
//     x as well, computes only h A^T (the output only carries the graph, checkpoint.h), and
//     backward writes dx over x once the adapter's gradients have read it.
// Either way SwiGLU's backward then writes grad_gate over dx, so that at the layer's backward,
// the step's memory peak, gate, up, dx and grad_up (and, plain, x) are the only
// [T, intermediate] tensors; with overwrite_inputs (gate and up are the caller's to give up: the
// decoder layer's own intermediates, which no one reads after this node) grad_up is written
// over up as well. With widened_rows, forward is SwigluIntoWidenedRows then DownOverWidenedRows
// (a recomputation's x and dx are then rows of the wider buffer; plain, ha is copied out of it
// so that x goes).
struct SwigluLoraFunction : public torch::autograd::Function<SwigluLoraFunction> {
  // residual: rows [T, out] of the residual stream, or an empty tensor for none (a node's inputs
  // are never undefined).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& residual_or_empty, const at::Tensor& a,
                            const at::Tensor& b, const FrozenWeight* base, double scale,
                            kernels::GemmTuner* gemm, AdapterCopies* copies,
                            const SwigluThenOptions* options) {
    const bool value_unused = options->value_unused;
    const at::Tensor residual = residual_or_empty.numel() > 0 ? residual_or_empty : at::Tensor();
    at::Tensor x, y, ha;
    if (options->widened_rows) {
      std::tie(x, ha) = SwigluIntoWidenedRows(gate, up, a, gemm, copies);
      if (value_unused) {
        y = ValueUnused({x.size(0), base->out_features}, x.options());
      } else {
        y = DownOverWidenedRows(x, b, *base, scale, gemm, copies, residual);
        ha = ha.contiguous();  // [T, r] of its own: x's rows go when forward ends
      }
    } else {
      x = kernels::SwigluForward(gate, up);
      std::tie(y, ha) = LoraForward(x, x, a, b, *base, scale, value_unused, gemm, copies, residual);
    }
    SaveBase(ctx, *base);
    SaveGemm(ctx, gemm);
    SaveCopies(ctx, copies);
    // x, never seen outside this node, is saved only by a recomputation.
    SaveForBackward(ctx, {gate, up, ha, a, b, value_unused ? x : at::Tensor()});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["overwrite_inputs"] = options->overwrite_inputs;
    ctx->saved_data["lean_backward"] = options->lean_backward;
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["owns_gradient_spare_columns"] = options->owns_output_gradient_spare_columns;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& g = grad_outputs[0];
    const variable_list saved = SavedForBackward(ctx);
    if (!g.defined()) return variable_list(10);
    const at::Tensor &gate = saved[0], &up = saved[1], &ha = saved[2], &a = saved[3], &b = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::ScalarType dtype = gate.scalar_type();
    const at::Tensor grad = g.scalar_type() == dtype ? g : g.to(dtype);
    kernels::GemmTuner* gemm = SavedGemm(ctx);
    AdapterCopies* copies = SavedCopies(ctx);
    LoraGradients d;
    at::Tensor dx;
    const bool recomputation = saved[5].defined();
    const bool lean = ctx->saved_data["lean_backward"].toBool();
    // Where the gradient's rows have spare columns: dh' there, and dx = [g | dh'] [W; A] as one
    // GEMM (InputGradientOverRows) instead of dh' A written for the base GEMM to add to.
    const at::Tensor grad_with_dha = OwnedColumnsAfter(ctx, grad, b.size(1));
    const at::Tensor dha_into = grad_with_dha.defined()
                                    ? grad_with_dha.narrow(1, grad.size(1), b.size(1))
                                    : at::Tensor();
    if (recomputation) {
      dx = saved[5];  // x: read by the adapter's gradients, then overwritten by dx
      d = LoraBackward(grad, dx, ha, a, b, scale, gemm, copies, /*input_gradient=*/false,
                       dha_into);
      if (!dha_into.defined()) LoraAddmm(gemm, dx, d.dha, InDtype(copies, a, dtype), /*beta=*/0.0);
    } else if (lean) {
      {
        const at::Tensor x = kernels::SwigluForward(gate, up);  // freed before dx is allocated
        d = LoraBackward(grad, x, ha, a, b, scale, gemm, copies, /*input_gradient=*/false,
                         dha_into);
      }
      if (!dha_into.defined()) dx = LoraInputGradient(d, a, dtype, gemm, copies);
    } else {
      // dA waits for x, which SwiGLU's backward below writes from the gate and up it reads.
      d = LoraBackward(grad, at::Tensor(), ha, a, b, scale, gemm, copies, /*input_gradient=*/false,
                       dha_into);
      if (!dha_into.defined()) dx = LoraInputGradient(d, a, dtype, gemm, copies);
    }
    if (dha_into.defined()) {
      dx = InputGradientOverRows(ctx, grad_with_dha, InDtype(copies, a, dtype), gemm, dx);
    } else {
      Addmm(gemm, dx, grad, SavedBase(ctx, dtype));  // dx = dh' A + g W
    }
    const bool product_wanted = !recomputation && !lean;
    at::Tensor grad_gate = dx, grad_up, x;
    at::Tensor* product = product_wanted ? &x : nullptr;
    const bool overwrite = ctx->saved_data["overwrite_inputs"].toBool();
    if (overwrite && PackedColumns({gate, up}).defined()) {
      // gate and up side by side (packed gate/up): their gradients go over them, packed as
      // well, for the gate/up node's one GEMM; dx goes when this returns.
      grad_gate = gate;
      grad_up = up;
      kernels::SwigluBackwardIntoInputs(dx, grad_gate, grad_up, product);
    } else if (overwrite && up.is_contiguous()) {
      grad_up = up;
      kernels::SwigluBackwardOverInputs(dx, gate, grad_up, product);
    } else {
      grad_up = kernels::SwigluBackwardInPlace(dx, gate, up, product);
    }
    if (product_wanted) LoraAGradient(d, x, gemm);
    const std::vector<at::Tensor> ab = d.Cast(a);
    // The residual stream's own gradient is the output's (y = residual + ...).
    const at::Tensor grad_residual = ctx->saved_data["residual"].toBool() ? g : at::Tensor();
    return {grad_gate,    grad_up,      grad_residual, ab[0],        ab[1],       at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(),  at::Tensor()};
  }
};

// y = x W^T + scale * (h A^T) B^T for rows of tokens x [T, in] (h = dropout(x), or x itself: the
// same tensor, which then gets no gradient of its own), as one autograd node, so that no pass over
// [T, out] or [T, in] is spent on adding partial results and no separate nodes or casts run:
//   forward:  y = scale * (h A^T) B^T        the rank-r GEMM writes y (beta = 0)
//             y += x W^T                     the base GEMM accumulates into it (beta = 1)
//   backward: dh' = (g B) * scale            [T, r]
//             dx = dh' A;  dx += g W         the rank-r GEMM writes dx, the base GEMM adds to it
//             dA = (h^T dh')^T, dB = ((h A^T)^T g * scale)^T   in float32, the adapters' dtype
// The large base term is rounded once, inside its GEMM's epilogue, where the separate ops (base
// output, then addmm into it) rounded it twice: in bf16 the node is at least as close to the
// float32 formula as they were (fused_paths_test checks both against it). With dropout, dh' A is
// h's gradient (autograd then takes it through the dropout to x). With value_unused (a
// checkpointed block's recomputation, see checkpoint.h) forward computes h A^T alone, which
// backward reads, and returns y unset.
struct LoraLinearFunction : public torch::autograd::Function<LoraLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& h,
                            const at::Tensor& a, const at::Tensor& b, const FrozenWeight* base,
                            double scale, bool value_unused, kernels::GemmTuner* gemm,
                            AdapterCopies* copies, bool owns_gradient_spare_columns) {
    const at::Tensor& lora_in = h;
    auto [y, ha] = LoraForward(x, lora_in, a, b, *base, scale, value_unused, gemm, copies);
    SaveBase(ctx, *base);
    SaveGemm(ctx, gemm);
    SaveCopies(ctx, copies);
    SaveForBackward(ctx, {lora_in, ha, a, b});
    ctx->saved_data["dropout"] = !h.is_same(x);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["owns_gradient_spare_columns"] = owns_gradient_spare_columns;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& g = grad_outputs[0];
    const variable_list saved = SavedForBackward(ctx);
    const at::Tensor &lora_in = saved[0], &ha = saved[1], &a = saved[2], &b = saved[3];
    const bool dropout = ctx->saved_data["dropout"].toBool();
    const double scale = ctx->saved_data["scale"].toDouble();
    if (!g.defined()) return variable_list(10);
    const at::ScalarType dtype = lora_in.scalar_type();
    const at::Tensor grad = g.scalar_type() == dtype ? g : g.to(dtype);
    kernels::GemmTuner* gemm = SavedGemm(ctx);
    // The input gradients only where something below takes them (x and h are one tensor
    // without dropout: then h's flag is x's).
    const bool x_grad = ctx->needs_input_grad(0), h_grad = dropout && ctx->needs_input_grad(1);
    // Without dropout, where the gradient's rows have spare columns: dh' there, dx one GEMM.
    const at::Tensor grad_with_dha =
        !dropout && x_grad ? OwnedColumnsAfter(ctx, grad, b.size(1)) : at::Tensor();
    AdapterCopies* copies = SavedCopies(ctx);
    LoraGradients d = LoraBackward(
        grad, lora_in, ha, a, b, scale, gemm, copies,
        /*input_gradient=*/dropout ? h_grad : x_grad && !grad_with_dha.defined(),
        grad_with_dha.defined() ? grad_with_dha.narrow(1, grad.size(1), b.size(1)) : at::Tensor());
    at::Tensor dx, dh;
    if (dropout) {
      if (x_grad) dx = Mm(gemm, grad, SavedBase(ctx, dtype));
      dh = d.lora_in;
    } else if (grad_with_dha.defined()) {
      dx = InputGradientOverRows(ctx, grad_with_dha, InDtype(copies, a, dtype), gemm);
    } else if (x_grad) {
      dx = d.lora_in;
      Addmm(gemm, dx, grad, SavedBase(ctx, dtype));
    }
    const std::vector<at::Tensor> ab = d.Cast(a);
    return {dx,           dh,           ab[0],        ab[1],        at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};


// What the group nodes keep for GroupBackward: `leading` (x, and ha where it is a tensor of its
// own), then the As and the Bs; and the layers' ranks and scales.
void SaveGroup(AutogradContext* ctx, variable_list leading, at::TensorList a, at::TensorList b,
               const std::vector<int64_t>& ranks, const std::vector<double>& scales) {
  leading.insert(leading.end(), a.begin(), a.end());
  leading.insert(leading.end(), b.begin(), b.end());
  SaveForBackward(ctx, leading);
  ctx->saved_data["ranks"] = ranks;
  ctx->saved_data["scales"] = scales;
}

// The backward of the layers that read x [T, in] as one node (LoraGroupFunction and
// LoraWideGroupFunction), from ha = x [A_1; ...; A_n]^T [T, sum of r] and `adapters` (the As,
// then the Bs): per layer dh'_i = (g_i B_i) * scale_i and dB_i (LoraGradientPair), then one GEMM
// for all the A gradients and x's gradient built in one buffer,
// dx = [dh'_1 ... dh'_n] [A_1; ...; A_n] then += g_i W_i for each i. Where the gradients lie
// packed in rows with sum(r_i) spare columns after them (PackedForward's gate/up rows, which
// SwiGLU's backward writes them over), dh' goes into those columns and x's gradient is one GEMM,
// dx = [g_1 ... g_n | dh'] [W_1; ...; W_n; A_1; ...; A_n], summed in float32 and rounded once
// (no [T, in] pass writing dh' A for the base GEMM to read back and add to).
// With `normed`, x is the source of the node's input rms_norm(x) * weight (linear4bit.h
// NormedInput; normed->source is not read): the As' gradient is ((rstd dh')^T x) diag(weight).
variable_list GroupBackward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& ha,
                            at::TensorList adapters, const variable_list& grad_outputs,
                            const NormedInput* normed = nullptr) {
  const std::vector<int64_t> ranks = ctx->saved_data["ranks"].toIntVector();
  const std::vector<double> scales = ctx->saved_data["scales"].toDoubleVector();
  const size_t n = ranks.size();
  const at::ScalarType dtype = x.scalar_type();
  const at::TensorList a = adapters.slice(0, n), b = adapters.slice(n, n);
  variable_list grads(1 + 2 * n + 2);  // x, the As, the Bs, then group and value_unused
  kernels::GemmTuner* gemm = SavedGemm(ctx);
  AdapterCopies* copies = SavedCopies(ctx);
  std::vector<at::Tensor> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = grad_outputs[i].to(dtype);  // autograd passes zeros for an output without one
  }
  int64_t rank_sum = 0;
  for (int64_t r : ranks) rank_sum += r;
  const at::Tensor packed = PackedColumns(g);
  // [g_1 ... g_n | dh'] where the packed gradients have the spare columns for dh'.
  const at::Tensor packed_with_dha = ctx->needs_input_grad(0) && packed.defined()
                                         ? WithColumnsAfter(packed, rank_sum)
                                         : at::Tensor();
  const at::Tensor dha = packed_with_dha.defined()  // [T, sum of r]
                             ? packed_with_dha.narrow(1, packed.size(1), rank_sum)
                             : at::empty({x.size(0), ha.size(1)}, x.options());
  // The As' gradients as one [sum of r, in] block (slot 0), then each B's (slot 1 + i), in x's
  // dtype, cast to the adapters' dtype together.
  std::vector<std::vector<int64_t>> shapes = {{rank_sum, x.size(1)}};
  for (size_t i = 0; i < n; ++i) shapes.push_back(b[i].sizes().vec());
  const AdapterGradients adapter_grads(shapes, x.options());
  std::vector<kernels::LoraGradientPairOperands> pairs;
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    pairs.push_back({g[i], InDtype(copies, b[i], dtype), ha.narrow(1, offset, ranks[i]),
                     scales[i], dha.narrow(1, offset, ranks[i]), adapter_grads.Slot(1 + i)});
    offset += ranks[i];
  }
  // With `normed`, the norm's factors go outside the As' GEMM: its rows' rstd on dh' ([T, sum
  // of r], rounded once to the dtype as x's rows were: written by the pair kernel's reduction
  // where it runs, else one pass after it), the weight on the float32 result's columns below.
  at::Tensor scaled;
  if (normed != nullptr) {
    scaled = at::empty({dha.size(0), dha.size(1)}, dha.options());
    std::vector<kernels::LoraGradientPairOperands> with_rstd = pairs;
    int64_t column = 0;
    for (size_t i = 0; i < n; ++i) {
      with_rstd[i].row_scale = normed->rstd;
      with_rstd[i].dha_scaled = scaled.narrow(1, column, ranks[i]);
      column += ranks[i];
    }
    if (kernels::LoraGradientPairsFused(with_rstd)) pairs = std::move(with_rstd);
  }
  LoraGradientPairs(gemm, pairs);
  if (normed != nullptr) {
    if (!pairs[0].dha_scaled.defined()) {
      at::mul_out(scaled, dha, normed->rstd.reshape({-1, 1}));  // one pass, float32 inside
    }
    LoraAddmm(gemm, adapter_grads.Slot(0), scaled.t(), x, 0.0);
  } else {
    LoraAddmm(gemm, adapter_grads.Slot(0), dha.t(), x, 0.0);
  }
  // The norm weight's factor on the As' gradient's columns, in the cast's pass.
  const std::vector<at::Tensor> cast = adapter_grads.Cast(
      a[0].scalar_type(), normed != nullptr ? normed->weight : at::Tensor());
  const std::vector<at::Tensor> da = cast[0].split_with_sizes(ranks, 0);
  for (size_t i = 0; i < n; ++i) {
    grads[1 + i] = da[i];
    grads[1 + n + i] = cast[1 + i];
  }
  // x's gradient only where something below takes it: the first decoder layer's q/k/v read the
  // embeddings' norm, which nothing trains (n base GEMMs and dequantizations a step saved).
  if (!ctx->needs_input_grad(0)) return grads;
  if (packed.defined()) {
    // Gradients packed side by side (gate/up, as SwiGLU's backward writes them): one GEMM over
    // the stacked weights [W_1; ...; W_n] (dequantized into one buffer), with the As below them
    // where dh' lies after the gradients.
    std::vector<std::string> prefixes;
    for (size_t i = 0; i < n; ++i) prefixes.push_back(std::to_string(i) + ".");
    if (packed_with_dha.defined()) {
      grads[0] = at::empty({x.size(0), x.size(1)}, x.options());
      Addmm(gemm, grads[0], packed_with_dha,
            StackedWeights(ctx, prefixes, InDtype(copies, a, dtype), x.size(1), x.options()),
            /*beta=*/0.0);
      return grads;
    }
    grads[0] = LoraMm(gemm, dha, InDtype(copies, a, dtype));  // [T, in]
    Addmm(gemm, grads[0], packed,
          StackedWeights(ctx, prefixes, at::Tensor(), x.size(1), x.options()));
    return grads;
  }
  const at::Tensor dx = LoraMm(gemm, dha, InDtype(copies, a, dtype));  // [T, in]
  for (size_t i = 0; i < n; ++i) {
    Addmm(gemm, dx, g[i], SavedBase(ctx, dtype, std::to_string(i) + "."));
  }
  grads[0] = dx;
  return grads;
}

// Linears with LoRA adapters that read the same input x [T, in] (q/k/v, gate/up), as one node:
// the per-layer formula of LoraLinearFunction (rank-r GEMM writes y_i, base GEMM accumulates),
// with what the layers share done once: one GEMM x [A_1; ...; A_n]^T for all the rank-r
// projections (x read once, not n times), one for all the A gradients, and x's gradient built in
// one buffer, dx = [dh'_1 ... dh'_n] [A_1; ...; A_n] then += g_i W_i for each i, instead of n
// gradients that autograd then adds. Without dropout only (each PEFT layer draws its own mask).
// Inputs: x, then the A list, then the B list; `group` holds the frozen weights and scales.
struct LoraGroupFunction : public torch::autograd::Function<LoraGroupFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList a,
                               at::TensorList b, const std::vector<const LinearLayer*>* group,
                               bool value_unused) {
    const at::ScalarType dtype = x.scalar_type();
    const size_t n = group->size();
    std::vector<int64_t> ranks;
    for (size_t i = 0; i < n; ++i) ranks.push_back(a[i].size(0));
    kernels::GemmTuner* gemm = (*group)[0]->gemm;
    AdapterCopies* copies = (*group)[0]->adapter_copies;
    SaveGemm(ctx, gemm);
    SaveCopies(ctx, copies);
    const at::Tensor ha = LoraMm(gemm, x, InDtype(copies, a, dtype).t());  // [T, sum of r]
    const std::vector<at::Tensor> ha_i = ha.split_with_sizes(ranks, 1);
    variable_list outputs;
    std::vector<double> scales;
    for (size_t i = 0; i < n; ++i) {
      const LinearLayer& layer = *(*group)[i];
      outputs.push_back(
          LoraOutput(x, ha_i[i], b[i], layer.base, layer.lora->scale, value_unused, gemm, copies));
      SaveBase(ctx, layer.base, std::to_string(i) + ".");
      scales.push_back(layer.lora->scale);
    }
    SaveGroup(ctx, {x, ha}, a, b, ranks, scales);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = SavedForBackward(ctx);
    return GroupBackward(ctx, saved[0], saved[1], at::TensorList(saved).slice(2), grad_outputs);
  }
};

// The packed form of LoraWideGroupFunction's forward (SharedInputForward over equally wide
// layers without biases): the layers' widened weights stacked into one [sum of out, in + sum of
// r] weight (layer i's rows [W_i | 0 | s_i B_i | 0], its adapter's columns at its offset), one
// GEMM of the widened rows `wide` [T, in + sum of r] writing the packed outputs [T, sum of out];
// with a rotary (q/k/v), then the rotation of the first two layers' columns (q and k) in place,
// in one pass. Returns each layer's columns (views of the packed rows).
variable_list PackedForward(const at::Tensor& wide, at::TensorList b,
                            const std::vector<const LinearLayer*>& group,
                            const SharedInputRotary* rotary, kernels::GemmTuner* gemm,
                            AdapterCopies* copies) {
  const int64_t width = wide.size(1);
  const int64_t in = group[0]->base.in_features, rank_sum = width - in;
  int64_t total = 0;
  std::vector<const FrozenWeight*> bases;
  for (const LinearLayer* layer : group) {
    total += layer->base.out_features;
    bases.push_back(&layer->base);
  }
  // Held dequantized (resident_weights.h): only the adapters' columns are written, all in one
  // launch, and not at all where the adapters' scope has them written (WriteHeldAdapters, or
  // an earlier micro-batch); else each layer's launch writes its rows whole, zeros around its
  // own B.
  at::Tensor stacked = ResidentRows(bases, 0, width, wide.scalar_type());
  if (stacked.defined()) {
    WriteHeld(copies, {HeldPackedColumns(stacked, group, b, in)});
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
  // Without a rotary (gate/up), the rows keep sum(r) spare columns (aligned) after the outputs:
  // their gradients come back over them, and GroupBackward writes dh' there (WithColumnsAfter).
  const at::Tensor packed =
      rotary == nullptr ? RowsWithColumnsAfter(wide.size(0), total, rank_sum, wide.options())
                        : at::empty({wide.size(0), total}, wide.options());
  Addmm(gemm, packed, wide, stacked.t(), 0.0);
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
    for (size_t i = 0; i < n; ++i) {
      const LinearLayer& layer = *(*group)[i];
      const int64_t out = layer.base.out_features;
      if (!packed && value_unused) {
        outputs.push_back(ValueUnused({rows, out}, x.options()));
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

// A layer's rows [T, out] back in the shape of its input (`input_sizes`, last dim out), plus
// its frozen bias.
at::Tensor ToLayerOutput(const at::Tensor& rows, at::IntArrayRef input_sizes,
                         const FrozenWeight& base) {
  std::vector<int64_t> sizes = input_sizes.vec();
  sizes.back() = base.out_features;
  const at::Tensor y = rows.view(sizes);
  return base.bias.defined() ? y + base.bias.to(y.scalar_type()) : y;
}

// Whether the layer's adapter runs without dropout (the fused nodes' condition: each PEFT layer
// draws its own dropout mask, which they do not).
bool AdapterWithoutDropout(const LinearLayer& layer, bool training) {
  return layer.lora && !(training && layer.lora->dropout > 0);
}

// Whether SharedInputForward runs `layers` as one node: several layers, each with an adapter
// and no dropout running.
bool Grouped(const std::vector<const LinearLayer*>& layers, bool training) {
  bool grouped = layers.size() > 1;
  for (const LinearLayer* layer : layers) {
    grouped = grouped && AdapterWithoutDropout(*layer, training);
  }
  return grouped;
}

// Whether SharedInputForward's widened node may run `layers` packed (PackedForward): equally
// wide layers (q/k/v of multi-head attention: the packed layout cuDNN reads; gate/up: the packed
// rows SwiGLU reads, whose gradients it writes back packed) and no biases (a rotation would come
// before them).
bool Packable(const std::vector<const LinearLayer*>& layers) {
  bool packable = layers.size() >= 2;
  for (const LinearLayer* layer : layers) {
    packable = packable && !layer->base.bias.defined() &&
               layer->base.out_features == layers[0]->base.out_features;
  }
  return packable;
}

// The rotary node over y [..., out] seen as [batch, heads, seq, head_dim], back in y's shape.
at::Tensor RotaryRows(const at::Tensor& y, const SharedInputRotary& rotary) {
  const int64_t out = y.size(-1);
  const at::Tensor heads =
      y.reshape({rotary.batch, rotary.seq, out / rotary.head_dim, rotary.head_dim}).transpose(1, 2);
  return Rotary(heads, rotary.cos, rotary.sin).transpose(1, 2).reshape(y.sizes());
}

// Whether every layer is held dequantized with an adapter that runs without dropout.
bool HeldWithAdapters(const std::vector<const LinearLayer*>& layers, bool training) {
  bool held = !layers.empty();
  for (const LinearLayer* layer : layers) {
    held = held && layer->base.resident.defined() && AdapterWithoutDropout(*layer, training);
  }
  return held;
}

}  // namespace

std::vector<HeldWrites> HeldGroupColumns(const std::vector<const LinearLayer*>& layers,
                                         bool training) {
  if (!HeldWithAdapters(layers, training) || !Grouped(layers, training)) return {};
  const int64_t in = layers[0]->base.in_features;
  const at::ScalarType dtype = layers[0]->base.resident.scalar_type();
  if (!Packable(layers)) {  // each layer's widened weight (LoraWideGroupFunction's per layer)
    std::vector<HeldWrites> writes;
    int64_t offset = 0;
    for (const LinearLayer* layer : layers) {
      writes.push_back(HeldWidened(layer->base, in, layer->lora->b, layer->lora->scale, offset,
                                   dtype));
      offset += layer->lora->b.size(1);
    }
    return writes;
  }
  int64_t rank_sum = 0;
  std::vector<const FrozenWeight*> bases;
  std::vector<at::Tensor> b;
  for (const LinearLayer* layer : layers) {
    rank_sum += layer->lora->b.size(1);
    bases.push_back(&layer->base);
    b.push_back(layer->lora->b);
  }
  const at::Tensor stacked = ResidentRows(bases, 0, in + rank_sum, dtype);
  if (!stacked.defined()) return {};
  return {HeldPackedColumns(stacked, layers, b, in)};
}

HeldWrites HeldWidenedColumns(const LinearLayer& layer, bool training) {
  if (!HeldWithAdapters({&layer}, training)) return {};
  return HeldWidened(layer.base, layer.base.in_features, layer.lora->b, layer.lora->scale, 0,
                     layer.base.resident.scalar_type());
}

HeldWrites HeldRowsBelow(const std::vector<const LinearLayer*>& layers, bool training) {
  if (!HeldWithAdapters(layers, training)) return {};
  const int64_t in = layers[0]->base.in_features;
  const at::ScalarType dtype = layers[0]->base.resident.scalar_type();
  std::vector<const FrozenWeight*> bases;
  std::vector<at::Tensor> a;
  int64_t rows = 0, rank_sum = 0;
  for (const LinearLayer* layer : layers) {
    bases.push_back(&layer->base);
    a.push_back(layer->lora->a);
    rows += layer->base.out_features;
    rank_sum += layer->lora->a.size(0);
  }
  // The buffer's rows with the As' under the weights, as StackedWeights takes them.
  const at::Tensor stacked = ResidentRows(bases, rank_sum, in, dtype);
  if (!stacked.defined()) return {};
  AdapterCopies* copies = layers[0]->adapter_copies;
  return HeldAs(stacked.narrow(0, rows, rank_sum), InDtype(copies, a, dtype), copies);
}

kernels::Quantized4bit WithCodesOnDevice(const kernels::Quantized4bit& q) {
  if (q.packed.device() == q.absmax.device()) return q;
  kernels::Quantized4bit on_device = q;
  on_device.packed = q.packed.to(q.absmax.device());
  return on_device;
}

kernels::Quantized4bit QuantizeWeight(const at::Tensor& weight,
                                      const kernels::Quantize4bitOptions& options) {
  return kernels::Quantize4bit(weight, options);
}

at::Tensor DequantizeWeight(const kernels::Quantized4bit& q, at::ScalarType dtype) {
  return kernels::Dequantize4bit(WithCodesOnDevice(q), dtype);
}

at::Tensor BitsandbytesQuantMap(kernels::QuantType type) { return kernels::SerializedQuantMap(type); }

at::Tensor Linear4bit(const at::Tensor& x, const kernels::Quantized4bit& weight) {
  return Linear4bitFunction::apply(x, &weight, /*value_unused=*/false,
                                   static_cast<kernels::GemmTuner*>(nullptr),
                                   static_cast<const at::Tensor*>(nullptr));
}

at::Tensor FrozenWeight::Materialize(at::ScalarType dtype) const {
  if (resident.defined() && resident.scalar_type() == dtype) return resident;
  return quantized ? DequantizeWeight(*quantized, dtype) : dense.to(dtype);
}

bool FrozenWeight::IsResidentView(const at::Tensor& out) const {
  return resident.defined() && out.data_ptr() == resident.data_ptr() &&
         out.sizes() == resident.sizes() && out.strides() == resident.strides() &&
         out.scalar_type() == resident.scalar_type();
}

void FrozenWeight::MaterializeInto(const at::Tensor& out,
                                   const kernels::ColumnsAfter* after) const {
  if (resident.defined()) {
    if (!IsResidentView(out)) at::Tensor(out).copy_(resident);
    if (after != nullptr) kernels::WriteColumnsAfter(out, *after);
    return;
  }
  if (quantized) {
    kernels::Dequantize4bitInto(WithCodesOnDevice(*quantized), out, after);
    return;
  }
  out.copy_(dense);
  if (after != nullptr) kernels::WriteColumnsAfter(out, *after);
}

at::Tensor FrozenWeight::Apply(const at::Tensor& x) const {
  const at::Tensor y =
      quantized ? Linear4bitFunction::apply(x, &*quantized, /*value_unused=*/false,
                                            static_cast<kernels::GemmTuner*>(nullptr), &resident)
                : at::linear(x, dense.scalar_type() == x.scalar_type() ? dense
                                                                       : dense.to(x.scalar_type()));
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

at::Tensor LinearLayer::Forward(const at::Tensor& x, bool training, bool value_unused) const {
  if (!lora) {
    // The 4-bit node itself where the recomputation skips its GEMM or the tuner runs it.
    if (base.quantized && !base.bias.defined() && (value_unused || gemm != nullptr)) {
      return Linear4bitFunction::apply(x, &*base.quantized, value_unused, gemm, &base.resident);
    }
    return base.Apply(x);
  }
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // rows of tokens
  const at::Tensor h =
      AdapterWithoutDropout(*this, training) ? x2 : at::dropout(x2, lora->dropout, training);
  return ToLayerOutput(
      LoraLinearFunction::apply(x2, h, lora->a, lora->b, &base, lora->scale, value_unused, gemm,
                                adapter_copies, owns_output_gradient_spare_columns),
      x.sizes(), base);
}

at::Tensor LinearLayer::MergedWeight() const {
  at::Tensor w = base.Materialize(at::kFloat);
  if (lora) w = w + at::matmul(lora->b.detach().to(at::kFloat), lora->a.detach().to(at::kFloat)) * lora->scale;
  return w;
}

int64_t OutputGradientSpareColumns(const LinearLayer& layer, bool training) {
  if (!AdapterWithoutDropout(layer, training)) return 0;
  const int64_t out = layer.base.out_features;
  return AlignedRow(out + layer.lora->b.size(1)) - out;
}

int64_t SharedInputSpareColumns(const std::vector<const LinearLayer*>& layers, bool training) {
  if (!Grouped(layers, training)) return 0;
  int64_t rank_sum = 0;
  for (const LinearLayer* layer : layers) rank_sum += layer->lora->a.size(0);
  const int64_t in = layers[0]->lora->a.size(1);
  return AlignedRow(in + rank_sum) - in;
}

std::vector<at::Tensor> SharedInputForward(const std::vector<const LinearLayer*>& layers,
                                           const at::Tensor& x, bool training, bool value_unused,
                                           const SharedInputRotary* rotary,
                                           const NormedInput* normed) {
  std::vector<at::Tensor> out;
  bool rotated = false;
  if (!Grouped(layers, training)) {
    for (const LinearLayer* layer : layers) {
      out.push_back(layer->Forward(x, training, value_unused));
    }
  } else {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // rows of tokens
    std::vector<at::Tensor> a, b;
    for (const LinearLayer* layer : layers) {
      a.push_back(layer->lora->a);
      b.push_back(layer->lora->b);
    }
    variable_list ys;
    if (HasSpareColumns(x2, SharedInputSpareColumns(layers, training))) {
      const bool packed = !value_unused && Packable(layers);
      ys = LoraWideGroupFunction::apply(x2, at::TensorList(a), at::TensorList(b), &layers,
                                        value_unused, packed, packed ? rotary : nullptr, normed);
      rotated = packed;
    } else {
      ys = LoraGroupFunction::apply(x2, at::TensorList(a), at::TensorList(b), &layers,
                                    value_unused);
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      out.push_back(ToLayerOutput(ys[i], x.sizes(), layers[i]->base));
    }
  }
  if (rotary != nullptr && !rotated) {
    for (size_t i = 0; i < 2 && i < out.size(); ++i) out[i] = RotaryRows(out[i], *rotary);
  }
  return out;
}

at::Tensor SwigluThenForward(const LinearLayer& down, at::Tensor gate, at::Tensor up,
                             const SwigluThenOptions& options, const at::Tensor& residual) {
  const bool node = AdapterWithoutDropout(down, options.training);
  // The residual as the node's GEMM's C where nothing comes after the GEMMs (a bias would).
  const bool residual_inside = node && residual.defined() && !down.base.bias.defined();
  auto with_residual = [&](const at::Tensor& y) {
    if (!residual.defined() || residual_inside) return y;
    return options.value_unused ? SumGraphOnly(residual, y) : residual + y;
  };
  if (!node) {
    return with_residual(down.Forward(Swiglu(std::move(gate), std::move(up)), options.training,
                                      options.value_unused));
  }
  const std::vector<int64_t> sizes = gate.sizes().vec();
  at::Tensor g2 = gate.reshape({-1, gate.size(-1)}), u2 = up.reshape({-1, up.size(-1)});
  gate.reset();
  up.reset();
  const at::Tensor r2 =
      residual_inside ? residual.reshape({-1, down.base.out_features}) : at::Tensor();
  at::Tensor y;
  if (at::GradMode::is_enabled()) {
    const at::Tensor node_residual = r2.defined() ? r2 : at::empty({0}, g2.options());
    y = SwigluLoraFunction::apply(g2, u2, node_residual, down.lora->a, down.lora->b, &down.base,
                                  down.lora->scale, down.gemm, down.adapter_copies, &options);
  } else if (options.widened_rows) {
    // The node's forward, but gate and up are let go once SwiGLU has read them: the same bits.
    const at::Tensor x = SwigluIntoWidenedRows(std::exchange(g2, {}), std::exchange(u2, {}),
                                               down.lora->a, down.gemm, down.adapter_copies)
                             .first;
    y = DownOverWidenedRows(x, down.lora->b, down.base, down.lora->scale, down.gemm,
                            down.adapter_copies, r2);
  } else {
    at::Tensor x = kernels::SwigluForward(std::exchange(g2, {}), std::exchange(u2, {}));
    y = LoraForward(x, x, down.lora->a, down.lora->b, down.base, down.lora->scale,
                    options.value_unused, down.gemm, down.adapter_copies, r2)
            .first;
  }
  return with_residual(ToLayerOutput(y, sizes, down.base));
}

}  // namespace qlora::engine
