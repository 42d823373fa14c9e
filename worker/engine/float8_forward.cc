// FP8 forward of the frozen base (see float8_forward.h).
#include "worker/engine/float8_forward.h"

#include <vector>

#include <ATen/ops/empty.h>

namespace qlora::engine {

bool RunsFloat8(const kernels::Quantized4bit& q, bool float8, const at::Tensor& x) {
  return float8 && x.scalar_type() == at::kBFloat16 && kernels::Float8WeightTakes(q) &&
         kernels::Float8GemmTakes(q.shape[1], q.shape[0]);
}

bool RunsFloat8(const FrozenWeight& w, const at::Tensor& x) {
  return w.quantized.has_value() && RunsFloat8(*w.quantized, w.float8_forward, x);
}

kernels::Float8Rows Float8WeightRows(const kernels::Quantized4bit& q, const at::Tensor& held) {
  return held.defined() ? kernels::QuantizeRowsFloat8(held.narrow(1, 0, q.shape[1]))
                        : kernels::WeightRowsFloat8(WithCodesOnDevice(q));
}

at::Tensor Float8Linear(const at::Tensor& x, const kernels::Quantized4bit& q,
                        const at::Tensor& held) {
  const int64_t in = q.shape[1];
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = q.shape[0];
  return kernels::Float8Matmul(kernels::QuantizeRowsFloat8(x.reshape({-1, in})),
                               Float8WeightRows(q, held), x.scalar_type())
      .view(sizes);
}

kernels::Float8Rows Float8Weights(const std::vector<const FrozenWeight*>& weights,
                                  const at::Tensor& held) {
  TORCH_CHECK(!weights.empty(), "Float8Weights: no weights");
  if (held.defined() || weights.size() == 1) return Float8WeightRows(*weights[0]->quantized, held);
  const int64_t in = weights[0]->in_features;
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
  return Float8Forward(kernels::QuantizeRowsFloat8(x), x.scalar_type(), weights, held, into);
}

at::Tensor Float8Forward(const kernels::Float8Rows& x8, at::ScalarType dtype,
                         const std::vector<const FrozenWeight*>& weights, const at::Tensor& held,
                         const at::Tensor& into) {
  return kernels::Float8Matmul(x8, Float8Weights(weights, held), dtype, into);
}

at::Tensor HeldRows(const at::Tensor& dequantized, at::ScalarType dtype) {
  return dequantized.defined() && dequantized.scalar_type() == dtype ? dequantized : at::Tensor();
}

}  // namespace qlora::engine
