// FP8 forward of the frozen base (see float8_forward.h).
#include "worker/engine/float8_forward.h"

#include <ATen/ops/empty.h>

namespace qlora::engine {

bool RunsFloat8(const kernels::Quantized4bit& q, bool float8, const at::Tensor& x) {
  return float8 && x.scalar_type() == at::kBFloat16 && kernels::Float8WeightTakes(q) &&
         kernels::Float8GemmTakes(q.shape[1], q.shape[0]);
}

bool RunsFloat8(const FrozenWeight& w, const at::Tensor& x) {
  return w.quantized.has_value() && RunsFloat8(*w.quantized, w.float8_forward, x);
}

at::Tensor Float8Linear(const at::Tensor& x, const kernels::Quantized4bit& q,
                        const at::Tensor& held) {
  const int64_t in = q.shape[1], out = q.shape[0];
  const kernels::Float8Rows w = held.defined()
                                    ? kernels::QuantizeRowsFloat8(held.narrow(1, 0, in))
                                    : kernels::WeightRowsFloat8(WithCodesOnDevice(q));
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = out;
  return kernels::Float8Matmul(kernels::QuantizeRowsFloat8(x.reshape({-1, in})), w,
                               x.scalar_type())
      .view(sizes);
}

kernels::Float8Rows Float8Weights(const std::vector<const FrozenWeight*>& weights,
                                  const at::Tensor& held) {
  TORCH_CHECK(!weights.empty(), "Float8Weights: no weights");
  const int64_t in = weights[0]->in_features;
  if (held.defined()) return kernels::QuantizeRowsFloat8(held.narrow(1, 0, in));
  if (weights.size() == 1) return kernels::WeightRowsFloat8(WithCodesOnDevice(*weights[0]->quantized));
  int64_t total = 0;
  for (const FrozenWeight* w : weights) total += w->out_features;
  const at::TensorOptions options = weights[0]->quantized->absmax.options();
  const kernels::Float8Rows stacked{at::empty({total, in}, options.dtype(at::kFloat8_e4m3fn)),
                                    at::empty({total, 1}, options.dtype(at::kFloat))};
  int64_t row = 0;
  for (const FrozenWeight* w : weights) {
    const kernels::Float8Rows rows{stacked.values.narrow(0, row, w->out_features),
                                   stacked.scales.narrow(0, row, w->out_features)};
    kernels::WeightRowsFloat8(WithCodesOnDevice(*w->quantized), &rows);
    row += w->out_features;
  }
  return stacked;
}

at::Tensor Float8Forward(const at::Tensor& x, const std::vector<const FrozenWeight*>& weights,
                         const at::Tensor& held, const at::Tensor& into) {
  return kernels::Float8Matmul(kernels::QuantizeRowsFloat8(x), Float8Weights(weights, held),
                               x.scalar_type(), into);
}

at::Tensor Float8Forward(const kernels::Float8Rows& x8, at::ScalarType dtype,
                         const std::vector<const FrozenWeight*>& weights, const at::Tensor& held) {
  return kernels::Float8Matmul(x8, Float8Weights(weights, held), dtype);
}

at::Tensor HeldRows(const FrozenWeight& w, at::ScalarType dtype) {
  return w.dequantized.defined() && w.dequantized.scalar_type() == dtype ? w.dequantized
                                                                         : at::Tensor();
}

}  // namespace qlora::engine
