// LoraGroupFunction: the LoRA layers that read one input (q/k/v, gate/up) as one autograd node,
// and the backward it shares with LoraWideGroupFunction (GroupBackward).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/lora_gradients.h"
#include "kernels/tuned_gemm.h"
#include "worker/engine/activation_offload.h"
#include "worker/engine/adapter_copies.h"
#include "worker/engine/adapter_gradients.h"
#include "worker/engine/linear4bit.h"
#include "worker/engine/linear4bit_internal.h"

namespace qlora::engine::linear4bit_internal {
namespace {

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

}  // namespace

void SaveGroup(AutogradContext* ctx, variable_list leading, at::TensorList a, at::TensorList b,
               const std::vector<int64_t>& ranks, const std::vector<double>& scales) {
  leading.insert(leading.end(), a.begin(), a.end());
  leading.insert(leading.end(), b.begin(), b.end());
  SaveForBackward(ctx, leading);
  ctx->saved_data["ranks"] = ranks;
  ctx->saved_data["scales"] = scales;
}

variable_list GroupBackward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& ha,
                            at::TensorList adapters, const variable_list& grad_outputs,
                            const NormedInput* normed) {
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

namespace {

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

}  // namespace

variable_list ApplyLoraGroup(const at::Tensor& x, at::TensorList a, at::TensorList b,
                             const std::vector<const LinearLayer*>* group, bool value_unused) {
  return LoraGroupFunction::apply(x, a, b, group, value_unused);
}

}  // namespace qlora::engine::linear4bit_internal
