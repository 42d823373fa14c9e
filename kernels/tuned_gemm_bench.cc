// qlora-tuned-gemm-bench: for the base projections' GEMMs of one decoder layer, as the engine
// issues them at rank 16, every cuBLASLt candidate's time against ATen's own call (cuBLAS's pick).
//   tuned_gemm_bench [tokens hidden intermediate kv_hidden [repetitions heat_ms [candidates
//                    [variants [steady_ms [steady_finalists [workspace_bytes]]]]]]]
//   (default 8192 4096 11008 4096, and the tuner's timing_repetitions, heat_ms, candidates,
//   variants, steady_ms, steady_finalists and workspace_bytes; with steady_ms, the contenders
//   timed in steady state are listed; each candidate names the workspace it asks for)
// Then the adapters' weight-gradient GEMMs (dA [r, in] over K = tokens: split-K may run them).
// Prints, per GEMM, ATen's milliseconds and TFLOP/s, the fastest candidate's, and the top three,
// as the tuner times them (GemmTunerOptions: `repetitions` runs per batch; ATen's GEMM first runs
// back to back for `heat_ms`, 0 to time on a cool GPU).
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/tuned_gemm.h"

namespace {

using qlora::kernels::GemmCandidateTiming;

// ATen's own call's time among a shape's timings (the tuner names it "aten").
double AtenMilliseconds(const std::vector<GemmCandidateTiming>& timings) {
  for (const GemmCandidateTiming& c : timings) {
    if (c.algorithm == "aten") return c.milliseconds;
  }
  return 0;
}

// The second to fourth fastest, a line each under the row that named the fastest.
void PrintRunnersUp(const std::vector<GemmCandidateTiming>& timings) {
  for (size_t k = 1; k < timings.size() && k < 4; ++k) {
    std::printf("           %.3f ms %s\n", timings[k].milliseconds, timings[k].algorithm.c_str());
  }
}

// Where the tuner timed contenders in steady state (GemmTunerOptions::steady_ms): each one's
// steady time a call against its batch time, in the order they rank.
void PrintSteady(const std::vector<GemmCandidateTiming>& timings, double flop) {
  for (const GemmCandidateTiming& c : timings) {
    if (c.steady_milliseconds <= 0) continue;
    std::printf("   steady %.3f ms %.0f TFLOP/s (batches %.3f ms) %s\n", c.steady_milliseconds,
                flop / c.steady_milliseconds / 1e9, c.milliseconds, c.algorithm.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using qlora::kernels::GemmTuner;
  if (!at::hasCUDA()) {
    std::printf("no GPU: nothing to time\n");
    return 0;
  }
  const int64_t t = argc > 1 ? std::atoll(argv[1]) : 8192;
  const int64_t h = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int64_t i = argc > 3 ? std::atoll(argv[3]) : 11008;
  const int64_t kv = argc > 4 ? std::atoll(argv[4]) : 4096;
  qlora::kernels::GemmTunerOptions options;
  options.timing_repetitions = argc > 5 ? std::atoi(argv[5]) : options.timing_repetitions;
  options.heat_ms = argc > 6 ? std::atof(argv[6]) : options.heat_ms;
  options.candidates = argc > 7 ? std::atoi(argv[7]) : options.candidates;
  options.variants = argc > 8 ? std::atoi(argv[8]) : options.variants;
  options.steady_ms = argc > 9 ? std::atof(argv[9]) : options.steady_ms;
  options.steady_finalists = argc > 10 ? std::atoi(argv[10]) : options.steady_finalists;
  options.workspace_bytes = argc > 11 ? std::atoll(argv[11]) : options.workspace_bytes;
  GemmTuner tuner(options);
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  // The engine's base GEMMs at rank 16 (the LoRA nodes): forward over rows widened by the
  // adapters' h A^T columns (q/k/v and gate/up stacked, K = in + the ranks), o and down adding
  // into what is there (beta 1); backward over gradients with dh' after them and the As under
  // the stacked weights (K = out + the ranks).
  struct Shape {
    const char* name;
    bool backward;
    int64_t out, in;  // the weight, [out, in] as the GEMM reads it (ranks included)
    double beta;
  };
  const int64_t r = 16;
  const std::vector<Shape> shapes = {
      {"q/k/v", false, 2 * h + kv, h + 3 * r, 0.0}, {"o", false, h, h + r, 1.0},
      {"gate/up", false, 2 * i, h + 2 * r, 0.0},     {"down", false, h, i + r, 1.0},
      {"q/k/v", true, 2 * h + kv + 3 * r, h, 0.0},   {"o", true, h + r, h, 0.0},
      {"gate/up", true, 2 * i + 2 * r, h, 0.0},      {"down", true, h + r, i, 0.0}};
  double aten_total = 0, best_total = 0;
  for (const Shape& s : shapes) {
    const at::Tensor w = at::randn({s.out, s.in}, opt);
    // forward: y [t, out] (+)= x [t, in] W^T;  backward: dx [t, in] = dy [t, out] W
    const at::Tensor a = at::randn({t, s.backward ? s.out : s.in}, opt);
    const at::Tensor b = s.backward ? w : w.t();
    const at::Tensor out = at::randn({t, s.backward ? s.in : s.out}, opt);
    const auto timings = tuner.TimeCandidates(out, a, b, s.beta);
    if (timings.empty()) continue;
    const double flop = 2.0 * t * s.out * s.in;
    const double aten = AtenMilliseconds(timings);
    const auto& best = timings.front();
    aten_total += aten;
    best_total += best.milliseconds;
    std::printf("%-8s %-8s beta=%.0f  aten %.3f ms %.0f TFLOP/s  best %.3f ms %.0f TFLOP/s "
                "(%+.1f%%) %s, %zu timed\n",
                s.name, s.backward ? "backward" : "forward", s.beta, aten, flop / aten / 1e9,
                best.milliseconds, flop / best.milliseconds / 1e9,
                100.0 * (aten / best.milliseconds - 1), best.algorithm.c_str(), timings.size());
    PrintSteady(timings, flop);
    PrintRunnersUp(timings);
  }
  // The adapters' weight gradients dA = dh'^T x [r, in] over K = t tokens (r: q/k/v's three
  // adapters side by side, gate/up's two, one), where split-K candidates come in (thin outputs).
  // dh' either contiguous or, as the step has it, in the spare columns after a gradient's rows
  // (gate/up's packed gradients, row stride 22,080), and then x in rows with spare columns too
  // (row stride in + 64: the widened GEMMs' inputs).
  for (const int64_t r : {16, 32, 48}) {
    for (const int64_t in : {h, i}) {
      for (const bool strided : {false, true}) {
        const at::Tensor dha = strided ? at::randn({t, 22080}, opt).narrow(1, 22016, r)
                                       : at::randn({t, r}, opt);
        const at::Tensor x = strided ? at::randn({t, in + 64}, opt).narrow(1, 0, in)
                                     : at::randn({t, in}, opt);
        const at::Tensor out = at::empty({r, in}, opt);
        const auto timings = tuner.TimeCandidates(out, dha.t(), x, 0.0);
        if (timings.empty()) continue;
        const double aten = AtenMilliseconds(timings);
        const auto& best = timings.front();
        aten_total += aten;
        best_total += best.milliseconds;
        const double bytes = 2.0 * t * (in + r);
        std::printf(
            "dA r=%-3lld in=%-6lld %s aten %.3f ms %.0f GB/s  best %.3f ms %.0f GB/s (%+.1f%%) %s, "
            "%zu timed\n",
            static_cast<long long>(r), static_cast<long long>(in), strided ? "strided" : "packed ",
            aten, bytes / aten / 1e6, best.milliseconds, bytes / best.milliseconds / 1e6,
            100.0 * (aten / best.milliseconds - 1), best.algorithm.c_str(), timings.size());
        PrintRunnersUp(timings);
      }
    }
  }
  std::printf("total: aten %.3f ms, best %.3f ms (%+.1f%%)\n", aten_total, best_total,
              100.0 * (aten_total / best_total - 1));
  return 0;
}
