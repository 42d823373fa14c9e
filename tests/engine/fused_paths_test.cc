// The fused paths of the engine checked against the unfused formulas they replace, on CPU and,
// when there is one, on a GPU: RMSNorm through ATen's rms_norm (a fused kernel on CUDA), the
// LoRA layer as one autograd node (with and without dropout), and the rotary and SwiGLU autograd
// nodes (fused_ops.h) against autograd through their formulas, and the graph-only cat.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/linear4bit.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {
namespace {

std::vector<at::Device> Devices() {
  std::vector<at::Device> devices = {at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  return devices;
}

// The HF LlamaRMSNorm formula: normalise in float32, round to the input dtype, then weight.
at::Tensor HfRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return w * h.to(x.scalar_type());
}

// A linear [out, in] with a rank-r adapter (`scale`): a 4-bit base or a dense one in `dtype`;
// drawn in the order W, A, B.
LinearLayer AdaptedLayer(const at::TensorOptions& f32, int64_t out, int64_t in, int64_t r,
                         double scale, bool quantized, at::ScalarType dtype) {
  LinearLayer layer;
  const at::Tensor w = at::randn({out, in}, f32) * 0.1;
  if (quantized) {
    layer.base.quantized = QuantizeWeight(w, kernels::Quantize4bitOptions());
  } else {
    layer.base.dense = w.to(dtype);
  }
  layer.base.out_features = out;
  layer.base.in_features = in;
  LoraWeights lora;
  lora.a = (at::randn({r, in}, f32) * 0.2).requires_grad_();
  lora.b = (at::randn({out, r}, f32) * 0.2).requires_grad_();
  lora.scale = scale;
  layer.lora = lora;
  return layer;
}

TEST(EngineFused, RmsNormEqualsTheHfFormulaInFloat32AndWithinOneUlpInBf16) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(0);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    at::Tensor x = at::randn({3, 37, 256}, f32) * 3;
    at::Tensor w = 1 + 0.1 * at::randn({256}, f32);
    // float32: the same computation (forward and gradients).
    at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
    at::Tensor ours = RmsNorm(xa, w, 1e-5), ref = HfRmsNorm(xb, w, 1e-5);
    EXPECT_LE((ours - ref).abs().max().item<double>(), 1e-6);
    at::Tensor g = at::randn_like(ours);
    const auto ga = torch::autograd::grad({ours}, {xa}, {g});
    const auto gb = torch::autograd::grad({ref}, {xb}, {g});
    EXPECT_LE((ga[0] - gb[0]).abs().max().item<double>(), 1e-5);
    // bf16: one rounding instead of two; never more than one ulp (2^-7 relative) apart.
    at::Tensor xh = x.to(at::kBFloat16), wh = w.to(at::kBFloat16);
    at::Tensor fused = RmsNorm(xh, wh, 1e-5).to(at::kFloat), hf = HfRmsNorm(xh, wh, 1e-5).to(at::kFloat);
    const at::Tensor excess = (fused - hf).abs() - hf.abs() * (1.0 / 128) - 1e-6;
    EXPECT_LE(excess.max().item<double>(), 0.0);
    EXPECT_GT((fused - hf).abs().max().item<double>(), 0.0) << "the comparison must see the rounding difference";
  }
}

TEST(EngineFused, LoraBranchAsOneGemmEqualsTheUnfusedFormula) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(1);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    LinearLayer layer = AdaptedLayer(f32, 48, 32, 4, 2.5, /*quantized=*/false, at::kFloat);
    const LoraWeights& lora = *layer.lora;
    at::Tensor x = at::randn({2, 5, 32}, f32).requires_grad_();
    at::Tensor ours = layer.Forward(x, /*training=*/false);
    at::Tensor ref = at::linear(x, layer.base.dense) + at::linear(at::linear(x, lora.a), lora.b) * lora.scale;
    EXPECT_LE((ours - ref).abs().max().item<double>(), 1e-5);
    at::Tensor g = at::randn_like(ours);
    const auto go = torch::autograd::grad({ours}, {x, lora.a, lora.b}, {g});
    const auto gr = torch::autograd::grad({ref}, {x, lora.a, lora.b}, {g});
    for (size_t i = 0; i < go.size(); ++i) {
      EXPECT_LE((go[i] - gr[i]).abs().max().item<double>(), 1e-5) << "gradient " << i;
    }
    // bf16 compute: the fused GEMM rounds once, the unfused formula three times.
    at::Tensor xh = x.detach().to(at::kBFloat16);
    layer.base.dense = layer.base.dense.to(at::kBFloat16);
    at::Tensor fused = layer.Forward(xh, false).to(at::kFloat);
    at::Tensor unfused = (at::linear(xh, layer.base.dense) +
                          at::linear(at::linear(xh, lora.a.to(at::kBFloat16)), lora.b.to(at::kBFloat16)) * lora.scale)
                             .to(at::kFloat);
    EXPECT_LE((fused - unfused).abs().max().item<double>(), 0.02 * unfused.abs().max().item<double>());
    // bf16, the node and the separate ops the engine ran before it (base linear, linear(x, A),
    // addmm into the base output) against the float32 formula on the same bf16 inputs: the node
    // rounds the base term once (in its GEMM's epilogue) and the rank-r term twice, the ops the
    // other way round; both stay within bf16 rounding of the formula (printed side by side).
    at::Tensor xn = xh.detach().requires_grad_(), xr = xh.detach().requires_grad_();
    at::Tensor xf = xh.detach().to(at::kFloat).requires_grad_();
    const at::Tensor node = layer.Forward(xn, false);
    const at::Tensor x2 = xr.reshape({-1, 32});
    const at::Tensor ops = at::addmm(at::linear(x2, layer.base.dense), at::linear(x2, lora.a.to(at::kBFloat16)),
                                     lora.b.to(at::kBFloat16).t(), 1, lora.scale).view(node.sizes());
    const at::Tensor a32 = lora.a.to(at::kBFloat16).to(at::kFloat), b32 = lora.b.to(at::kBFloat16).to(at::kFloat);
    const at::Tensor exact = at::linear(xf, layer.base.dense.to(at::kFloat)) +
                             at::linear(at::linear(xf, a32), b32) * lora.scale;
    const at::Tensor gh = at::randn_like(ops);
    const auto gn = torch::autograd::grad({node}, {xn, lora.a, lora.b}, {gh});
    const auto gs = torch::autograd::grad({ops}, {xr, lora.a, lora.b}, {gh});
    const auto ge = torch::autograd::grad({exact}, {xf, lora.a, lora.b}, {gh.to(at::kFloat)});
    auto error = [](const at::Tensor& t, const at::Tensor& reference) {
      return (t.to(at::kFloat) - reference).abs().max().item<double>();
    };
    const double ulp = std::ldexp(exact.abs().max().item<double>(), -7);  // bf16 spacing at the max
    EXPECT_LE(error(node, exact), ulp);
    std::cout << device << " bf16 max error against float32: output node " << error(node, exact)
              << ", ops " << error(ops, exact) << " (bf16 spacing " << ulp << ")";
    for (size_t i = 0; i < gn.size(); ++i) {
      const double g_ulp = std::ldexp(ge[i].abs().max().item<double>(), -7);
      EXPECT_LE(error(gn[i], ge[i]), g_ulp) << "gradient " << i;
      std::cout << "; gradient " << i << " node " << error(gn[i], ge[i]) << ", ops " << error(gs[i], ge[i]);
    }
    std::cout << "\n";
  }
}

// Three linears reading one input of 64 features (different widths, ranks and scales, one with
// a 4-bit base and one with a bias: ranks 4 + 8 + 4 = 16 spare columns when widened).
std::vector<LinearLayer> SharedInputLayers(const at::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t in = 64, outs[3] = {64, 32, 96}, ranks[3] = {4, 8, 4};
  const double scales[3] = {2.0, 0.5, 1.25};
  std::vector<LinearLayer> layers;
  for (int i = 0; i < 3; ++i) {
    layers.push_back(AdaptedLayer(f32, outs[i], in, ranks[i], scales[i], false, at::kFloat));
  }
  kernels::Quantize4bitOptions nf4;
  layers[1].base.quantized = QuantizeWeight(layers[1].base.dense, nf4);
  layers[1].base.dense = at::Tensor();
  layers[2].base.bias = at::randn({outs[2]}, f32);
  return layers;
}

// The layers' dense weights and biases in `dtype` (the 4-bit base stays as it is).
void CastFrozen(std::vector<LinearLayer>& layers, at::ScalarType dtype) {
  for (LinearLayer& l : layers) {
    if (l.base.dense.defined()) l.base.dense = l.base.dense.to(dtype);
    if (l.base.bias.defined()) l.base.bias = l.base.bias.to(dtype);
  }
}

// The gradients of `inputs` from `outs` equal those of `ref_inputs` from `ref_outs` (the same
// seeds) within summation-order differences (float32) or two bf16 ulps; an input the reference
// gives no gradient gets none or zeros.
void ExpectSameGradients(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& ref_outs,
                         const std::vector<at::Tensor>& ref_inputs,
                         const std::vector<at::Tensor>& seeds, at::ScalarType dtype) {
  const auto got = torch::autograd::grad(outs, inputs, seeds, true, false, true);
  const auto want = torch::autograd::grad(ref_outs, ref_inputs, seeds, true, false, true);
  for (size_t j = 0; j < got.size(); ++j) {
    if (!want[j].defined()) {
      EXPECT_TRUE(!got[j].defined() || got[j].abs().max().item<double>() == 0) << "input " << j;
      continue;
    }
    ASSERT_TRUE(got[j].defined()) << "input " << j;
    const double scale = want[j].abs().max().item<double>();
    const double bound = dtype == at::kFloat ? 1e-5 * scale + 1e-7 : std::ldexp(scale, -6);
    EXPECT_LE((got[j] - want[j]).abs().max().item<double>(), bound) << "input " << j;
  }
}

// What ExpectSameGradients compares for SharedInputLayers run as one node (`grouped`) and one by
// one (`single`), once each output is checked against its twin (float32: summation order; bf16:
// one ulp at the max): every A and B, then the outputs with a seed each, but the one at
// `without_gradient` (-1: none).
struct GroupGradients {
  std::vector<at::Tensor> adapters, outs, ref_outs, seeds;
};

GroupGradients CompareGroupOutputs(const std::vector<at::Tensor>& grouped,
                                   const std::vector<at::Tensor>& single,
                                   const std::vector<LinearLayer>& layers, at::ScalarType dtype,
                                   int without_gradient) {
  GroupGradients c;
  for (int i = 0; i < static_cast<int>(single.size()); ++i) {
    const double scale = single[i].abs().max().item<double>();
    const double bound = dtype == at::kFloat ? 1e-5 * scale : std::ldexp(scale, -7);
    EXPECT_LE((grouped[i] - single[i]).abs().max().item<double>(), bound) << "output " << i;
    c.adapters.push_back(layers[i].lora->a);
    c.adapters.push_back(layers[i].lora->b);
    if (i == without_gradient) continue;
    c.outs.push_back(grouped[i]);
    c.ref_outs.push_back(single[i]);
    c.seeds.push_back(at::randn_like(single[i]));
  }
  return c;
}

// `leading`, then `more`.
std::vector<at::Tensor> Joined(std::vector<at::Tensor> leading, const std::vector<at::Tensor>& more) {
  leading.insert(leading.end(), more.begin(), more.end());
  return leading;
}

// SharedInputLayers as one node against each layer's own Forward: values and gradients of x, the
// As and the Bs, also when one output gets no gradient, in float32 and in bf16.
TEST(EngineFused, SharedInputLoraGroupEqualsTheLayersOneByOne) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(3);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const int64_t in = 64;
    std::vector<LinearLayer> layers = SharedInputLayers(device);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      CastFrozen(layers, dtype);
      const at::Tensor x0 = at::randn({2, 9, in}, f32).to(dtype);
      for (const bool all_outputs : {true, false}) {
        at::Tensor xg = x0.clone().requires_grad_(), xs = x0.clone().requires_grad_();
        const std::vector<at::Tensor> grouped =
            SharedInputForward({&layers[0], &layers[1], &layers[2]}, xg, /*training=*/true);
        std::vector<at::Tensor> single;
        for (const LinearLayer& l : layers) single.push_back(l.Forward(xs, /*training=*/true));
        // Without all outputs, k gets no gradient.
        const GroupGradients c =
            CompareGroupOutputs(grouped, single, layers, dtype, all_outputs ? -1 : 1);
        ExpectSameGradients(c.outs, Joined({xg}, c.adapters), c.ref_outs, Joined({xs}, c.adapters),
                            c.seeds, dtype);
      }
    }
  }
}

// The same layers over widened rows, as the decoder runs them: the input is the residual norm's
// output with SharedInputSpareColumns spare columns, so that the node writes x A^T there and
// runs each layer's forward as one GEMM over [x | x A^T] and [W | 0 | scale B]. Against the
// layers one by one on the plain norm's output: the values and the gradients of the norm's
// inputs (x and delta), the As and the Bs, with one output without a gradient, in float32 and in
// bf16; and the spare columns hold x A^T (the widened node ran, not the plain one).
TEST(EngineFused, SharedInputLoraGroupOverWidenedRowsEqualsTheLayersOneByOne) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(13);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const int64_t in = 64;
    std::vector<LinearLayer> layers = SharedInputLayers(device);
    const std::vector<const LinearLayer*> group = {&layers[0], &layers[1], &layers[2]};
    const int64_t spare = SharedInputSpareColumns(group, /*training=*/true);
    ASSERT_EQ(spare, 64);  // ranks 4 + 8 + 4, rows of 64 + 16 padded to 128 values
    EXPECT_EQ(SharedInputSpareColumns({&layers[0]}, true), 0);  // a single layer: no node
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      CastFrozen(layers, dtype);
      const at::Tensor w = (1 + 0.1 * at::randn({in}, f32)).to(dtype);
      const at::Tensor x0 = at::randn({2, 9, in}, f32).to(dtype);
      const at::Tensor d0 = at::randn({2, 9, in}, f32).to(dtype);
      at::Tensor xw = x0.clone().requires_grad_(), dw = d0.clone().requires_grad_();
      at::Tensor xs = x0.clone().requires_grad_(), ds = d0.clone().requires_grad_();
      const auto [hw, nw, rstd_nw] = ResidualRmsNorm(xw, dw, w, 1e-5, spare);
      const auto [hs, ns, rstd_ns] = ResidualRmsNorm(xs, ds, w, 1e-5);
      ASSERT_EQ(nw.stride(1), in + spare);
      const std::vector<at::Tensor> widened = SharedInputForward(group, nw, /*training=*/true);
      std::vector<at::Tensor> single;
      for (const LinearLayer& l : layers) single.push_back(l.Forward(ns, /*training=*/true));

      const at::Tensor rows = nw.detach().as_strided({18, in + spare}, {in + spare, 1});
      const at::Tensor a_all = at::cat({layers[0].lora->a, layers[1].lora->a, layers[2].lora->a})
                                   .detach().to(dtype);
      const at::Tensor ha = at::mm(rows.narrow(1, 0, in), a_all.t());
      EXPECT_LE((rows.narrow(1, in, ha.size(1)) - ha).abs().max().item<double>(),
                (dtype == at::kFloat ? 1e-5 : 1e-2) * ha.abs().max().item<double>());

      GroupGradients c = CompareGroupOutputs(widened, single, layers, dtype, 1);  // k: none
      c.outs.push_back(hw);  // the residual stream goes on
      c.ref_outs.push_back(hs);
      c.seeds.push_back(at::randn_like(hs));
      ExpectSameGradients(c.outs, Joined({xw, dw}, c.adapters), c.ref_outs,
                          Joined({xs, ds}, c.adapters), c.seeds, dtype);
    }
  }
}

// q/k/v as the decoder runs them on CUDA with multi-head attention (SharedInputForward with a
// rotary): three equally wide layers without biases (one 4-bit) over widened rows run as one
// GEMM whose outputs are the packed rows [T, 3 out], q's and k's columns rotated in place.
// Against the layers one by one, then the rotary node on q and k: the values, the gradients of
// the norm's inputs, the As and the Bs (k without a gradient of its own once), in float32 and
// bf16; and the outputs are views of one packed buffer.
TEST(EngineFused, PackedQkvWithRotaryEqualsTheLayersOneByOneThenRotary) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(19);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const int64_t in = 64, out = 64, batch = 2, seq = 9, head_dim = 16;
    std::vector<LinearLayer> layers = SharedInputLayers(device);
    for (int i = 0; i < 3; ++i) {  // q, k, v: 64 wide, no bias (ranks 4, 8, 4 as before)
      LinearLayer& l = layers[i];
      const at::Tensor w = at::randn({out, in}, f32) * 0.1;
      l.base = FrozenWeight();
      l.base.out_features = out;
      l.base.in_features = in;
      if (i == 1) {
        l.base.quantized = QuantizeWeight(w, kernels::Quantize4bitOptions());
      } else {
        l.base.dense = w;
      }
      l.lora->b = (at::randn({out, l.lora->a.size(0)}, f32) * 0.2).requires_grad_();
    }
    const std::vector<const LinearLayer*> group = {&layers[0], &layers[1], &layers[2]};
    const int64_t spare = SharedInputSpareColumns(group, /*training=*/true);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      CastFrozen(layers, dtype);
      const at::Tensor angle = at::rand({batch, 1, seq, head_dim}, f32) * 20;
      SharedInputRotary rotary{angle.cos().to(dtype), angle.sin().to(dtype), batch, seq, head_dim};
      const at::Tensor w = (1 + 0.1 * at::randn({in}, f32)).to(dtype);
      const at::Tensor x0 = at::randn({batch, seq, in}, f32).to(dtype);
      const at::Tensor d0 = at::randn({batch, seq, in}, f32).to(dtype);
      // The same inputs with and without q/k/v's gradients packed for one input-gradient GEMM.
      for (const bool packed_gradients : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "packed gradients " << packed_gradients);
        rotary.packed_gradients = packed_gradients;
        at::Tensor xp = x0.clone().requires_grad_(), dp = d0.clone().requires_grad_();
        at::Tensor xs = x0.clone().requires_grad_(), ds = d0.clone().requires_grad_();
        const auto [hp, np, rstd_np] = ResidualRmsNorm(xp, dp, w, 1e-5, spare);
        const auto [hs, ns, rstd_ns] = ResidualRmsNorm(xs, ds, w, 1e-5);
        const std::vector<at::Tensor> packed =
            SharedInputForward(group, np, /*training=*/true, /*value_unused=*/false, &rotary);
        std::vector<at::Tensor> single;
        for (const LinearLayer& l : layers) single.push_back(l.Forward(ns, /*training=*/true));
        for (int i = 0; i < 2; ++i) {
          single[i] = Rotary(single[i].view({batch, seq, out / head_dim, head_dim}).transpose(1, 2),
                             rotary.cos, rotary.sin)
                          .transpose(1, 2)
                          .reshape({batch, seq, out});
        }
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(packed[i].stride(1), 3 * out) << "output " << i;
          EXPECT_EQ(packed[i].data_ptr(),
                    static_cast<void*>(static_cast<char*>(packed[0].data_ptr()) +
                                       i * out * packed[0].element_size()))
              << "output " << i;
        }
        for (const int without_gradient : {-1, 1}) {
          GroupGradients c = CompareGroupOutputs(packed, single, layers, dtype, without_gradient);
          c.outs.push_back(hp);  // the residual stream goes on
          c.ref_outs.push_back(hs);
          c.seeds.push_back(at::randn_like(hs));
          ExpectSameGradients(c.outs, Joined({xp, dp}, c.adapters), c.ref_outs,
                              Joined({xs, ds}, c.adapters), c.seeds, dtype);
        }
      }
    }
  }
}

// Where the norm's source comes with its output (NormedInput, as the decoder passes the fused
// norms'), the widened node keeps the source and rstd instead of the output's rows: the same
// outputs to the bit, the same gradients of the norm's inputs and of the adapters (the norm's
// factors move outside the As' GEMM: summation order in float32, rounding in bf16), and the
// output's rows are freed once the caller lets them go (the node without the source keeps them).
// Over SharedInputLayers (one GEMM each) and over three equally wide layers (packed, as gate/up
// run), with the residual add (the post-attention norm) and without (the input norm).
TEST(EngineFused, WidenedNodeKeepingTheNormsSourceEqualsTheNodeKeepingItsOutput) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(23);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const int64_t in = 64;
    for (const bool packed : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "packed " << packed);
      std::vector<LinearLayer> layers = SharedInputLayers(device);
      if (packed) {
        for (LinearLayer& l : layers) {
          l.base.bias = at::Tensor();
          if (l.base.out_features == in) continue;
          l.base = FrozenWeight();
          l.base.dense = at::randn({in, in}, f32) * 0.1;
          l.base.out_features = in;
          l.base.in_features = in;
          l.lora->b = (at::randn({in, l.lora->a.size(0)}, f32) * 0.2).requires_grad_();
        }
      }
      const std::vector<const LinearLayer*> group = {&layers[0], &layers[1], &layers[2]};
      const int64_t spare = SharedInputSpareColumns(group, /*training=*/true);
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        for (const bool with_delta : {true, false}) {
          SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << " delta " << with_delta);
          CastFrozen(layers, dtype);
          const at::Tensor w = (1 + 0.1 * at::randn({in}, f32)).to(dtype);
          const at::Tensor x0 = at::randn({2, 9, in}, f32).to(dtype);
          const at::Tensor d0 = at::randn({2, 9, in}, f32).to(dtype);
          at::Tensor xk = x0.clone().requires_grad_(), xs = x0.clone().requires_grad_();
          at::Tensor dk = d0.clone().requires_grad_(), ds = d0.clone().requires_grad_();
          NormedResidual kept =
              ResidualRmsNorm(xk, with_delta ? dk : at::Tensor(), w, 1e-5, spare);
          NormedResidual sourced =
              ResidualRmsNorm(xs, with_delta ? ds : at::Tensor(), w, 1e-5, spare);
          ASSERT_EQ(sourced.n.stride(1), in + spare);
          const NormedInput normed{sourced.h, sourced.rstd, w};
          const std::vector<at::Tensor> ys =
              SharedInputForward(group, sourced.n, /*training=*/true, false, nullptr, &normed);
          const std::vector<at::Tensor> yk = SharedInputForward(group, kept.n, /*training=*/true);
          const c10::weak_intrusive_ptr<c10::StorageImpl> kept_rows =
              kept.n.storage().getWeakStorageImpl();
          const c10::weak_intrusive_ptr<c10::StorageImpl> sourced_rows =
              sourced.n.storage().getWeakStorageImpl();
          kept.n.reset();
          sourced.n.reset();
          EXPECT_FALSE(kept_rows.expired());
          EXPECT_TRUE(sourced_rows.expired());
          std::vector<at::Tensor> adapters, outs = {sourced.h}, ref_outs = {kept.h};
          std::vector<at::Tensor> seeds = {at::randn_like(kept.h)};
          for (size_t i = 0; i < layers.size(); ++i) {
            EXPECT_TRUE(at::equal(ys[i], yk[i])) << "output " << i;
            adapters.push_back(layers[i].lora->a);
            adapters.push_back(layers[i].lora->b);
            outs.push_back(ys[i]);
            ref_outs.push_back(yk[i]);
            seeds.push_back(at::randn_like(yk[i]));
          }
          const std::vector<at::Tensor> inputs =
              with_delta ? Joined({xs, ds}, adapters) : Joined({xs}, adapters);
          const std::vector<at::Tensor> ref_inputs =
              with_delta ? Joined({xk, dk}, adapters) : Joined({xk}, adapters);
          ExpectSameGradients(outs, inputs, ref_outs, ref_inputs, seeds, dtype);
        }
      }
    }
  }
}

// Where the input is frozen (the first decoder layer's norm of the embeddings), the nodes skip
// its gradient (its base GEMMs and dequantizations) and the adapters' gradients stay what they
// are with a trained input, to the bit: the q/k/v group over plain and over widened rows, and one
// layer with and without dropout.
TEST(EngineFused, FrozenInputLeavesTheAdaptersGradientsAsTheyAre) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(17);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const int64_t in = 64;
    std::vector<LinearLayer> layers = SharedInputLayers(device);
    const std::vector<const LinearLayer*> group = {&layers[0], &layers[1], &layers[2]};
    const int64_t spare = SharedInputSpareColumns(group, /*training=*/true);
    const at::Tensor w = 1 + 0.1 * at::randn({in}, f32);
    const at::Tensor x0 = at::randn({2, 9, in}, f32);
    std::vector<at::Tensor> adapters;
    for (const LinearLayer& l : layers) {
      adapters.push_back(l.lora->a);
      adapters.push_back(l.lora->b);
    }
    // The adapters' gradients from `outs`, with the same seeds for both runs.
    auto adapter_gradients = [&](const std::vector<at::Tensor>& outs) {
      at::manual_seed(5);
      std::vector<at::Tensor> seeds;
      for (const at::Tensor& o : outs) seeds.push_back(at::randn_like(o));
      return torch::autograd::grad(outs, adapters, seeds, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    };
    for (const bool widened : {false, true}) {
      SCOPED_TRACE(widened ? "widened rows" : "plain rows");
      std::vector<std::vector<at::Tensor>> runs;
      for (const bool trained : {true, false}) {
        at::Tensor x = x0.clone().requires_grad_(trained);
        const at::Tensor n = ResidualRmsNorm(x, at::Tensor(), w, 1e-5, widened ? spare : 0).n;
        ASSERT_EQ(n.requires_grad(), trained);
        ASSERT_EQ(n.stride(1), widened ? in + spare : in);
        runs.push_back(adapter_gradients(SharedInputForward(group, n, /*training=*/true)));
      }
      for (size_t j = 0; j < adapters.size(); ++j) {
        ASSERT_TRUE(runs[1][j].defined()) << "adapter tensor " << j;
        EXPECT_TRUE(at::equal(runs[0][j], runs[1][j])) << "adapter tensor " << j;
      }
    }
    for (const double dropout : {0.0, 0.25}) {
      SCOPED_TRACE("one layer, dropout " + std::to_string(dropout));
      LinearLayer& layer = layers[1];  // the 4-bit base
      layer.lora->dropout = dropout;
      std::vector<std::vector<at::Tensor>> runs;
      for (const bool trained : {true, false}) {
        at::manual_seed(8);  // the same dropout mask
        runs.push_back(
            adapter_gradients({layer.Forward(x0.clone().requires_grad_(trained), true)}));
      }
      for (const size_t j : {size_t{2}, size_t{3}}) {  // layer 1's A and B
        ASSERT_TRUE(runs[1][j].defined()) << "adapter tensor " << j;
        EXPECT_TRUE(at::equal(runs[0][j], runs[1][j])) << "adapter tensor " << j;
      }
    }
  }
}

// A down projection [48, 96] with a rank-8 adapter (scale 1.5): a 4-bit base or a dense one in
// `dtype`.
LinearLayer DownLayer(const at::TensorOptions& f32, bool quantized, at::ScalarType dtype) {
  return AdaptedLayer(f32, 48, 96, 8, 1.5, quantized, dtype);
}

// The down projection over silu(gate) * up as one node that recomputes the product in backward,
// against Swiglu then the LoRA layer (4-bit base and dense, with a bias): values and the
// gradients of gate, up, A and B, bit for bit in float32 and bf16.
TEST(EngineFused, SwigluThenDownNodeEqualsSwigluThenTheLayer) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(4);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    for (const bool quantized : {false, true}) {
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + (quantized ? " nf4" : " dense"));
        LinearLayer down = DownLayer(f32, quantized, dtype);
        down.base.bias = at::randn({48}, f32).to(dtype);
        const LoraWeights& lora = *down.lora;
        const at::Tensor gate0 = at::randn({2, 7, 96}, f32).to(dtype), up0 = at::randn({2, 7, 96}, f32).to(dtype);
        // value_unused: a checkpointed layer's recomputation (the node keeps SwiGLU's output and
        // writes the input gradient over it; the output carries only the graph).
        // overwrite_inputs: gate and up are intermediates the node may overwrite with their
        // gradients (the decoder layer's case), here copies made inside the graph.
        // lean_backward: the plain node recomputes the product before the input gradient
        // instead of taking it from SwiGLU's backward.
        for (const bool value_unused : {false, true}) {
         for (const bool overwrite : {false, true}) {
         for (const bool lean : {false, true}) {
          SCOPED_TRACE(std::string(value_unused ? "recomputation" : "plain") +
                       (overwrite ? ", overwriting its inputs" : "") + (lean ? ", lean" : ""));
          at::Tensor gf = gate0.clone().requires_grad_(), uf = up0.clone().requires_grad_();
          at::Tensor gs = gate0.clone().requires_grad_(), us = up0.clone().requires_grad_();
          SwigluThenOptions options;
          options.value_unused = value_unused;
          options.overwrite_inputs = overwrite;
          options.lean_backward = lean;
          const at::Tensor fused = overwrite ? SwigluThenForward(down, gf.clone(), uf.clone(), options)
                                             : SwigluThenForward(down, gf, uf, options);
          const at::Tensor separate = down.Forward(Swiglu(gs, us), /*training=*/true);
          // The same kernels on the same inputs in the same order: equal to the bit.
          if (!value_unused) EXPECT_TRUE(at::equal(fused, separate));
          EXPECT_EQ(fused.sizes(), separate.sizes());
          const at::Tensor seed = at::randn_like(separate);
          const auto a = torch::autograd::grad({fused}, {gf, uf, lora.a, lora.b}, {seed});
          const auto b = torch::autograd::grad({separate}, {gs, us, lora.a, lora.b}, {seed});
          for (size_t i = 0; i < a.size(); ++i) {
            EXPECT_GT(b[i].abs().max().item<double>(), 0) << "gradient " << i;
            EXPECT_TRUE(at::equal(a[i], b[i])) << "gradient " << i;
          }
          EXPECT_TRUE(at::equal(uf, up0));  // the caller's own tensors are never written
         }
         }
        }
      }
    }
  }
}

// The residual stream added inside the node (the decoder's h + down as the adapter GEMM's C):
// against the stream plus Swiglu then the layer, the values within the summation order's
// rounding, the same bits with and without grad (a checkpointed layer's first forward), the
// gradients of gate, up, A and B unchanged (to the bit where the rows are not widened) and the
// stream's own gradient the output's; a recomputation (value_unused) gives a plain node's
// gradients to the bit. Over widened rows (the decoder's CUDA path: SwiGLU into rows with spare
// columns, one GEMM for the projection, its adapter and the residual) the same, the values and
// gradients within rounding of the layer's.
TEST(EngineFused, SwigluThenDownAddsTheResidualStreamInsideTheNode) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(21);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      const LinearLayer down = DownLayer(f32, /*quantized=*/true, dtype);
      const LoraWeights& lora = *down.lora;
      const at::Tensor gate0 = at::randn({2, 7, 96}, f32).to(dtype), up0 = at::randn({2, 7, 96}, f32).to(dtype);
      const at::Tensor h0 = (at::randn({2, 7, 48}, f32) * 4).to(dtype);
      const at::Tensor seed = at::randn({2, 7, 48}, f32).to(dtype);
      at::Tensor gs = gate0.clone().requires_grad_(), us = up0.clone().requires_grad_();
      at::Tensor hs = h0.clone().requires_grad_();
      const at::Tensor separate = hs + down.Forward(Swiglu(gs, us), /*training=*/true);
      const auto want = torch::autograd::grad({separate}, {gs, us, lora.a, lora.b, hs}, {seed});
      {  // a layer without an adapter takes no node: the stream is added after it
        LinearLayer frozen = down;
        frozen.lora.reset();
        EXPECT_TRUE(at::equal(SwigluThenForward(frozen, gate0, up0, SwigluThenOptions(), h0),
                              h0 + frozen.Forward(Swiglu(gate0, up0), /*training=*/true)));
      }
      for (const bool widened : {false, true}) {
        SCOPED_TRACE(widened ? "widened rows" : "plain rows");
        std::vector<at::Tensor> plain_gradients;
        for (const bool value_unused : {false, true}) {
          SCOPED_TRACE(value_unused ? "recomputation" : "plain");
          SwigluThenOptions options;
          options.value_unused = value_unused;
          options.widened_rows = widened;
          at::Tensor gf = gate0.clone().requires_grad_(), uf = up0.clone().requires_grad_();
          at::Tensor hf = h0.clone().requires_grad_();
          const at::Tensor fused = SwigluThenForward(down, gf, uf, options, hf);
          if (!value_unused) {
            const double scale = separate.abs().max().item<double>();
            const double bound = dtype == at::kFloat ? 1e-5 * scale : std::ldexp(scale, -7);
            EXPECT_LE((fused - separate).abs().max().item<double>(), bound);
            at::NoGradGuard no_grad;
            EXPECT_TRUE(at::equal(SwigluThenForward(down, gate0.clone(), up0.clone(), options, h0), fused));
          }
          const auto got = torch::autograd::grad({fused}, {gf, uf, lora.a, lora.b, hf}, {seed});
          for (size_t i = 0; i < got.size(); ++i) {
            if (widened) {
              const double scale = want[i].abs().max().item<double>();
              const double bound = dtype == at::kFloat ? 1e-5 * scale : std::ldexp(scale, -6);
              EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), bound) << "gradient " << i;
            } else {
              EXPECT_TRUE(at::equal(got[i], want[i])) << "gradient " << i;
            }
            if (value_unused) {
              EXPECT_TRUE(at::equal(got[i], plain_gradients[i])) << "recomputed gradient " << i;
            } else {
              plain_gradients.push_back(got[i]);
            }
          }
          EXPECT_TRUE(at::equal(got[4], seed));
        }
      }
    }
  }
}

// rows [T, width] (in `like`'s shape) whose rows are followed by `spare` zeroed columns: a
// gradient as the decoder's norms leave it for the LoRA nodes (ResidualRmsNorm's
// grad_spare_columns).
at::Tensor WithZeroedSpareColumns(const at::Tensor& like, int64_t spare) {
  const int64_t width = like.size(-1);
  const at::Tensor rows = at::zeros({like.numel() / width, width + spare}, like.options());
  rows.narrow(1, 0, width).copy_(like.reshape({-1, width}));
  return rows.narrow(1, 0, width).view(like.sizes());
}

// dh' = scale (g B) [T, r] in float32, for the gradient g [..., out].
at::Tensor LowRankGradient(const at::Tensor& g, const LoraWeights& lora) {
  return at::mm(g.reshape({-1, g.size(-1)}).to(at::kFloat), lora.b.detach().to(at::kFloat)) *
         lora.scale;
}

// The r columns after the rows of t [..., width] (rows with spare columns).
at::Tensor SpareColumnsOf(const at::Tensor& t, int64_t r) {
  const int64_t width = t.size(-1);
  const at::Tensor rows = t.reshape({-1, width});
  return rows.as_strided({rows.size(0), r}, {rows.stride(0), 1}, rows.storage_offset() + width);
}

// A LoRA layer that owns its output gradient's spare columns (o_proj, and down after SwiGLU, as
// the decoder runs them) writes dh' there and takes its input gradient as one GEMM over [g | dh']
// and [W; A]: the same gradients as with a gradient without spare columns (the rank-r GEMM, then
// the base GEMM adding to it), within rounding, and dh' in the spare columns afterwards.
TEST(EngineFused, OutputGradientSpareColumnsTakeTheLowRankTermIntoTheInputGradientGemm) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(29);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      auto expect_close = [&](const at::Tensor& got, const at::Tensor& want, const char* what) {
        const double scale = want.abs().max().item<double>();
        const double bound = dtype == at::kFloat ? 1e-5 * scale : std::ldexp(scale, -6);
        EXPECT_LE((got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>(), bound)
            << what;
      };
      {  // o_proj: LinearLayer::Forward
        LinearLayer o = AdaptedLayer(f32, 48, 64, 8, 1.5, /*quantized=*/true, dtype);
        o.owns_output_gradient_spare_columns = true;
        const int64_t spare = OutputGradientSpareColumns(o, /*training=*/true);
        ASSERT_GE(spare, 8);
        const at::Tensor x0 = at::randn({2, 7, 64}, f32).to(dtype);
        const at::Tensor seed = at::randn({2, 7, 48}, f32).to(dtype);
        std::vector<std::vector<at::Tensor>> grads;
        const at::Tensor wide_seed = WithZeroedSpareColumns(seed, spare);
        for (const at::Tensor& g : {seed, wide_seed}) {
          at::Tensor x = x0.clone().requires_grad_();
          const at::Tensor y = o.Forward(x, /*training=*/true);
          grads.push_back(torch::autograd::grad({y}, {x, o.lora->a, o.lora->b}, {g}));
        }
        for (size_t i = 0; i < grads[0].size(); ++i) expect_close(grads[1][i], grads[0][i], "o");
        expect_close(SpareColumnsOf(wide_seed, 8), LowRankGradient(seed, *o.lora), "o's dh'");
      }
      {  // down after SwiGLU, with the residual: SwigluThenForward, plain rows and widened
        const LinearLayer down = DownLayer(f32, /*quantized=*/true, dtype);
        const int64_t r = down.lora->a.size(0);
        const int64_t spare = OutputGradientSpareColumns(down, /*training=*/true);
        const at::Tensor gate0 = at::randn({2, 7, 96}, f32).to(dtype);
        const at::Tensor up0 = at::randn({2, 7, 96}, f32).to(dtype);
        const at::Tensor h0 = at::randn({2, 7, 48}, f32).to(dtype);
        const at::Tensor seed = at::randn({2, 7, 48}, f32).to(dtype);
        for (const bool widened : {false, true}) {
          for (const int mode : {0, 1, 2}) {  // plain, lean, recomputation
            SCOPED_TRACE(::testing::Message() << "down, widened " << widened << ", mode " << mode);
            SwigluThenOptions options;
            options.widened_rows = widened;
            options.lean_backward = mode == 1;
            options.value_unused = mode == 2;
            std::vector<std::vector<at::Tensor>> grads;
            const at::Tensor wide_seed = WithZeroedSpareColumns(seed, spare);
            for (const at::Tensor& g : {seed, wide_seed}) {
              options.owns_output_gradient_spare_columns = g.is_same(wide_seed);
              at::Tensor gate = gate0.clone().requires_grad_(), up = up0.clone().requires_grad_();
              at::Tensor h = h0.clone().requires_grad_();
              const at::Tensor y = SwigluThenForward(down, gate, up, options, h);
              grads.push_back(torch::autograd::grad(
                  {y}, {gate, up, h, down.lora->a, down.lora->b}, {g}));
            }
            for (size_t i = 0; i < grads[0].size(); ++i) {
              expect_close(grads[1][i], grads[0][i], "down");
            }
            expect_close(SpareColumnsOf(wide_seed, r), LowRankGradient(seed, *down.lora),
                         "down's dh'");
          }
        }
      }
    }
  }
}

// gate/up as the decoder runs them (SharedInputForward over widened rows: two equally wide layers
// without biases, one 4-bit) run packed: one GEMM writes [T, 2 I], gate and up are views of it,
// SwiGLU reads them there and its backward writes their gradients over them, which the gate/up
// node then takes as one packed gradient (one GEMM over the stacked weights). The whole MLP
// (norm, gate/up, SwiGLU, down with its residual) against the layers one by one: values within
// rounding, the gradients of the norm's inputs and of every A and B within rounding, for a plain
// layer, a lean one and a recomputation (whose gradients equal the plain layer's to the bit), in
// float32 and bf16, over plain and widened down rows; and the packed buffer holds the gate/up
// gradients afterwards (the packed backward ran).
TEST(EngineFused, PackedGateUpThroughSwigluAndDownEqualsTheLayersOneByOne) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    at::manual_seed(23);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const int64_t in = 48, inter = 96;
    std::vector<LinearLayer> layers;  // gate (dense, rank 4) and up (4-bit, rank 8)
    for (int i = 0; i < 2; ++i) {
      layers.push_back(AdaptedLayer(f32, inter, in, 4 * (i + 1), 0.75 + i, i == 1, at::kFloat));
    }
    const std::vector<const LinearLayer*> group = {&layers[0], &layers[1]};
    const int64_t spare = SharedInputSpareColumns(group, /*training=*/true);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      CastFrozen(layers, dtype);
      const LinearLayer down = DownLayer(f32, /*quantized=*/true, dtype);
      const std::vector<at::Tensor> adapters = {layers[0].lora->a, layers[0].lora->b,
                                                layers[1].lora->a, layers[1].lora->b,
                                                down.lora->a,      down.lora->b};
      const at::Tensor w = (1 + 0.1 * at::randn({in}, f32)).to(dtype);
      const at::Tensor x0 = at::randn({2, 7, in}, f32).to(dtype);
      const at::Tensor d0 = at::randn({2, 7, in}, f32).to(dtype);
      const at::Tensor seed = at::randn({2, 7, in}, f32).to(dtype);
      at::Tensor xs = x0.clone().requires_grad_(), ds = d0.clone().requires_grad_();
      const auto [hs, ns, rstd_ns] = ResidualRmsNorm(xs, ds, w, 1e-5);
      const at::Tensor gate_s = layers[0].Forward(ns, true), up_s = layers[1].Forward(ns, true);
      const at::Tensor separate = hs + down.Forward(Swiglu(gate_s, up_s), true);
      const std::vector<at::Tensor> inputs_s = Joined({xs, ds}, adapters);
      const auto want = torch::autograd::grad({separate}, Joined(inputs_s, {gate_s, up_s}), {seed});
      const at::Tensor gate_up_want = at::cat({want[8], want[9]}, -1).view({-1, 2 * inter});
      for (const bool widened : {false, true}) {
        std::vector<at::Tensor> plain_gradients;
        for (const int mode : {0, 1, 2}) {  // plain, lean, recomputation
          SCOPED_TRACE(::testing::Message() << (widened ? "widened down rows" : "plain down rows")
                                            << ", mode " << mode);
          at::Tensor xp = x0.clone().requires_grad_(), dp = d0.clone().requires_grad_();
          const auto [hp, np, rstd_np] = ResidualRmsNorm(xp, dp, w, 1e-5, spare);
          std::vector<at::Tensor> gate_up = SharedInputForward(group, np, /*training=*/true);
          ASSERT_EQ(gate_up[0].stride(-1), 1);
          // Packed rows, with spare columns after them for the low-rank input gradient.
          const int64_t row_stride = gate_up[0].stride(-2);
          EXPECT_GE(row_stride, 2 * inter + 4 + 8) << "packed rows";
          EXPECT_EQ(gate_up[1].data_ptr(),
                    static_cast<void*>(static_cast<char*>(gate_up[0].data_ptr()) +
                                       inter * gate_up[0].element_size()));
          const at::Tensor packed = gate_up[0].reshape({-1, inter}).detach();
          SwigluThenOptions options;
          options.overwrite_inputs = true;
          options.widened_rows = widened;
          options.lean_backward = mode == 1;
          options.value_unused = mode == 2;
          const at::Tensor fused = SwigluThenForward(down, std::exchange(gate_up[0], {}),
                                                     std::exchange(gate_up[1], {}), options, hp);
          if (mode != 2) {
            const double scale = separate.abs().max().item<double>();
            const double bound = dtype == at::kFloat ? 1e-5 * scale : std::ldexp(scale, -7);
            EXPECT_LE((fused - separate).abs().max().item<double>(), bound);
          }
          const auto got = torch::autograd::grad({fused}, Joined({xp, dp}, adapters), {seed});
          for (size_t i = 0; i < got.size(); ++i) {
            const double scale = want[i].abs().max().item<double>();
            const double bound = dtype == at::kFloat ? 1e-5 * scale : std::ldexp(scale, -6);
            EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), bound) << "gradient " << i;
            if (mode == 2) {
              EXPECT_TRUE(at::equal(got[i], plain_gradients[i])) << "recomputed gradient " << i;
            } else if (mode == 0) {
              plain_gradients.push_back(got[i]);
            }
          }
          // The packed rows [T, 2 I] now hold gate's and up's gradients.
          const at::Tensor rows = at::empty({0}, packed.options())
                                      .set_(packed.storage(), packed.storage_offset(),
                                            {packed.size(0), 2 * inter}, {row_stride, 1});
          const double scale = gate_up_want.abs().max().item<double>();
          const double bound = dtype == at::kFloat ? 1e-5 * scale : std::ldexp(scale, -6);
          EXPECT_LE((rows - gate_up_want).abs().max().item<double>(), bound)
              << "gate's and up's gradients written over them";
          // And dh'_i = s_i g_i B_i in the spare columns after them: x's gradient was one GEMM
          // over [g_gate g_up | dh'] (GroupBackward), not a rank-r pass plus the base GEMM.
          const at::Tensor low_rank = SpareColumnsOf(rows, 4 + 8);
          const at::Tensor dha_want =
              at::cat({LowRankGradient(gate_up_want.narrow(1, 0, inter), *layers[0].lora),
                       LowRankGradient(gate_up_want.narrow(1, inter, inter), *layers[1].lora)},
                      1);
          const double low_rank_scale = dha_want.abs().max().item<double>();
          EXPECT_LE((low_rank.to(at::kFloat) - dha_want).abs().max().item<double>(),
                    dtype == at::kFloat ? 1e-5 * low_rank_scale : std::ldexp(low_rank_scale, -5))
              << "dh' after the packed gradients";
        }
      }
    }
  }
}

TEST(EngineFused, LoraNodeWithDropoutEqualsTheUnfusedFormulaWithTheSameMask) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(device.str());
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    at::manual_seed(2);
    LinearLayer layer;
    layer.base.dense = at::randn({24, 16}, f32) * 0.1;
    layer.base.out_features = 24;
    layer.base.in_features = 16;
    LoraWeights lora;
    lora.a = (at::randn({4, 16}, f32) * 0.2).requires_grad_();
    lora.b = (at::randn({24, 4}, f32) * 0.2).requires_grad_();
    lora.scale = 0.75;
    lora.dropout = 0.3;
    layer.lora = lora;
    const at::Tensor x0 = at::randn({3, 7, 16}, f32);
    at::Tensor xa = x0.clone().requires_grad_(), xb = x0.clone().requires_grad_();
    at::manual_seed(11);
    const at::Tensor ours = layer.Forward(xa, /*training=*/true);
    at::manual_seed(11);  // the same mask: dropout draws first in both
    const at::Tensor h = at::dropout(xb.reshape({-1, 16}), 0.3, true).view({3, 7, 16});
    const at::Tensor ref = at::linear(xb, layer.base.dense) + at::linear(at::linear(h, lora.a), lora.b) * lora.scale;
    EXPECT_LE((ours - ref).abs().max().item<double>(), 1e-5);
    const at::Tensor g = at::randn_like(ours);
    const auto go = torch::autograd::grad({ours}, {xa, lora.a, lora.b}, {g});
    const auto gr = torch::autograd::grad({ref}, {xb, lora.a, lora.b}, {g});
    for (size_t i = 0; i < go.size(); ++i) {
      EXPECT_LE((go[i] - gr[i]).abs().max().item<double>(), 1e-5) << "gradient " << i;
    }
    // Evaluation: no dropout, the same node.
    const at::Tensor eval = layer.Forward(x0, /*training=*/false);
    const at::Tensor eval_ref = at::linear(x0, layer.base.dense) +
                                at::linear(at::linear(x0, lora.a), lora.b) * lora.scale;
    EXPECT_LE((eval - eval_ref).abs().max().item<double>(), 1e-5);
  }
}

TEST(EngineFused, RotaryAndSwigluNodesEqualAutogradThroughTheirFormulas) {
  for (const at::Device& device : Devices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << device << " " << dtype);
      at::manual_seed(5);
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      // rotary on the HF layout: the projection output [batch, seq, heads, dim] transposed
      const at::Tensor x = at::randn({2, 12, 4, 64}, opts).transpose(1, 2);
      const at::Tensor angle = at::rand({2, 1, 12, 64}, opts.dtype(at::kFloat)) * 30;
      const at::Tensor cos = angle.cos().to(dtype), sin = angle.sin().to(dtype);
      at::Tensor xa = x.detach().requires_grad_(), xb = x.detach().requires_grad_();
      const at::Tensor ours = Rotary(xa, cos, sin);
      const at::Tensor rotated = at::cat({-xb.narrow(-1, 32, 32), xb.narrow(-1, 0, 32)}, -1);
      const at::Tensor ref = xb * cos + rotated * sin;
      EXPECT_TRUE(at::equal(ours, ref));
      const at::Tensor g = at::randn_like(ref);
      EXPECT_TRUE(at::equal(torch::autograd::grad({ours}, {xa}, {g})[0],
                            torch::autograd::grad({ref}, {xb}, {g})[0]));
      // SwiGLU
      const at::Tensor gate = at::randn({3, 40}, opts) * 3, up = at::randn({3, 40}, opts);
      at::Tensor ga = gate.detach().requires_grad_(), ua = up.detach().requires_grad_();
      at::Tensor gb = gate.detach().requires_grad_(), ub = up.detach().requires_grad_();
      const at::Tensor s_ours = Swiglu(ga, ua), s_ref = at::silu(gb) * ub;
      EXPECT_TRUE(at::equal(s_ours, s_ref));
      const at::Tensor gs = at::randn_like(s_ref);
      const auto go = torch::autograd::grad({s_ours}, {ga, ua}, {gs});
      const auto gr = torch::autograd::grad({s_ref}, {gb, ub}, {gs});
      EXPECT_TRUE(at::equal(go[1], gr[1]));
      // grad of gate: bit-equal on CPU; on CUDA within one ulp (silu_backward's contraction)
      const double ulp = dtype == at::kFloat ? 4.0 / (1 << 23) : 1.0 / 128;
      const at::Tensor excess = (go[0].to(at::kDouble) - gr[0].to(at::kDouble)).abs() -
                                gr[0].to(at::kDouble).abs() * ulp - 1e-30;
      EXPECT_LE(excess.max().item<double>(), 0.0);
    }
  }
}

// The join of a tiled recomputation: at::cat's gradients reach each part, with no joined buffer.
TEST(EngineFused, CatGraphOnlySplitsTheGradientAsCatWithoutAJoinedBuffer) {
  for (const at::Device& device : Devices()) {
    SCOPED_TRACE(::testing::Message() << device);
    const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
    const at::Tensor x = at::randn({1, 11, 8}, opts);
    std::vector<at::Tensor> ours, theirs;
    for (const at::Tensor& tile : x.split(4, 1)) {
      ours.push_back(tile.detach().requires_grad_());
      theirs.push_back(tile.detach().requires_grad_());
    }
    const at::Tensor joined = CatGraphOnly(ours, 1);
    const at::Tensor ref = at::cat(theirs, 1);
    EXPECT_EQ(joined.sizes(), ref.sizes());
    EXPECT_LE(joined.storage().nbytes(), 2u);  // one element, expanded
    const at::Tensor g = at::randn_like(ref);
    // Through a view to another shape, as the decoder returns it.
    const auto go = torch::autograd::grad({joined.view({11, 8})}, ours, {g.view({11, 8})});
    const auto gr = torch::autograd::grad({ref}, theirs, {g});
    ASSERT_EQ(go.size(), 3u);
    for (size_t i = 0; i < go.size(); ++i) EXPECT_TRUE(at::equal(go[i], gr[i])) << i;
  }
}

// The residual add + RMSNorm node as the decoder uses it: h continues the residual stream and
// the norm of h feeds the projections, so x and delta get the norm's gradient plus h's own.
TEST(EngineFused, ResidualRmsNormNodeEqualsAddThenNormUnderAutograd) {
  for (const at::Device& device : Devices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << device << " " << dtype);
      at::manual_seed(9);
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      const at::Tensor x = at::randn({2, 9, 256}, opts) * 2, delta = at::randn({2, 9, 256}, opts);
      const at::Tensor w = (1 + 0.1 * at::randn({256}, opts.dtype(at::kFloat))).to(dtype);
      at::Tensor xa = x.detach().requires_grad_(), da = delta.detach().requires_grad_();
      at::Tensor xb = x.detach().requires_grad_(), db = delta.detach().requires_grad_();
      const auto [h, n, rstd_n] = ResidualRmsNorm(xa, da, w, 1e-5);
      const at::Tensor h_ref = xb + db;
      const at::Tensor n_ref = at::rms_norm(h_ref, {256}, w, 1e-5);
      EXPECT_TRUE(at::equal(h, h_ref));
      const double tol = dtype == at::kFloat ? 1e-5 : 0.05;
      EXPECT_LT((n - n_ref).abs().max().item<double>(), tol);
      // What a decoder layer does with them: h goes on (times gh), n into the projections (gn).
      const at::Tensor gh = at::randn_like(h), gn = at::randn_like(n);
      const auto ours = torch::autograd::grad({h, n}, {xa, da}, {gh, gn});
      const auto ref = torch::autograd::grad({h_ref, n_ref}, {xb, db}, {gh, gn});
      for (int i = 0; i < 2; ++i) {
        EXPECT_LT((ours[i].to(at::kFloat) - ref[i].to(at::kFloat)).abs().max().item<double>(),
                  dtype == at::kFloat ? 1e-5 : 0.1)
            << i;
      }
      EXPECT_TRUE(at::equal(ours[0], ours[1]));

      // Without delta: x passes through as the residual stream; its gradient is the norm's plus
      // the stream's own.
      at::Tensor xc = x.detach().requires_grad_(), xd = x.detach().requires_grad_();
      const auto [pass, n2, rstd_n2] = ResidualRmsNorm(xc, at::Tensor(), w, 1e-5);
      EXPECT_TRUE(at::equal(pass, xc));
      const at::Tensor n2_ref = at::rms_norm(xd, {256}, w, 1e-5);
      EXPECT_LT((n2 - n2_ref).abs().max().item<double>(), tol);
      const at::Tensor dx2 = torch::autograd::grad({pass, n2}, {xc}, {gh, gn})[0];
      const at::Tensor dx2_ref = torch::autograd::grad({xd * 1, n2_ref}, {xd}, {gh, gn})[0];
      EXPECT_LT((dx2.to(at::kFloat) - dx2_ref.to(at::kFloat)).abs().max().item<double>(),
                dtype == at::kFloat ? 1e-5 : 0.1);

      // One output with a gradient: the other's (and rstd's) reach backward undefined, not as
      // zeros (the node does not materialize them), and the gradient is that output's alone.
      at::Tensor xe = x.detach().requires_grad_(), de = delta.detach().requires_grad_();
      at::Tensor xf = x.detach().requires_grad_(), df = delta.detach().requires_grad_();
      const NormedResidual only_n = ResidualRmsNorm(xe, de, w, 1e-5);
      const at::Tensor dn_only = torch::autograd::grad({only_n.n}, {xe}, {gn})[0];
      const at::Tensor dn_ref =
          torch::autograd::grad({at::rms_norm(xf + df, {256}, w, 1e-5)}, {xf}, {gn})[0];
      EXPECT_LT((dn_only.to(at::kFloat) - dn_ref.to(at::kFloat)).abs().max().item<double>(),
                dtype == at::kFloat ? 1e-5 : 0.1);
      at::Tensor xg = x.detach().requires_grad_(), dg = delta.detach().requires_grad_();
      const NormedResidual only_h = ResidualRmsNorm(xg, dg, w, 1e-5);
      const auto dh_only = torch::autograd::grad({only_h.h}, {xg, dg}, {gh});
      EXPECT_TRUE(at::equal(dh_only[0], gh));
      EXPECT_TRUE(at::equal(dh_only[1], gh));
    }
  }
}

}  // namespace
}  // namespace qlora::engine
