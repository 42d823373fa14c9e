// The job-long dequantized copies of a decoder layer's 4-bit weights (see dequantized_layers.h).
#include "worker/engine/dequantized_layers.h"

#include <ATen/ATen.h>

#include <vector>

#include "worker/engine/aligned_rows.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {
namespace {

// The groups that share a buffer: the projections that read one input, or run alone.
std::vector<std::vector<LinearLayer*>> Groups(DecoderLayer& layer) {
  return {{&layer.q_proj, &layer.k_proj, &layer.v_proj},
          {&layer.o_proj},
          {&layer.gate_proj, &layer.up_proj},
          {&layer.down_proj}};
}

// A group's buffer shape {rows, row stride}, or {0, 0} where a weight is not 4-bit.
std::pair<int64_t, int64_t> BufferShape(const std::vector<LinearLayer*>& group) {
  int64_t rows = 0, rank_sum = 0;
  for (const LinearLayer* linear : group) {
    if (!linear->base.quantized) return {0, 0};
    rows += linear->base.out_features;
    if (linear->lora) rank_sum += linear->lora->a.size(0);
  }
  return {rows + rank_sum, AlignedRow(group[0]->base.in_features + rank_sum)};
}

}  // namespace

int64_t DequantizedBufferBytes(const DecoderLayer& layer, at::ScalarType dtype) {
  int64_t bytes = 0;
  for (const auto& group : Groups(const_cast<DecoderLayer&>(layer))) {
    const auto [rows, stride] = BufferShape(group);
    bytes += rows * stride * static_cast<int64_t>(c10::elementSize(dtype));
  }
  return bytes;
}

int64_t MovedCodeBytes(const DecoderLayer& layer) {
  int64_t bytes = 0;
  for (const auto& group : Groups(const_cast<DecoderLayer&>(layer))) {
    if (BufferShape(group).first == 0) continue;
    for (const LinearLayer* linear : group) {
      const kernels::Quantized4bit& q = *linear->base.quantized;
      if (!q.absmax.is_cpu()) bytes += static_cast<int64_t>(q.packed.nbytes());
    }
  }
  return bytes;
}

void KeepDequantized(DecoderLayer& layer, at::ScalarType dtype) {
  for (const auto& group : Groups(layer)) {
    const auto [rows, stride] = BufferShape(group);
    if (rows == 0) continue;
    if (group[0]->base.dequantized.defined() && group[0]->base.dequantized.scalar_type() == dtype) {
      continue;
    }
    // On the block scales' device (the codes may be in host memory already).
    const at::Tensor buffer = at::zeros(
        {rows, stride}, group[0]->base.quantized->absmax.options().dtype(dtype));
    int64_t row = 0;
    for (LinearLayer* linear : group) {
      FrozenWeight& w = linear->base;
      w.dequantized = at::Tensor();  // MaterializeInto dequantizes into the view below
      const at::Tensor view = buffer.narrow(0, row, w.out_features).narrow(1, 0, w.in_features);
      w.MaterializeInto(view);
      w.dequantized = view;
      // Nothing on the device reads the codes now: they wait in host memory (the copy is
      // stream-ordered after the dequantization above).
      if (!w.quantized->packed.is_cpu()) w.quantized->packed = w.quantized->packed.cpu();
      row += w.out_features;
    }
  }
}

void WriteDequantizedAdapters(const std::vector<const DecoderLayer*>& layers, bool training,
                       bool widened_down) {
  if (layers.empty() || layers[0]->q_proj.adapter_copies == nullptr ||
      !layers[0]->q_proj.adapter_copies->in_scope()) {
    return;
  }
  std::vector<DequantizedWrites> writes;
  for (const DecoderLayer* layer : layers) {
    for (const auto& mutable_group : Groups(const_cast<DecoderLayer&>(*layer))) {
      const std::vector<const LinearLayer*> group(mutable_group.begin(), mutable_group.end());
      if (group.size() > 1) {  // q/k/v, gate/up: one node's widened forward
        for (DequantizedWrites& w : DequantizedGroupColumns(group, training)) writes.push_back(std::move(w));
      } else if (group[0] == &layer->down_proj && widened_down) {
        writes.push_back(DequantizedWidenedColumns(layer->down_proj, training));
      }
      writes.push_back(DequantizedRowsBelow(group, training));
    }
  }
  WriteDequantized(layers[0]->q_proj.adapter_copies, writes);
}

void DropDequantized(DecoderLayer& layer) {
  for (const auto& group : Groups(layer)) {
    for (LinearLayer* linear : group) {
      FrozenWeight& w = linear->base;
      if (w.quantized) *w.quantized = WithCodesOnDevice(*w.quantized);
      w.dequantized = at::Tensor();
    }
  }
}

}  // namespace qlora::engine
