// Internal: the cuBLASLt side of tuned_gemm.h (compiled only with QLORA_HAVE_CUDA). A cache of
// the fastest algorithm per GEMM shape; Addmm returns false, touching nothing, for calls it does
// not take (the caller then runs at::addmm_out).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/tuned_gemm.h"

namespace qlora::kernels::cublaslt {

class AlgorithmCache;

// shared_ptr: its deleter is made where the type is complete.
std::shared_ptr<AlgorithmCache> NewAlgorithmCache(const GemmTunerOptions& options);
int64_t CachedShapes(const AlgorithmCache& cache);

// c: undefined (C is out) or a tensor of out's shape and strides (C apart from D); false for
// any other c.
bool Addmm(AlgorithmCache& cache, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
           double beta, double alpha, const at::Tensor& c);
std::optional<std::vector<GemmCandidateTiming>> TimeCandidates(AlgorithmCache& cache,
                                                               const at::Tensor& out,
                                                               const at::Tensor& a,
                                                               const at::Tensor& b, double beta);

}  // namespace qlora::kernels::cublaslt
