// GemmTuner: cuBLASLt's fastest algorithm per shape where the build has CUDA and the call is a
// half-precision GEMM on a GPU; at::addmm_out everywhere else.
#include "kernels/tuned_gemm.h"

#include <ATen/ATen.h>

#ifdef QLORA_HAVE_CUDA
#include "kernels/tuned_gemm_cublaslt.h"
#endif

namespace qlora::kernels {

struct GemmTuner::Impl {
#ifdef QLORA_HAVE_CUDA
  std::shared_ptr<cublaslt::AlgorithmCache> cache;
#endif
};

GemmTuner::GemmTuner(GemmTunerOptions options) : impl_(std::make_unique<Impl>()) {
#ifdef QLORA_HAVE_CUDA
  impl_->cache = cublaslt::NewAlgorithmCache(options);
#else
  (void)options;
#endif
}

GemmTuner::~GemmTuner() = default;

void GemmTuner::Addmm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                      double beta, double alpha, const at::Tensor& c) {
  TORCH_CHECK(!c.defined() || c.sizes() == out.sizes(), "GemmTuner::Addmm: c must have out's shape, got ",
              c.sizes(), " and ", out.sizes());
#ifdef QLORA_HAVE_CUDA
  if (cublaslt::Addmm(*impl_->cache, out, a, b, beta, alpha, c)) return;
#endif
  at::Tensor o = out;
  at::addmm_out(o, c.defined() ? c : out, a, b, beta, alpha);
}

std::vector<GemmCandidateTiming> GemmTuner::TimeCandidates(const at::Tensor& out,
                                                           const at::Tensor& a,
                                                           const at::Tensor& b, double beta) {
#ifdef QLORA_HAVE_CUDA
  if (auto timings = cublaslt::TimeCandidates(*impl_->cache, out, a, b, beta)) return *timings;
#else
  (void)out, (void)a, (void)b, (void)beta;
#endif
  return {};
}

int64_t GemmTuner::tuned_shapes() const {
#ifdef QLORA_HAVE_CUDA
  return cublaslt::CachedShapes(*impl_->cache);
#else
  return 0;
#endif
}

}  // namespace qlora::kernels
