// The fused elementwise kernels (kernels/fused_elementwise.h) against their unfused ATen
// formulas and what autograd computes for them: on CPU (the formulas; the backward formulas are
// checked against autograd) and, where there is a GPU, the CUDA kernels against the same
// formulas on the GPU: rotary bit for bit forward and backward (strided and broadcast inputs
// too, per-head tables, in place over packed rows, q/k/v gradients rotated back and copied into
// packed rows in one call), SwiGLU forward bit for bit and backward
// within one ulp (over every finite 16-bit gate value as well; and the forward's output that
// backward may give again, bit for bit; over rows of a wider buffer the contiguous case's bits).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <tuple>
#include <utility>
#include <vector>

#include "kernels/fused_elementwise.h"
#include "tests/kernels/test_devices.h"

namespace qlora::kernels {
namespace {

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// The formula the engine used before the fused kernels, differentiated by autograd.
std::pair<at::Tensor, at::Tensor> UnfusedRotary(const at::Tensor& x, const at::Tensor& cos,
                                                const at::Tensor& sin, const at::Tensor& grad) {
  at::Tensor leaf = x.detach().requires_grad_();
  at::Tensor out = leaf * cos + RotateHalf(leaf) * sin;
  at::Tensor dx = torch::autograd::grad({out}, {leaf}, {grad})[0];
  return {out.detach(), dx};
}

// Equal values (+0 == -0), NaN nowhere.
void ExpectBitEqual(const at::Tensor& a, const at::Tensor& b, const char* what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what;
  const at::Tensor x = a.to(at::kFloat).cpu(), y = b.to(at::kFloat).cpu();
  EXPECT_FALSE(x.isnan().any().item<bool>()) << what;
  EXPECT_EQ(x.ne(y).sum().item<int64_t>(), 0) << what << ": max diff "
                                             << (x - y).abs().max().item<double>();
}

struct RotaryCase {
  int64_t batch, heads, seq, dim;
  bool seq_major;      // x as the HF view: [batch, seq, heads, dim] memory, transposed
  bool shared_tables;  // cos/sin [1, 1, seq, dim] (one table for every row)
  bool per_head_tables = false;  // cos/sin [batch, heads, seq, dim] (a table for every head)
};

TEST(KernelsFused, RotaryEqualsTheUnfusedFormulaAndItsAutogradGradient) {
  const std::vector<RotaryCase> cases = {
      {2, 4, 33, 128, true, false}, {1, 3, 17, 64, false, true},
      {3, 2, 9, 16, true, true},    {2, 2, 5, 6, false, false},  // dim 6: not vectorizable
      {2, 5, 7, 32, true, false, true}, {1, 9, 3, 128, false, false, true}};
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const RotaryCase& c : cases) {
        SCOPED_TRACE(::testing::Message() << device << " " << dtype << " dim " << c.dim << " seq "
                                          << c.seq);
        at::manual_seed(7);
        const auto opts = at::TensorOptions().dtype(dtype).device(device);
        const at::Tensor x =
            c.seq_major ? (at::randn({c.batch, c.seq, c.heads, c.dim}, opts) * 3).transpose(1, 2)
                        : at::randn({c.batch, c.heads, c.seq, c.dim}, opts) * 3;
        const int64_t table_batch = c.shared_tables ? 1 : c.batch;
        const int64_t table_heads = c.per_head_tables ? c.heads : 1;
        const at::Tensor angle =
            at::rand({table_batch, table_heads, c.seq, c.dim}, opts.dtype(at::kFloat)) * 40;
        const at::Tensor cos = angle.cos().to(dtype), sin = angle.sin().to(dtype);
        const at::Tensor grad = at::randn(x.sizes(), opts);
        const auto [ref_out, ref_dx] = UnfusedRotary(x, cos, sin, grad);
        ExpectBitEqual(RotaryForward(x, cos, sin), ref_out, "forward");
        ExpectBitEqual(RotaryBackward(grad, cos, sin), ref_dx, "backward");
      }
    }
  }
}

TEST(KernelsFused, RotaryKeepsTheInputsLayout) {
  for (const at::Device& device : KernelTestDevices()) {
    const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
    const at::Tensor x = at::randn({2, 8, 4, 32}, opts).transpose(1, 2);  // [2, 4, 8, 32] view
    const at::Tensor cos = at::ones({2, 1, 8, 32}, opts), sin = at::zeros({2, 1, 8, 32}, opts);
    const at::Tensor out = RotaryForward(x, cos, sin);
    EXPECT_EQ(out.strides(), x.strides()) << device;
    ExpectBitEqual(out, x, "cos 1, sin 0 is the identity");
  }
}

// In place over q's columns of packed q/k/v rows [batch, seq, 3 * heads * dim] (the engine's
// layout): q's values are RotaryForward's to the bit, k's and v's columns are untouched.
TEST(KernelsFused, RotaryInPlaceOverPackedRowsTouchesOnlyItsColumns) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << device << " " << dtype);
      at::manual_seed(9);
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      const int64_t batch = 2, seq = 11, heads = 6, dim = 64;
      const at::Tensor packed = at::randn({batch, seq, 3 * heads * dim}, opts);
      const at::Tensor before = packed.clone();
      at::Tensor q = packed.narrow(2, 0, heads * dim).view({batch, seq, heads, dim}).transpose(1, 2);
      const at::Tensor angle = at::rand({batch, 1, seq, dim}, opts.dtype(at::kFloat)) * 40;
      const at::Tensor cos = angle.cos().to(dtype), sin = angle.sin().to(dtype);
      const at::Tensor expected = RotaryForward(q, cos, sin);
      RotaryForwardInPlace(q, cos, sin);
      ExpectBitEqual(q, expected, "q in place");
      ExpectBitEqual(packed.narrow(2, heads * dim, 2 * heads * dim),
                     before.narrow(2, heads * dim, 2 * heads * dim), "k and v untouched");
    }
  }
}

// q's and k's gradients rotated back and v's copied into packed gradient rows (with spare
// columns after them) in one call: each column block holds RotaryBackward's bits (v's: its own),
// grouped-query head counts too, and the spare columns stay as they were.
TEST(KernelsFused, RotaryBackwardAndCopyFillPackedRowsBlockByBlock) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (const int64_t kv_heads : {int64_t{6}, int64_t{2}}) {
        SCOPED_TRACE(::testing::Message() << device << " " << dtype << " kv heads " << kv_heads);
        at::manual_seed(11);
        const auto opts = at::TensorOptions().dtype(dtype).device(device);
        const int64_t batch = 2, seq = 13, heads = 6, dim = 64, spare = 64;
        const int64_t total = (heads + 2 * kv_heads) * dim;
        const at::Tensor rows = at::randn({batch * seq, total + spare}, opts);
        const at::Tensor before = rows.clone();
        auto as_heads = [&](const at::Tensor& t, int64_t h) {  // [T, h * dim] rows as heads
          return t.view({batch, seq, h, dim}).transpose(1, 2);
        };
        const at::Tensor gq = as_heads(at::randn({batch * seq, heads * dim}, opts), heads);
        const at::Tensor gk = as_heads(at::randn({batch * seq, kv_heads * dim}, opts), kv_heads);
        const at::Tensor gv = as_heads(at::randn({batch * seq, kv_heads * dim}, opts), kv_heads);
        const at::Tensor angle = at::rand({batch, 1, seq, dim}, opts.dtype(at::kFloat)) * 40;
        const at::Tensor cos = angle.cos().to(dtype), sin = angle.sin().to(dtype);
        at::Tensor all = as_heads(rows.narrow(1, 0, total), heads + 2 * kv_heads);
        RotaryBackwardAndCopyInto({gq, gk}, gv, cos, sin, all);
        ExpectBitEqual(all.narrow(1, 0, heads), RotaryBackward(gq, cos, sin), "q");
        ExpectBitEqual(all.narrow(1, heads, kv_heads), RotaryBackward(gk, cos, sin), "k");
        ExpectBitEqual(all.narrow(1, heads + kv_heads, kv_heads), gv, "v copied");
        ExpectBitEqual(rows.narrow(1, total, spare), before.narrow(1, total, spare), "spare");
        EXPECT_THROW(RotaryBackwardAndCopyInto({gq}, gv, cos, sin, all), c10::Error);  // heads
      }
    }
  }
}

// SwigluForward and SwigluBackward against at::silu(g) * u and autograd's gradients for dy: the
// forward's and the up gradient's bits, and the gate gradient's on the CPU; on CUDA within one
// ulp of the dtype (float32: a few), as silu_backward's float arithmetic may be contracted
// differently by two compilers. Returns {dg, du, the reference forward}.
std::tuple<at::Tensor, at::Tensor, at::Tensor> ExpectSwigluMatchesAutograd(const at::Tensor& g,
                                                                         const at::Tensor& u,
                                                                         const at::Tensor& dy) {
  at::Tensor gl = g.detach().requires_grad_(), ul = u.detach().requires_grad_();
  const at::Tensor ref = at::silu(gl) * ul;
  const auto ref_grads = torch::autograd::grad({ref}, {gl, ul}, {dy});
  ExpectBitEqual(SwigluForward(g, u), ref.detach(), "forward");
  auto [dg, du] = SwigluBackward(dy, g, u);
  ExpectBitEqual(du, ref_grads[1], "grad up");
  if (g.is_cpu()) {
    ExpectBitEqual(dg, ref_grads[0], "grad gate");
  } else {
    const at::ScalarType t = g.scalar_type();
    const at::Tensor a = dg.to(at::kDouble), b = ref_grads[0].to(at::kDouble);
    const double ulp = t == at::kFloat ? 4.0 / (1 << 23) : t == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
    const at::Tensor excess = (a - b).abs() - b.abs() * ulp - 1e-30;
    EXPECT_LE(excess.max().item<double>(), 0.0) << "grad gate";
  }
  return {dg, du, ref.detach()};
}

TEST(KernelsFused, SwigluEqualsTheUnfusedFormulaAndItsAutogradGradient) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const int64_t n : {int64_t{4 * 1031 * 8}, int64_t{3 * 7 * 11}}) {  // tail when not / 8
        SCOPED_TRACE(::testing::Message() << device << " " << dtype << " n " << n);
        at::manual_seed(3);
        const auto opts = at::TensorOptions().dtype(dtype).device(device);
        const at::Tensor g = (at::randn({n}, opts) * 4).view({-1, n % 8 == 0 ? 8 : 7});
        const at::Tensor u = at::randn(g.sizes(), opts) * 2;
        const at::Tensor dy = at::randn(g.sizes(), opts);
        const auto [dg, du, ref] = ExpectSwigluMatchesAutograd(g, u, dy);
        // In place: grad_gate lands in the incoming gradient's buffer, bit for bit the same.
        at::Tensor in_place = dy.clone();
        const void* buffer = in_place.const_data_ptr();
        const at::Tensor du2 = SwigluBackwardInPlace(in_place, g, u);
        EXPECT_EQ(in_place.const_data_ptr(), buffer);
        ExpectBitEqual(in_place, dg, "grad gate in place");
        ExpectBitEqual(du2, du, "grad up next to an in-place grad gate");
        // Both over their inputs: grad_gate over the gradient, grad_up over up.
        at::Tensor over_grad = dy.clone(), over_up = u.clone();
        const void* up_buffer = over_up.const_data_ptr();
        SwigluBackwardOverInputs(over_grad, g, over_up);
        EXPECT_EQ(over_up.const_data_ptr(), up_buffer);
        ExpectBitEqual(over_grad, dg, "grad gate over the gradient");
        ExpectBitEqual(over_up, du, "grad up over up");
        // Asked for the forward's output too: the same bits as SwigluForward (from up as it was
        // before grad_up overwrote it), the gradients unchanged.
        at::Tensor product_in_place, product_over;
        at::Tensor in_place2 = dy.clone();
        ExpectBitEqual(SwigluBackwardInPlace(in_place2, g, u, &product_in_place), du,
                       "grad up, with the product");
        ExpectBitEqual(in_place2, dg, "grad gate in place, with the product");
        ExpectBitEqual(product_in_place, ref, "product next to an in-place grad gate");
        at::Tensor over_grad2 = dy.clone(), over_up2 = u.clone();
        SwigluBackwardOverInputs(over_grad2, g, over_up2, &product_over);
        ExpectBitEqual(over_grad2, dg, "grad gate over the gradient, with the product");
        ExpectBitEqual(over_up2, du, "grad up over up, with the product");
        ExpectBitEqual(product_over, ref, "product next to gradients over the inputs");
      }
    }
  }
}

// Every finite 16-bit gate value, up and the output's gradient random: SwiGLU's kernels give
// ATen's bits forward and for the up gradient, and the gate gradient's (on CUDA within one ulp
// of autograd's), over the whole range (|gate| past exp's range, values next to every rounding
// boundary of silu) and not just where random samples land.
TEST(KernelsFused, SwigluOverEveryGateValueKeepsATensBits) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(::testing::Message() << device << " " << dtype);
      at::manual_seed(21);
      const at::Tensor every = at::arange(-32768, 32768, at::kInt).to(at::kShort).view(dtype);
      const at::Tensor g = every.masked_select(at::isfinite(every)).to(device);
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      const at::Tensor u = at::randn(g.sizes(), opts), dy = at::randn(g.sizes(), opts);
      ExpectSwigluMatchesAutograd(g, u, dy);
    }
  }
}

// Rows of a wider buffer (the down projection's widened rows: spare columns after each row):
// SwigluForwardWithSpareColumns writes SwigluForward's bits into them, and the in-place backwards
// write the gate's gradient over such rows of the output's gradient with the bits of the
// contiguous case, the spare columns untouched.
TEST(KernelsFused, SwigluOverRowsOfAWiderBufferEqualsTheContiguousCase) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << device << " " << dtype);
      at::manual_seed(12);
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      const int64_t rows = 37, cols = 96, spare = 32;
      const at::Tensor g = at::randn({rows, cols}, opts) * 4, u = at::randn({rows, cols}, opts);
      const at::Tensor x = SwigluForwardWithSpareColumns(g, u, spare);
      EXPECT_EQ(x.sizes(), g.sizes());
      EXPECT_EQ(x.stride(0), cols + spare);
      ExpectBitEqual(x, SwigluForward(g, u), "forward into wider rows");

      const at::Tensor dy = at::randn({rows, cols}, opts);
      const auto [dg, du] = SwigluBackward(dy, g, u);
      for (const bool over_inputs : {false, true}) {
        SCOPED_TRACE(over_inputs ? "over the inputs" : "in place");
        const at::Tensor wide = at::full({rows, cols + spare}, 7.0, opts);
        at::Tensor grad = wide.narrow(1, 0, cols);
        grad.copy_(dy);
        at::Tensor up = u.clone(), grad_up;
        if (over_inputs) {
          SwigluBackwardOverInputs(grad, g, up);
          grad_up = up;
        } else {
          grad_up = SwigluBackwardInPlace(grad, g, u);
        }
        ExpectBitEqual(grad, dg, "grad gate over rows of a wider buffer");
        ExpectBitEqual(grad_up, du, "grad up");
        EXPECT_TRUE(wide.narrow(1, cols, spare).eq(7.0).all().item<bool>()) << "spare columns";
      }
    }
  }
}

// gate and up side by side in one packed buffer [rows, 2 cols] (the packed gate/up GEMM's
// output): SwiGLU reads them as they are, and its backward writes the gradients over them, so
// that they come out packed too. The same bits as contiguous gate and up (the row kernels), with
// and without the product, the gradient of the output read from rows of a wider buffer as well.
// A grouped node's adapter gradients cast to float32 with the norm weight on its As' gradient:
// the bits of the cast followed by mul_ on the leading [rows, cols] block, the rest cast only;
// vectorized (cols a multiple of 8) and not (cols 12), and no scaled rows at all.
TEST(KernelsFused, CastScalingLeadingRowsEqualsTheCastThenMul) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      for (const auto& [rows, cols, rest] :
           {std::tuple<int64_t, int64_t, int64_t>{48, 4096, 3 * 4096 * 16}, {5, 12, 37},
            {0, 64, 256}}) {
        SCOPED_TRACE(testing::Message() << device << " " << dtype << " rows " << rows << " cols "
                                        << cols << " rest " << rest);
        at::manual_seed(rows + cols);
        const at::TensorOptions options = at::dtype(dtype).device(device);
        const at::Tensor in = (at::randn({rows * cols + rest}) * 3).to(options);
        const at::Tensor scale = (1 + 0.2 * at::randn({cols})).to(options);
        const at::Tensor out = at::empty({in.numel()}, options.dtype(at::kFloat));
        CastScalingLeadingRows(in, out, rows, scale);
        at::Tensor want = in.to(at::kFloat);
        want.narrow(0, 0, rows * cols).view({rows, cols}).mul_(scale);
        EXPECT_TRUE(at::equal(out, want));
      }
    }
  }
  const at::Tensor in = at::zeros({64}, at::kBFloat16);
  EXPECT_THROW(CastScalingLeadingRows(in, at::empty({64}), 5, at::ones({16}, at::kBFloat16)),
               c10::Error);  // 5 x 16 > 64
  EXPECT_THROW(CastScalingLeadingRows(in, at::empty({64}, at::kBFloat16), 1,
                                      at::ones({16}, at::kBFloat16)),
               c10::Error);  // not float32 out
}

// The loss's hidden gradient times a device factor: the bits of the float32 product rounded to
// x's dtype (a factor of 1 changes nothing; vectorized lengths and not, a 16-byte-aligned start
// and not, each float dtype), without a float32 copy of x.
TEST(KernelsFused, ScaleInPlaceEqualsTheFloat32ProductRounded) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
      for (const auto& [n, offset] :
           {std::pair<int64_t, int64_t>{4096 * 9, 0}, {37, 0}, {4096 * 9, 1}}) {
        for (const float factor : {1.0f, 0.37f, -3.0f}) {
          SCOPED_TRACE(testing::Message() << device << " " << dtype << " n " << n << " offset "
                                          << offset << " factor " << factor);
          at::manual_seed(n);
          const at::Tensor x = (at::randn({n + offset}) * 3)
                                   .to(at::dtype(dtype).device(device))
                                   .narrow(0, offset, n);
          const at::Tensor f = at::full({}, factor, at::dtype(at::kFloat).device(device));
          const at::Tensor want = x.to(at::kFloat).mul(factor).to(dtype);
          const at::Tensor before = x.clone();
          ScaleInPlace(x, f);
          EXPECT_TRUE(at::equal(x, want));
          if (factor == 1.0f) EXPECT_TRUE(at::equal(x, before));
        }
      }
    }
  }
  EXPECT_THROW(ScaleInPlace(at::ones({4, 4}).t(), at::ones({})), c10::Error);  // not contiguous
  EXPECT_THROW(ScaleInPlace(at::ones({4}), at::ones({2})), c10::Error);        // not one value
  EXPECT_THROW(ScaleInPlace(at::ones({4}), at::ones({}, at::kDouble)), c10::Error);
  EXPECT_THROW(ScaleInPlace(at::ones({4}, at::kDouble), at::ones({})), c10::Error);  // float64 x
}

TEST(KernelsFused, SwigluOverPackedGateAndUpEqualsTheContiguousCase) {
  for (const at::Device& device : KernelTestDevices()) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << device << " " << dtype);
      at::manual_seed(14);
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      const int64_t rows = 37, cols = 96, spare = 32;
      const at::Tensor g = at::randn({rows, cols}, opts) * 4, u = at::randn({rows, cols}, opts);
      const at::Tensor packed0 = at::cat({g, u}, 1);
      const at::Tensor pg = packed0.narrow(1, 0, cols), pu = packed0.narrow(1, cols, cols);
      ExpectBitEqual(SwigluForward(pg, pu), SwigluForward(g, u), "forward of packed gate/up");
      ExpectBitEqual(SwigluForwardWithSpareColumns(pg, pu, spare), SwigluForward(g, u),
                     "forward of packed gate/up into wider rows");

      const at::Tensor dy = at::randn({rows, cols}, opts);
      const auto [dg, du] = SwigluBackward(dy, g, u);
      const auto [packed_dg, packed_du] = SwigluBackward(dy, pg, pu);  // read where they lie
      ExpectBitEqual(packed_dg, dg, "out-of-place backward over packed gate/up: gate");
      ExpectBitEqual(packed_du, du, "out-of-place backward over packed gate/up: up");
      const at::Tensor x_want = SwigluForward(g, u);
      for (const bool strided_grad : {false, true}) {
        for (const bool with_product : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "strided gradient " << strided_grad << ", product "
                                            << with_product);
          at::Tensor packed = packed0.clone();
          at::Tensor gate = packed.narrow(1, 0, cols), up = packed.narrow(1, cols, cols);
          const at::Tensor wide = at::full({rows, cols + spare}, 7.0, opts);
          const at::Tensor grad = strided_grad ? wide.narrow(1, 0, cols).copy_(dy) : dy.clone();
          at::Tensor x;
          SwigluBackwardIntoInputs(grad, gate, up, with_product ? &x : nullptr);
          ExpectBitEqual(packed.narrow(1, 0, cols), dg, "grad gate over gate");
          ExpectBitEqual(packed.narrow(1, cols, cols), du, "grad up over up");
          ExpectBitEqual(grad, dy, "the output's gradient is only read");
          if (with_product) ExpectBitEqual(x, x_want, "the product");
        }
      }
    }
  }
}

// Rows of one long sequence (300,000 tokens): more row blocks than a grid's y dimension takes
// (65,535 of 4 rows), so each block walks several; every row is still written, once.
TEST(KernelsFused, SwigluOverPackedRowsOfAVeryLongSequence) {
  for (const at::Device& device : KernelTestDevices()) {
    if (!device.is_cuda()) continue;  // the row kernels are CUDA's; the CPU has no grid
    at::manual_seed(15);
    const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
    const int64_t rows = 300000, cols = 16, spare = 16;
    const at::Tensor packed = at::randn({rows, 2 * cols}, opts);
    const at::Tensor g = packed.narrow(1, 0, cols), u = packed.narrow(1, cols, cols);
    const at::Tensor want = SwigluForward(g.contiguous(), u.contiguous());
    ExpectBitEqual(SwigluForwardWithSpareColumns(g, u, spare), want, "forward into wider rows");
    const at::Tensor dy = at::randn({rows, cols}, opts);
    const auto [dg, du] = SwigluBackward(dy, g.contiguous(), u.contiguous());
    at::Tensor into = packed.clone();
    at::Tensor gate = into.narrow(1, 0, cols), up = into.narrow(1, cols, cols);
    SwigluBackwardIntoInputs(dy, gate, up);
    ExpectBitEqual(into.narrow(1, 0, cols), dg, "grad gate over gate");
    ExpectBitEqual(into.narrow(1, cols, cols), du, "grad up over up");
  }
}

}  // namespace
}  // namespace qlora::kernels
