// cuBLASLt GEMMs with the fastest algorithm per shape, timed once against ATen's own call.
//
// Row-major out [m, n] = a [m, k] @ b [k, n] is, column-major, out^T [n, m] = b^T [n, k] @ a^T
// [k, m]: cuBLASLt's A is b's storage and its B is a's, each with N or T by which stride is 1.
#include "kernels/tuned_gemm_cublaslt.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace qlora::kernels::cublaslt {
namespace {

void Check(cublasStatus_t status, const char* what) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, " failed: status ",
              static_cast<int>(status));
}

// A matrix as cuBLASLt reads it: stored column-major [rows, cols] with leading dimension ld,
// used as is (N) or transposed (T).
struct Operand {
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t rows = 0, cols = 0, ld = 0;
};

// The column-major operand whose op() is the transpose of row-major `t` [r, c] (so [c, r]), or
// nothing when t's strides are not those of a contiguous matrix or its transpose.
std::optional<Operand> TransposedOperand(const at::Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1), s0 = t.stride(0), s1 = t.stride(1);
  if (s1 == 1 && s0 >= std::max<int64_t>(c, 1)) return Operand{CUBLAS_OP_N, c, r, s0};
  if (s0 == 1 && s1 >= std::max<int64_t>(r, 1)) return Operand{CUBLAS_OP_T, r, c, s1};
  return std::nullopt;
}

bool Aligned16(const at::Tensor& t, int64_t ld) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && (ld * t.element_size()) % 16 == 0;
}

// A call's exact shape: device, dtype, m, n, k, the operations, leading dimensions, beta == 0.
using ShapeKey = std::tuple<int, int, int64_t, int64_t, int64_t, int, int, int64_t, int64_t,
                            int64_t, bool>;
// What a tuning decides for: device, dtype, the operations, beta == 0, and the size class of m,
// n and k (SizeClass). Rows that vary from step to step (packed or padded batches) fall in a few
// octaves, so they are tuned a few times, not every step.
using TuningKey = std::tuple<int, int, int, int, bool, int, int, int>;

// The octave (floor of log2) of a side of 64 or more; a smaller side is a class of its own. The
// small sides are the adapters' ranks (16, and 32 or 48 for a grouped layer's): in one octave the
// q/k/v As' gradient [48, in] ran the kernel tuned for gate/up's [32, in] or the other way round
// (at 7B one of the two then ran much slower than the other), for a few more tunings at a job's
// start.
int SizeClass(int64_t v) {
  if (v < 64) return 64 + static_cast<int>(v);  // octaves are 0..62
  int o = 0;
  while ((int64_t{2} << o) <= v) ++o;
  return o;
}

// The algorithm a tuning chose for its key (none: ATen's call was the fastest), and cuBLASLt's
// own first pick (for calls with C apart from D, which ATen's call would first copy into D).
struct Choice {
  std::optional<cublasLtMatmulAlgo_t> algorithm;
  std::optional<cublasLtMatmulAlgo_t> heuristic;
};

// What one exact shape runs: its descriptors and the tuned algorithm where cuBLASLt accepts it
// for this shape (none: ATen's call); with C apart from D, that algorithm or else cuBLASLt's
// first pick (none: ATen's call, which copies C into D first).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t x = nullptr, y = nullptr, d = nullptr;
  std::optional<cublasLtMatmulAlgo_t> algorithm;
  std::optional<cublasLtMatmulAlgo_t> separate_c;
};

void Destroy(Plan& plan) {
  cublasLtMatrixLayoutDestroy(plan.x);
  cublasLtMatrixLayoutDestroy(plan.y);
  cublasLtMatrixLayoutDestroy(plan.d);
  cublasLtMatmulDescDestroy(plan.desc);
}

std::string Describe(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    int32_t v = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
    return v;
  };
  return "algo=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) +
         " tile=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) +
         " stages=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID)) +
         " swizzle=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) +
         " custom=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION)) +
         " cluster=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) & 0xffff) +
         " splitk=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) +
         " reduction=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
}

int32_t SplitK(const cublasLtMatmulAlgo_t& algo) {
  int32_t v = 1;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v, sizeof(v),
                                       &written);
  return v;
}

uint32_t ReductionScheme(const cublasLtMatmulAlgo_t& algo) {
  uint32_t v = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &v,
                                       sizeof(v), &written);
  return v;
}

// The configuration attributes that tell two configurations of one algorithm apart.
std::vector<int32_t> ConfigOf(const cublasLtMatmulAlgo_t& algo) {
  std::vector<int32_t> config;
  for (auto attr : {CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID,
                    CUBLASLT_ALGO_CONFIG_STAGES_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                    CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
                    CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID}) {
    int32_t v = 0;  // the 16-bit ids land in the low bytes (little-endian)
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
    config.push_back(v);
  }
  return config;
}

}  // namespace

class AlgorithmCache {
 public:
  explicit AlgorithmCache(const GemmTunerOptions& options) : options_(options) {}
  ~AlgorithmCache() {
    for (auto& [key, plan] : plans_) Destroy(plan);
  }

  int64_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(choices_.size());
  }

  bool Addmm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double beta,
             double alpha, const at::Tensor& c) {
    Call call;
    if (!Prepare(out, a, b, beta, &call)) return false;
    if (c.defined() && (c.device() != out.device() || c.scalar_type() != out.scalar_type() ||
                        c.sizes() != out.sizes() || c.strides() != out.strides() ||
                        !Aligned16(c, call.ldo))) {
      return false;
    }
    call.c = c;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(call.key);
    if (it != plans_.end()) return RunPlan(call, it->second, out, beta, alpha);
    Plan plan = MakePlan(call);
    auto choice = choices_.find(call.tuning);
    if (choice == choices_.end()) {
      if (static_cast<int64_t>(choices_.size()) >= options_.max_shapes) {
        Destroy(plan);
        return false;
      }
      const std::vector<cublasLtMatmulAlgo_t> candidates = Candidates(call, plan);
      Choice chosen;
      const int index = Choose(Time(call, plan, candidates, out));
      if (index >= 0) chosen.algorithm = candidates[index];
      if (!candidates.empty()) chosen.heuristic = candidates[0];
      choice = choices_.emplace(call.tuning, chosen).first;
    }
    if (choice->second.algorithm) plan.algorithm = Accepted(plan, *choice->second.algorithm);
    plan.separate_c = plan.algorithm;
    if (!plan.separate_c && choice->second.heuristic) {
      plan.separate_c = Accepted(plan, *choice->second.heuristic);
    }
    const bool ran = RunPlan(call, plan, out, beta, alpha);
    // Exact shapes are remembered up to a bound (descriptors are small, but rows that vary every
    // step would make them many); past it each call builds its plan and drops it.
    if (static_cast<int64_t>(plans_.size()) < kMaxPlans) {
      plans_.emplace(call.key, plan);
    } else {
      Destroy(plan);
    }
    return ran;
  }

  std::optional<std::vector<GemmCandidateTiming>> TimeCandidates(const at::Tensor& out,
                                                                 const at::Tensor& a,
                                                                 const at::Tensor& b,
                                                                 double beta) {
    Call call;
    if (!Prepare(out, a, b, beta, &call)) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    Plan plan = MakePlan(call);
    const std::vector<cublasLtMatmulAlgo_t> candidates = Candidates(call, plan);
    std::vector<GemmCandidateTiming> result;
    for (const Timing& t : Time(call, plan, candidates, out)) {
      std::string name = "aten";
      if (t.index >= 0) {
        const std::optional<size_t> workspace = Workspace(plan, candidates[t.index]);
        name = Describe(candidates[t.index]) +
               " workspace=" + (workspace ? std::to_string(*workspace) : "rejected");
      }
      result.push_back({name, t.ms, t.steady_ms});
    }
    Destroy(plan);
    return result;
  }

 private:
  struct Call {
    at::Tensor a, b;
    at::Tensor c;  // C apart from D (out's layout), or undefined: C is out
    Operand x, y;  // cuBLASLt's A (b's storage) and B (a's storage)
    int64_t m = 0, n = 0, k = 0, ldo = 0;
    cudaDataType_t type = CUDA_R_16BF;
    ShapeKey key;
    TuningKey tuning;
  };
  struct Timing {
    int index = -1;  // into the candidates; -1 is ATen's call
    double ms = 0;
    double steady_ms = 0;  // 0: not timed in steady state
    // What ranks it: the steady-state time where there is one (those rank first), else ms.
    bool operator<(const Timing& o) const {
      if ((steady_ms > 0) != (o.steady_ms > 0)) return steady_ms > 0;
      return steady_ms > 0 ? steady_ms < o.steady_ms : ms < o.ms;
    }
    double Score() const { return steady_ms > 0 ? steady_ms : ms; }
  };

  static bool Prepare(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                      double beta, Call* call) {
    if (!out.is_cuda() || out.dim() != 2 || a.dim() != 2 || b.dim() != 2) return false;
    const auto dtype = out.scalar_type();
    if ((dtype != at::kBFloat16 && dtype != at::kHalf) || a.scalar_type() != dtype ||
        b.scalar_type() != dtype || a.device() != out.device() || b.device() != out.device()) {
      return false;
    }
    call->m = out.size(0);
    call->n = out.size(1);
    call->k = a.size(1);
    if (call->m == 0 || call->n == 0 || call->k == 0 || a.size(0) != call->m ||
        b.size(0) != call->k || b.size(1) != call->n || out.stride(1) != 1 ||
        out.stride(0) < call->n) {
      return false;
    }
    auto x = TransposedOperand(b), y = TransposedOperand(a);
    if (!x || !y) return false;
    call->ldo = out.stride(0);
    if (!Aligned16(out, call->ldo) || !Aligned16(b, x->ld) || !Aligned16(a, y->ld)) return false;
    call->a = a;
    call->b = b;
    call->x = *x;
    call->y = *y;
    call->type = dtype == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
    call->key = ShapeKey(out.get_device(), static_cast<int>(dtype), call->m, call->n, call->k,
                         static_cast<int>(x->op), static_cast<int>(y->op), x->ld, y->ld,
                         call->ldo, beta == 0);
    call->tuning = TuningKey(out.get_device(), static_cast<int>(dtype), static_cast<int>(x->op),
                             static_cast<int>(y->op), beta == 0, SizeClass(call->m),
                             SizeClass(call->n), SizeClass(call->k));
    return true;
  }

  // The workspace bytes cuBLASLt says `algo` needs for the plan's shape; none where it rejects
  // the algorithm for it.
  std::optional<size_t> Workspace(const Plan& plan, const cublasLtMatmulAlgo_t& algo) const {
    cublasLtMatmulHeuristicResult_t result{};
    if (cublasLtMatmulAlgoCheck(at::cuda::getCurrentCUDABlasLtHandle(), plan.desc, plan.x, plan.y,
                                plan.d, plan.d, &algo, &result) != CUBLAS_STATUS_SUCCESS) {
      return std::nullopt;
    }
    return result.workspaceSize;
  }

  // `algo` (chosen for another shape of the same key) where cuBLASLt accepts it for this exact
  // shape within the workspace.
  std::optional<cublasLtMatmulAlgo_t> Accepted(const Plan& plan,
                                               const cublasLtMatmulAlgo_t& algo) const {
    const std::optional<size_t> workspace = Workspace(plan, algo);
    if (!workspace || *workspace > WorkspaceBytes()) return std::nullopt;
    return algo;
  }

  // Runs the call with the plan's algorithm for it; false: ATen's call is the caller's to run.
  bool RunPlan(const Call& call, const Plan& plan, const at::Tensor& out, double beta,
               double alpha) const {
    const std::optional<cublasLtMatmulAlgo_t>& algo =
        call.c.defined() ? plan.separate_c : plan.algorithm;
    if (!algo) return false;
    Run(call, plan, *algo, out, beta, alpha);
    return true;
  }

  // The workspace the algorithms may use: ATen's cuBLASLt workspace of the current stream
  // (already there for ATen's own calls; no allocation per call), within the options' bound.
  size_t WorkspaceBytes() const {
    return std::min(static_cast<size_t>(options_.workspace_bytes),
                    at::cuda::getCUDABlasLtWorkspaceSize());
  }

  static Plan MakePlan(const Call& c) {
    Plan plan;
    Check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    Check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &c.x.op,
                                         sizeof(c.x.op)), "transa");
    Check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &c.y.op,
                                         sizeof(c.y.op)), "transb");
    Check(cublasLtMatrixLayoutCreate(&plan.x, c.type, c.x.rows, c.x.cols, c.x.ld), "layout");
    Check(cublasLtMatrixLayoutCreate(&plan.y, c.type, c.y.rows, c.y.cols, c.y.ld), "layout");
    Check(cublasLtMatrixLayoutCreate(&plan.d, c.type, c.n, c.m, c.ldo), "layout");
    return plan;
  }

  // Whether a configuration may run the call: one that splits K only for a thin output (a side
  // of at most options_.split_k_max_output_side: the adapters' weight gradients, [r, in] summed
  // over all tokens, which kernels that do not split K run on a few dozen blocks) and only with
  // its parts summed in float32 in the workspace (the compute type: no rounding to the output's
  // dtype between parts), in a fixed order.
  bool Admissible(const Call& c, const cublasLtMatmulAlgo_t& algo) const {
    if (SplitK(algo) <= 1) return true;
    return std::min(c.m, c.n) <= options_.split_k_max_output_side &&
           ReductionScheme(algo) == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  }

  // cuBLASLt's heuristic candidates for the plan's shape that are Admissible, then (up to
  // options_.variants) their variants (AppendVariants).
  std::vector<cublasLtMatmulAlgo_t> Candidates(const Call& c, const Plan& plan) const {
    cublasLtMatmulPreference_t pref = nullptr;
    Check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t ws = WorkspaceBytes();
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    std::vector<cublasLtMatmulHeuristicResult_t> results(std::max(options_.candidates, 1));
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        at::cuda::getCurrentCUDABlasLtHandle(), plan.desc, plan.x, plan.y, plan.d, plan.d, pref,
        static_cast<int>(results.size()), results.data(), &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    std::vector<cublasLtMatmulAlgo_t> candidates;
    if (status != CUBLAS_STATUS_SUCCESS) return candidates;
    for (int i = 0; i < returned; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS || !Admissible(c, results[i].algo)) continue;
      candidates.push_back(results[i].algo);
    }
    if (options_.variants > 0) AppendVariants(c, plan, &candidates);
    return candidates;
  }

  // The heuristic's configurations with every custom option and CTA swizzling their algorithm
  // accepts for this shape (cuBLASLt's heuristic offers one custom option per tile, not always
  // the fastest: another option of one of its tiles was a little faster for the 7B projections,
  // bench/reports/kernels_h200_2026-12-01_04.md), new ones appended.
  void AppendVariants(const Call& c, const Plan& plan,
                      std::vector<cublasLtMatmulAlgo_t>* out) const {
    const cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
    const size_t ws = WorkspaceBytes();
    const size_t limit = out->size() + static_cast<size_t>(options_.variants);
    std::set<std::vector<int32_t>> seen;
    for (const cublasLtMatmulAlgo_t& algo : *out) seen.insert(ConfigOf(algo));
    const std::vector<cublasLtMatmulAlgo_t> offered = *out;
    for (const cublasLtMatmulAlgo_t& base : offered) {
      int32_t custom_max = 0;
      uint32_t swizzle_support = 0;
      size_t written = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max,
                                        sizeof(custom_max), &written);
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT,
                                        &swizzle_support, sizeof(swizzle_support), &written);
      for (uint32_t custom = 0; custom <= static_cast<uint32_t>(std::max(custom_max, 0)); ++custom) {
        for (uint32_t swizzle = 0; swizzle <= (swizzle_support ? 1u : 0u); ++swizzle) {
          if (out->size() >= limit) return;
          cublasLtMatmulAlgo_t config = base;
          cublasLtMatmulAlgoConfigSetAttribute(&config, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom,
                                               sizeof(custom));
          cublasLtMatmulAlgoConfigSetAttribute(&config, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                               &swizzle, sizeof(swizzle));
          cublasLtMatmulHeuristicResult_t result{};
          if (!seen.insert(ConfigOf(config)).second ||
              cublasLtMatmulAlgoCheck(handle, plan.desc, plan.x, plan.y, plan.d, plan.d, &config,
                                      &result) != CUBLAS_STATUS_SUCCESS ||
              result.workspaceSize > ws || !Admissible(c, config)) {
            continue;
          }
          out->push_back(config);
        }
      }
    }
  }

  // out = beta * C + alpha * (a @ b) with `algo` (C: c.c, or out), on the current stream and
  // ATen's workspace.
  cublasStatus_t Matmul(const Call& c, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                        const at::Tensor& out, double beta, double alpha) const {
    const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
    const void* c_data = c.c.defined() ? c.c.data_ptr() : out.data_ptr();
    return cublasLtMatmul(at::cuda::getCurrentCUDABlasLtHandle(), plan.desc, &alpha_f,
                          c.b.data_ptr(), plan.x, c.a.data_ptr(), plan.y, &beta_f,
                          c_data, plan.d, out.data_ptr(), plan.d, &algo,
                          at::cuda::getCUDABlasLtWorkspace(), WorkspaceBytes(),
                          at::cuda::getCurrentCUDAStream());
  }

  void Run(const Call& c, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
           const at::Tensor& out, double beta, double alpha) const {
    Check(Matmul(c, plan, algo, out, beta, alpha), "matmul");
  }

  // ATen's call and every candidate, each the median of three batches of timing_repetitions
  // runs, on scratch memory of out's layout taken straight from the driver: outside the caching
  // allocator, so the tuning moves neither its statistics nor its pools (the peaks the memory
  // plan is checked against). Fastest first; empty when the scratch memory is not there.
  // A training step holds the GPU at its power limit, with the SM clock well under its maximum
  // (bench/reports/kernels_h200_2026-12-01_04.md, "The power limit"), and which kernel is
  // fastest there is not always the one that is fastest on a cool GPU. So
  // ATen's call first runs back to back for heat_ms, and the batches go round the candidates
  // (every candidate's first batch, then every second, then every third) rather than one
  // candidate after another, so that each is timed in the same thermal state as the others.
  std::vector<Timing> Time(const Call& c, const Plan& plan,
                           const std::vector<cublasLtMatmulAlgo_t>& cands,
                           const at::Tensor& out) const {
    const c10::cuda::CUDAGuard guard(out.device());
    const int64_t out_bytes = (out.stride(0) * (out.size(0) - 1) + out.size(1)) * out.element_size();
    void* memory = nullptr;
    if (cudaMalloc(&memory, static_cast<size_t>(out_bytes)) != cudaSuccess) {
      cudaGetLastError();  // clear the error: the shape stays on ATen's call
      return {};
    }
    at::Tensor scratch = at::from_blob(memory, out.sizes(), out.strides(), out.options()).zero_();
    const double beta = std::get<10>(c.key) ? 0.0 : 1.0;
    const auto stream = at::cuda::getCurrentCUDAStream();
    const int reps = std::max(options_.timing_repetitions, 1);
    cudaEvent_t start, end;
    cudaEventCreate(&start);
    cudaEventCreate(&end);
    auto batch = [&](auto&& fn, int runs) {
      cudaEventRecord(start, stream);
      for (int i = 0; i < runs; ++i) fn();
      cudaEventRecord(end, stream);
      cudaEventSynchronize(end);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, end);
      return static_cast<double>(ms);
    };
    // The contenders: ATen's call (index -1), then the candidates that run this call.
    std::vector<std::pair<int, std::function<void()>>> contenders;
    contenders.emplace_back(-1, [&] { at::addmm_out(scratch, scratch, c.a, c.b, beta, 1.0); });
    for (size_t i = 0; i < cands.size(); ++i) {
      auto run = [&, i] { return Matmul(c, plan, cands[i], scratch, beta, 1.0); };
      if (run() != CUBLAS_STATUS_SUCCESS) continue;  // offered, but cannot run this call
      contenders.emplace_back(static_cast<int>(i), [run] { run(); });
    }
    contenders[0].second();  // warm-up (the candidates ran once above)
    for (double heated = 0; heated < options_.heat_ms;) {
      heated += batch(contenders[0].second, std::max(reps, 4));
    }
    // With more candidates than finalists, a first round of one batch each keeps ATen's call
    // and the fastest finalists for the three rounds that decide.
    const size_t finalists = static_cast<size_t>(std::max(options_.finalists, 1));
    if (contenders.size() > finalists + 1) {
      std::vector<std::pair<double, size_t>> first;
      for (size_t k = 1; k < contenders.size(); ++k) {
        first.emplace_back(batch(contenders[k].second, reps), k);
      }
      std::stable_sort(first.begin(), first.end());
      std::vector<std::pair<int, std::function<void()>>> kept = {contenders[0]};
      for (size_t f = 0; f < finalists; ++f) kept.push_back(contenders[first[f].second]);
      contenders = std::move(kept);
    }
    std::vector<std::vector<double>> batches(contenders.size());
    for (int round = 0; round < 3; ++round) {
      for (size_t k = 0; k < contenders.size(); ++k) {
        batches[k].push_back(batch(contenders[k].second, reps) / reps);
      }
    }
    std::vector<Timing> timings;
    for (size_t k = 0; k < contenders.size(); ++k) {
      std::sort(batches[k].begin(), batches[k].end());
      timings.push_back({contenders[k].first, batches[k][1]});
    }
    std::vector<size_t> order(timings.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t l, size_t r) { return timings[l].ms < timings[r].ms; });
    if (options_.steady_ms > 0 && !order.empty() &&
        timings[order[0]].ms >= options_.steady_min_call_ms) {
      // The finalists (and ATen's call, contender 0) in steady state: each runs back to back
      // for steady_ms, twice in turns; the second half of each run is timed and the two averaged.
      std::vector<size_t> steady = {0};
      for (size_t k : order) {
        if (static_cast<int>(steady.size()) > options_.steady_finalists) break;
        if (k != 0) steady.push_back(k);
      }
      cudaEvent_t half;
      cudaEventCreate(&half);
      std::vector<double> sum(timings.size(), 0.0);
      for (int round = 0; round < 2; ++round) {
        for (size_t k : steady) {
          const int calls = std::max(4, static_cast<int>(options_.steady_ms / timings[k].ms));
          for (int i = 0; i < calls - calls / 2; ++i) contenders[k].second();
          cudaEventRecord(half, stream);
          for (int i = 0; i < calls / 2; ++i) contenders[k].second();
          cudaEventRecord(end, stream);
          cudaEventSynchronize(end);
          float ms = 0;
          cudaEventElapsedTime(&ms, half, end);
          sum[k] += static_cast<double>(ms) / (calls / 2);
        }
      }
      cudaEventDestroy(half);
      for (size_t k : steady) timings[k].steady_ms = sum[k] / 2;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(end);
    cudaStreamSynchronize(stream);
    cudaFree(memory);
    std::stable_sort(timings.begin(), timings.end());
    return timings;
  }

  // The candidate a shape keeps (-1: ATen's call): the fastest, if it beats ATen's call by the
  // margin (noise would otherwise make the choice, and so the last bits, differ between runs).
  static int Choose(const std::vector<Timing>& timings) {
    constexpr double kMargin = 0.015;
    double aten = 0;
    for (const Timing& t : timings) {
      if (t.index < 0) aten = t.Score();
    }
    if (timings.empty() || aten <= 0 || timings.front().Score() > aten * (1 - kMargin)) return -1;
    return timings.front().index;
  }

  static constexpr int64_t kMaxPlans = 4096;

  GemmTunerOptions options_;
  mutable std::mutex mu_;
  std::map<TuningKey, Choice> choices_;
  std::map<ShapeKey, Plan> plans_;
};

std::shared_ptr<AlgorithmCache> NewAlgorithmCache(const GemmTunerOptions& options) {
  return std::make_shared<AlgorithmCache>(options);
}

int64_t CachedShapes(const AlgorithmCache& cache) { return cache.size(); }

bool Addmm(AlgorithmCache& cache, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
           double beta, double alpha, const at::Tensor& c) {
  return cache.Addmm(out, a, b, beta, alpha, c);
}

std::optional<std::vector<GemmCandidateTiming>> TimeCandidates(AlgorithmCache& cache,
                                                               const at::Tensor& out,
                                                               const at::Tensor& a,
                                                               const at::Tensor& b, double beta) {
  return cache.TimeCandidates(out, a, b, beta);
}

}  // namespace qlora::kernels::cublaslt
