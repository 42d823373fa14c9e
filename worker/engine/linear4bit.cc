// Linear4bit, frozen weights and the LoRA layers (linear4bit.h): the autograd nodes they run live
// in files of their own, reached through linear4bit_internal.h's entry functions.
#include "worker/engine/linear4bit.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/block_writes.h"
#include "kernels/fused_elementwise.h"
#include "kernels/quantize_4bit.h"
#include "worker/engine/aligned_rows.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/linear4bit_internal.h"

namespace qlora::engine {
namespace {

using linear4bit_internal::ApplyLinear4bit;
using linear4bit_internal::ApplyLoraGroup;
using linear4bit_internal::ApplyLoraLinear;
using linear4bit_internal::ApplyLoraWideGroup;
using linear4bit_internal::ApplySwigluLora;
using linear4bit_internal::DownOverWidenedRows;
using linear4bit_internal::HasSpareColumns;
using linear4bit_internal::DequantizedAs;
using linear4bit_internal::DequantizedPackedColumns;
using linear4bit_internal::DequantizedWidened;
using linear4bit_internal::InDtype;
using linear4bit_internal::LoraForward;
using linear4bit_internal::DequantizedRows;
using linear4bit_internal::SwigluIntoWidenedRows;
using torch::autograd::variable_list;

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

DequantizedWrites MakeDequantizedWrites(std::vector<kernels::BlockWrite> blocks, bool stable) {
  DequantizedWrites w;
  w.signature = BlocksSignature(blocks);
  w.key = blocks.empty() ? nullptr : blocks[0].out.data_ptr();
  w.blocks = std::move(blocks);
  w.stable = stable;
  return w;
}

void WriteDequantized(AdapterCopies* copies, const std::vector<DequantizedWrites>& writes) {
  std::vector<kernels::BlockWrite> blocks;
  std::vector<const DequantizedWrites*> to_note;
  for (const DequantizedWrites& w : writes) {
    if (w.blocks.empty()) continue;
    const bool noted = w.stable && copies != nullptr;
    if (noted && copies->Written(w.key, w.signature)) continue;
    blocks.insert(blocks.end(), w.blocks.begin(), w.blocks.end());
    if (noted) to_note.push_back(&w);
  }
  kernels::WriteBlocks(blocks);
  for (const DequantizedWrites* w : to_note) copies->NoteWritten(w->key, w->signature);
}

namespace {

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

// Whether every layer is kept dequantized with an adapter that runs without dropout.
bool DequantizedWithAdapters(const std::vector<const LinearLayer*>& layers, bool training) {
  bool held = !layers.empty();
  for (const LinearLayer* layer : layers) {
    held = held && layer->base.dequantized.defined() && AdapterWithoutDropout(*layer, training);
  }
  return held;
}

}  // namespace

std::vector<DequantizedWrites> DequantizedGroupColumns(const std::vector<const LinearLayer*>& layers,
                                         bool training) {
  if (!DequantizedWithAdapters(layers, training) || !Grouped(layers, training)) return {};
  const int64_t in = layers[0]->base.in_features;
  const at::ScalarType dtype = layers[0]->base.dequantized.scalar_type();
  if (!Packable(layers)) {  // each layer's widened weight (LoraWideGroupFunction's per layer)
    std::vector<DequantizedWrites> writes;
    int64_t offset = 0;
    for (const LinearLayer* layer : layers) {
      writes.push_back(DequantizedWidened(layer->base, in, layer->lora->b, layer->lora->scale, offset,
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
  const at::Tensor stacked = DequantizedRows(bases, 0, in + rank_sum, dtype);
  if (!stacked.defined()) return {};
  return {DequantizedPackedColumns(stacked, layers, b, in)};
}

DequantizedWrites DequantizedWidenedColumns(const LinearLayer& layer, bool training) {
  if (!DequantizedWithAdapters({&layer}, training)) return {};
  return DequantizedWidened(layer.base, layer.base.in_features, layer.lora->b, layer.lora->scale, 0,
                     layer.base.dequantized.scalar_type());
}

DequantizedWrites DequantizedRowsBelow(const std::vector<const LinearLayer*>& layers, bool training) {
  if (!DequantizedWithAdapters(layers, training)) return {};
  const int64_t in = layers[0]->base.in_features;
  const at::ScalarType dtype = layers[0]->base.dequantized.scalar_type();
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
  const at::Tensor stacked = DequantizedRows(bases, rank_sum, in, dtype);
  if (!stacked.defined()) return {};
  AdapterCopies* copies = layers[0]->adapter_copies;
  return DequantizedAs(stacked.narrow(0, rows, rank_sum), InDtype(copies, a, dtype), copies);
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
  return ApplyLinear4bit(x, &weight, /*value_unused=*/false, /*gemm=*/nullptr,
                         /*dequantized=*/nullptr);
}

at::Tensor FrozenWeight::Materialize(at::ScalarType dtype) const {
  if (dequantized.defined() && dequantized.scalar_type() == dtype) return dequantized;
  return quantized ? DequantizeWeight(*quantized, dtype) : dense.to(dtype);
}

bool FrozenWeight::IsDequantizedView(const at::Tensor& out) const {
  return dequantized.defined() && out.data_ptr() == dequantized.data_ptr() &&
         out.sizes() == dequantized.sizes() && out.strides() == dequantized.strides() &&
         out.scalar_type() == dequantized.scalar_type();
}

void FrozenWeight::MaterializeInto(const at::Tensor& out,
                                   const kernels::ColumnsAfter* after) const {
  if (dequantized.defined()) {
    if (!IsDequantizedView(out)) at::Tensor(out).copy_(dequantized);
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
      quantized ? ApplyLinear4bit(x, &*quantized, /*value_unused=*/false, /*gemm=*/nullptr,
                                  &dequantized, float8_forward)
                : at::linear(x, dense.scalar_type() == x.scalar_type() ? dense
                                                                       : dense.to(x.scalar_type()));
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

at::Tensor LinearLayer::Forward(const at::Tensor& x, bool training, bool value_unused) const {
  if (!lora) {
    // The 4-bit node itself where the recomputation skips its GEMM or the tuner runs it.
    if (base.quantized && !base.bias.defined() && (value_unused || gemm != nullptr)) {
      return ApplyLinear4bit(x, &*base.quantized, value_unused, gemm, &base.dequantized,
                             base.float8_forward);
    }
    return base.Apply(x);
  }
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // rows of tokens
  const at::Tensor h =
      AdapterWithoutDropout(*this, training) ? x2 : at::dropout(x2, lora->dropout, training);
  return ToLayerOutput(
      ApplyLoraLinear(x2, h, lora->a, lora->b, &base, lora->scale, value_unused, gemm,
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
      ys = ApplyLoraWideGroup(x2, at::TensorList(a), at::TensorList(b), &layers, value_unused,
                              packed, packed ? rotary : nullptr, normed);
      rotated = packed;
    } else {
      ys = ApplyLoraGroup(x2, at::TensorList(a), at::TensorList(b), &layers, value_unused);
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
    y = ApplySwigluLora(g2, u2, node_residual, down.lora->a, down.lora->b, &down.base,
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
