// GemmTuner: on CPU it is at::addmm_out; on CUDA (bf16/fp16) every layout the engine issues
// (a or b transposed, beta 0 and 1, alpha, out a view with a wider row stride, C apart from out)
// equals the float32 product within the dtype's rounding, the chosen kernel is kept per shape, and calls it cannot
// take (float32, misaligned rows) still compute the right thing through ATen.
#include "kernels/tuned_gemm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace qlora::kernels {
namespace {

at::Tensor Reference(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                     double beta, double alpha) {
  return out.to(at::kFloat) * beta + at::mm(a.to(at::kFloat), b.to(at::kFloat)) * alpha;
}

TEST(KernelsTunedGemm, CpuIsAtenAddmm) {
  GemmTuner tuner;
  const at::Tensor a = at::randn({37, 19}), b = at::randn({23, 19}).t();
  at::Tensor out = at::randn({37, 23});
  const at::Tensor expected = at::addmm(out, a, b, 0.5, 2.0);
  tuner.Addmm(out, a, b, 0.5, 2.0);
  EXPECT_TRUE(at::equal(out, expected));
  EXPECT_EQ(tuner.tuned_shapes(), 0);
  EXPECT_TRUE(tuner.TimeCandidates(out, a, b, 0.0).empty());
  // C apart from out: out = 0.5 c + 2 a b, c untouched.
  const at::Tensor c = at::randn({37, 23}), c_before = c.clone();
  tuner.Addmm(out, a, b, 0.5, 2.0, c);
  EXPECT_TRUE(at::equal(out, at::addmm(c, a, b, 0.5, 2.0)));
  EXPECT_TRUE(at::equal(c, c_before));
}

class KernelsTunedGemmCuda : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
  }
  at::TensorOptions Options() const { return at::TensorOptions().device(at::kCUDA).dtype(GetParam()); }
};

TEST_P(KernelsTunedGemmCuda, EveryLayoutEqualsTheFloatProduct) {
  GemmTuner tuner;
  const int64_t m = 512, k = 384, n = 640;
  int64_t calls = 0;
  for (bool a_transposed : {false, true}) {
    for (bool b_transposed : {false, true}) {
      for (double beta : {0.0, 1.0}) {
        const at::Tensor a = a_transposed ? at::randn({k, m}, Options()).t() : at::randn({m, k}, Options());
        const at::Tensor b = b_transposed ? at::randn({n, k}, Options()).t() : at::randn({k, n}, Options());
        // out: a view of the first n columns of a wider buffer (row stride n + 64)
        at::Tensor wide = at::randn({m, n + 64}, Options());
        at::Tensor out = wide.narrow(1, 0, n);
        const at::Tensor expected = Reference(out, a, b, beta, 0.75);
        const at::Tensor right_columns = wide.narrow(1, n, 64).clone();
        tuner.Addmm(out, a, b, beta, 0.75);
        ++calls;
        const double tol = GetParam() == at::kBFloat16 ? 0.5 : 0.06;  // |values| ~ sqrt(k)
        EXPECT_TRUE(at::allclose(out.to(at::kFloat), expected, 1e-2, tol))
            << "a^T " << a_transposed << " b^T " << b_transposed << " beta " << beta
            << " max error " << (out.to(at::kFloat) - expected).abs().max().item<double>();
        EXPECT_TRUE(at::equal(wide.narrow(1, n, 64), right_columns)) << "wrote past out";
      }
    }
  }
  EXPECT_EQ(tuner.tuned_shapes(), calls);
  // Another shape of a tuned class (out's rows not widened; then other row counts in the same
  // octave, as packed batches give) is not tuned again, computes the right thing, and gives the
  // same bits call after call; a row count in another octave is a new class.
  for (int64_t rows : {m, m + 100, m + 300}) {
    const at::Tensor a = at::randn({rows, k}, Options()), b = at::randn({k, n}, Options());
    at::Tensor first = at::empty({rows, n}, Options()), second = at::empty({rows, n}, Options());
    tuner.Addmm(first, a, b, 0.0);
    tuner.Addmm(second, a, b, 0.0);
    EXPECT_TRUE(at::equal(first, second)) << rows;
    EXPECT_TRUE(at::allclose(first.to(at::kFloat), Reference(first, a, b, 0.0, 1.0), 1e-2, 0.5))
        << rows;
    EXPECT_EQ(tuner.tuned_shapes(), calls) << rows;
  }
  const at::Tensor a = at::randn({2 * m, k}, Options()), b = at::randn({k, n}, Options());
  at::Tensor out = at::empty({2 * m, n}, Options());
  tuner.Addmm(out, a, b, 0.0);
  EXPECT_EQ(tuner.tuned_shapes(), calls + 1);
  EXPECT_FALSE(tuner.TimeCandidates(out, a, b, 0.0).empty());
  // Sides under 64 (the adapters' ranks: a grouped layer's As' gradient [sum of r, in]) are
  // classes of their own, not octaves: 32 and 48 rows are tuned apart, each right.
  for (const int64_t rows : {int64_t{32}, int64_t{48}}) {
    const at::Tensor x = at::randn({rows, k}, Options()), y = at::randn({k, n}, Options());
    at::Tensor small = at::empty({rows, n}, Options());
    const int64_t before = tuner.tuned_shapes();
    tuner.Addmm(small, x, y, 0.0);
    EXPECT_EQ(tuner.tuned_shapes(), before + 1) << rows;
    EXPECT_TRUE(at::allclose(small.to(at::kFloat), Reference(small, x, y, 0.0, 1.0), 1e-2, 0.5))
        << rows;
  }
}

// C apart from D (the residual stream added in the down projection's epilogue): out = beta c +
// alpha a b within the dtype's rounding, c never written, for c with out's strides (cuBLASLt's C)
// and with other strides (through ATen); the same bits call after call. (Not the bits of copying
// c into out and accumulating there: on an H200 the two differed in last bits, round 15.)
TEST_P(KernelsTunedGemmCuda, SeparateCIsReadNeverWritten) {
  GemmTuner tuner;
  const int64_t m = 512, k = 384, n = 640;
  const at::Tensor a = at::randn({m, k}, Options()), b = at::randn({n, k}, Options()).t();
  for (const bool same_strides : {true, false}) {
    SCOPED_TRACE(same_strides ? "c with out's strides" : "c a view of wider rows");
    const at::Tensor c = same_strides ? at::randn({m, n}, Options())
                                      : at::randn({m, n + 64}, Options()).narrow(1, 0, n);
    const at::Tensor c_before = c.clone();
    at::Tensor out = at::empty({m, n}, Options());
    tuner.Addmm(out, a, b, 1.0, 0.75, c);
    EXPECT_TRUE(at::equal(c, c_before));
    const double tol = GetParam() == at::kBFloat16 ? 0.5 : 0.06;
    EXPECT_TRUE(at::allclose(out.to(at::kFloat), Reference(c, a, b, 1.0, 0.75), 1e-2, tol))
        << (out.to(at::kFloat) - Reference(c, a, b, 1.0, 0.75)).abs().max().item<double>();
    at::Tensor again = at::empty({m, n}, Options());
    tuner.Addmm(again, a, b, 1.0, 0.75, c);
    EXPECT_TRUE(at::equal(out, again));  // the same bits call after call
  }
}

TEST_P(KernelsTunedGemmCuda, CallsItCannotTakeGoThroughAten) {
  GemmTuner tuner;
  // k = 7: rows of 14 bytes are not 16-byte aligned; and a float32 call.
  const at::Tensor a = at::randn({64, 7}, Options()), b = at::randn({7, 32}, Options());
  at::Tensor out = at::zeros({64, 32}, Options());
  tuner.Addmm(out, a, b, 0.0);
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), Reference(out, a, b, 0.0, 1.0), 1e-2, 0.05));
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  at::Tensor outf = at::zeros({64, 32}, af.options());
  tuner.Addmm(outf, af, bf, 0.0);
  EXPECT_TRUE(at::allclose(outf, at::mm(af, bf), 1e-5, 1e-5));
  EXPECT_EQ(tuner.tuned_shapes(), 0);
}

// Variants (other custom options and swizzling of the heuristic's tiles) add candidates; past
// `finalists`, only the fastest that many (and ATen's call) are reported; the chosen kernel
// computes the product.
TEST_P(KernelsTunedGemmCuda, VariantsAddCandidatesAndFinalistsBoundTheLastRounds) {
  const int64_t m = 2048, k = 1024, n = 1536;
  const at::Tensor a = at::randn({m, k}, Options()), b = at::randn({n, k}, Options()).t();
  at::Tensor out = at::empty({m, n}, Options());
  GemmTunerOptions heuristic_only;
  heuristic_only.finalists = 1000;
  GemmTunerOptions with_variants = heuristic_only;
  with_variants.variants = 64;
  GemmTunerOptions few_finalists = with_variants;
  few_finalists.finalists = 2;
  GemmTuner plain(heuristic_only), varied(with_variants), cut(few_finalists);
  const size_t offered = plain.TimeCandidates(out, a, b, 0.0).size();
  const size_t with_more = varied.TimeCandidates(out, a, b, 0.0).size();
  ASSERT_GE(offered, 2u) << "ATen's call and at least one of the heuristic's";
  EXPECT_GT(with_more, offered) << "no variant of the heuristic's configurations was timed";
  EXPECT_EQ(cut.TimeCandidates(out, a, b, 0.0).size(), 3u) << "ATen's call and two finalists";
  cut.Addmm(out, a, b, 0.0);
  EXPECT_EQ(cut.tuned_shapes(), 1);
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), Reference(out, a, b, 0.0, 1.0), 1e-2, 0.5));
}

// Steady-state timing: ATen's call and the `steady_finalists` fastest of the batches run back to
// back and rank first, by their steady time; the rest keep their batch time and none; calls
// shorter than steady_min_call_ms are not timed so. The kept kernel computes the product.
TEST_P(KernelsTunedGemmCuda, SteadyStateTimingRanksTheFinalists) {
  const int64_t m = 2048, k = 1024, n = 1536;
  const at::Tensor a = at::randn({m, k}, Options()), b = at::randn({n, k}, Options()).t();
  at::Tensor out = at::empty({m, n}, Options());
  GemmTunerOptions steady;
  steady.steady_ms = 20;
  steady.steady_finalists = 2;
  steady.steady_min_call_ms = 0;
  GemmTuner tuner(steady);
  const std::vector<GemmCandidateTiming> timings = tuner.TimeCandidates(out, a, b, 0.0);
  ASSERT_GE(timings.size(), 3u) << "ATen's call and at least two of the heuristic's";
  size_t timed = 0;
  bool aten_timed = false;
  for (size_t i = 0; i < timings.size(); ++i) {
    if (timings[i].steady_milliseconds <= 0) continue;
    EXPECT_EQ(i, timed) << "a contender timed in steady state ranks below one that was not";
    if (timed > 0) {
      EXPECT_GE(timings[i].steady_milliseconds, timings[i - 1].steady_milliseconds);
    }
    aten_timed = aten_timed || timings[i].algorithm == "aten";
    ++timed;
  }
  EXPECT_EQ(timed, 3u) << "ATen's call and two finalists";
  EXPECT_TRUE(aten_timed);
  GemmTunerOptions too_short = steady;
  too_short.steady_min_call_ms = 1e9;
  for (const GemmCandidateTiming& c : GemmTuner(too_short).TimeCandidates(out, a, b, 0.0)) {
    EXPECT_EQ(c.steady_milliseconds, 0) << c.algorithm;
  }
  tuner.Addmm(out, a, b, 0.0);
  EXPECT_EQ(tuner.tuned_shapes(), 1);
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), Reference(out, a, b, 0.0, 1.0), 1e-2, 0.5));
}

// A thin output over a long K (an adapter's weight gradient dA = dh'^T x, [16, 4096] over 8192
// tokens) may take split-K candidates, each keeping its parts in float32 (cuBLASLt's reduction
// scheme 2, the compute type); a wide output never, nor a thin one with split_k_max_output_side
// 0. The tuned product is right and the same bits call after call.
TEST_P(KernelsTunedGemmCuda, OnlyThinOutputsSplitKAndOnlyWithFloatParts) {
  const int64_t r = 16, tokens = 8192, in = 4096;
  const at::Tensor dha = at::randn({tokens, r}, Options()), x = at::randn({tokens, in}, Options());
  at::Tensor da = at::empty({r, in}, Options());
  auto split = [](const GemmCandidateTiming& c) {
    return c.algorithm.find("splitk=1 ") == std::string::npos && c.algorithm != "aten";
  };
  GemmTunerOptions all;
  all.finalists = 1000;
  GemmTuner tuner(all);
  int split_candidates = 0;
  for (const GemmCandidateTiming& c : tuner.TimeCandidates(da, dha.t(), x, 0.0)) {
    if (!split(c)) continue;
    ++split_candidates;
    EXPECT_NE(c.algorithm.find("reduction=2"), std::string::npos) << c.algorithm;
  }
  EXPECT_GT(split_candidates, 0) << "cuBLASLt offered no split-K kernel for a thin output";
  GemmTunerOptions never = all;
  never.split_k_max_output_side = 0;
  for (const GemmCandidateTiming& c : GemmTuner(never).TimeCandidates(da, dha.t(), x, 0.0)) {
    EXPECT_FALSE(split(c)) << c.algorithm;
  }
  const at::Tensor a = at::randn({2048, 2048}, Options()), b = at::randn({2048, 1024}, Options());
  at::Tensor wide = at::empty({2048, 1024}, Options());
  for (const GemmCandidateTiming& c : tuner.TimeCandidates(wide, a, b, 0.0)) {
    EXPECT_FALSE(split(c)) << c.algorithm;
  }
  tuner.Addmm(da, dha.t(), x, 0.0);
  at::Tensor again = at::empty({r, in}, Options());
  tuner.Addmm(again, dha.t(), x, 0.0);
  EXPECT_TRUE(at::equal(da, again));
  const double tol = GetParam() == at::kBFloat16 ? 2.0 : 0.25;  // |values| ~ sqrt(8192) ~ 90
  EXPECT_TRUE(at::allclose(da.to(at::kFloat), Reference(da, dha.t(), x, 0.0, 1.0), 1e-2, tol))
      << (da.to(at::kFloat) - Reference(da, dha.t(), x, 0.0, 1.0)).abs().max().item<double>();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KernelsTunedGemmCuda,
                         ::testing::Values(at::kBFloat16, at::kHalf));

}  // namespace
}  // namespace qlora::kernels
