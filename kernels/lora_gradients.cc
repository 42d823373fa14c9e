// Entry points of lora_gradients.h: which tensors the CUDA kernel takes, and the ATen GEMMs
// elsewhere.
#include "kernels/lora_gradients.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "kernels/lora_gradients_backend.h"
#include "kernels/quantize_4bit.h"

namespace qlora::kernels {
namespace {

// A 2-D tensor whose rows the kernel reads or writes in 16-byte pieces.
bool RowsOf16Bytes(const at::Tensor& t) {
  return t.dim() == 2 && t.stride(1) == 1 && t.stride(0) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

}  // namespace

bool LoraGradientPairFused(const at::Tensor& g, const at::Tensor& b, const at::Tensor& ha,
                           const at::Tensor& dha, const at::Tensor& db,
                           const LoraGradientPairOptions& options) {
  if (!g.is_cuda() || !HasCudaKernels() || g.dim() != 2 || b.dim() != 2 || ha.dim() != 2) {
    return false;
  }
  const at::ScalarType dtype = g.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  for (const at::Tensor* t : {&b, &ha, &dha, &db}) {
    if (t->scalar_type() != dtype || t->device() != g.device() || t->dim() != 2 ||
        t->stride(1) != 1) {
      return false;
    }
  }
  const int64_t rows = g.size(0), out = g.size(1), r = b.size(1);
  const int64_t max_rank = std::min<int64_t>(64, options.max_rank);
  return r % 16 == 0 && r >= 16 && r <= max_rank && out % 8 == 0 && rows > 0 && b.size(0) == out &&
         ha.size(0) == rows && ha.size(1) == r && dha.size(0) == rows && dha.size(1) == r &&
         db.size(0) == out && db.size(1) == r && RowsOf16Bytes(g) && RowsOf16Bytes(ha);
}

namespace {

void CheckShapes(const at::Tensor& g, const at::Tensor& b, const at::Tensor& ha,
                 const at::Tensor& dha, const at::Tensor& db) {
  TORCH_CHECK(g.dim() == 2 && b.dim() == 2 && ha.dim() == 2 && b.size(0) == g.size(1) &&
                  ha.size(0) == g.size(0) && ha.size(1) == b.size(1),
              "LoRA gradients: g [T, out], b [out, r] and ha [T, r] expected, got ", g.sizes(),
              ", ", b.sizes(), " and ", ha.sizes());
  TORCH_CHECK(dha.sizes() == ha.sizes() && db.sizes() == b.sizes(),
              "LoRA gradients: dha must be ha's shape and db b's");
}

#ifdef QLORA_HAVE_CUDA
// The kernel's operands. B is read in 16-byte pieces of whole rows: a view elsewhere (an
// adapter copy's slice) gets a copy of its own, r * out values.
cuda::PairOperands KernelOperands(const LoraGradientPairOperands& p) {
  const bool readable = p.b.is_contiguous() && RowsOf16Bytes(p.b);
  return {p.g,   readable ? p.b : p.b.clone(at::MemoryFormat::Contiguous), p.ha,
          static_cast<float>(p.scale), p.dha, p.db, p.row_scale, p.dha_scaled};
}
#endif

}  // namespace

void LoraGradientPair(const at::Tensor& g, const at::Tensor& b, const at::Tensor& ha, double scale,
                      const at::Tensor& dha, const at::Tensor& db,
                      const LoraGradientPairOptions& options) {
  CheckShapes(g, b, ha, dha, db);
  if (LoraGradientPairFused(g, b, ha, dha, db, options)) {
#ifdef QLORA_HAVE_CUDA
    cuda::LoraGradientPairs({KernelOperands({g, b, ha, scale, dha, db})},
                            std::max(1, options.blocks_per_sm), options.tile_rows);
    return;
#endif
  }
  at::Tensor dha_out = dha, db_out = db;
  at::addmm_out(dha_out, dha, g, b, /*beta=*/0.0, scale);
  at::addmm_out(db_out, db, g.t(), ha, /*beta=*/0.0, scale);
}

bool LoraGradientPairsFused(const std::vector<LoraGradientPairOperands>& pairs,
                            const LoraGradientPairOptions& options) {
  if (pairs.size() < 2 || pairs.size() > static_cast<size_t>(kMaxLoraGradientPairs)) return false;
  const LoraGradientPairOperands& first = pairs[0];
  for (const LoraGradientPairOperands& p : pairs) {
    if (!LoraGradientPairFused(p.g, p.b, p.ha, p.dha, p.db, options) ||
        p.b.size(1) != first.b.size(1) || p.g.size(0) != first.g.size(0) ||
        p.g.scalar_type() != first.g.scalar_type() || p.g.device() != first.g.device()) {
      return false;
    }
    if (p.row_scale.defined() &&
        (p.row_scale.scalar_type() != at::kFloat || !p.row_scale.is_contiguous() ||
         p.row_scale.device() != p.g.device() || p.dha_scaled.scalar_type() != p.g.scalar_type() ||
         p.dha_scaled.device() != p.g.device() || p.dha_scaled.dim() != 2 ||
         p.dha_scaled.stride(1) != 1)) {
      return false;
    }
  }
  return true;
}

void LoraGradientPairs(const std::vector<LoraGradientPairOperands>& pairs,
                       const LoraGradientPairOptions& options) {
  for (const LoraGradientPairOperands& p : pairs) {
    CheckShapes(p.g, p.b, p.ha, p.dha, p.db);
    TORCH_CHECK(p.row_scale.defined() == p.dha_scaled.defined(),
                "LoRA gradients: row_scale and dha_scaled go together");
    TORCH_CHECK(!p.row_scale.defined() || (p.row_scale.numel() == p.g.size(0) &&
                                           p.dha_scaled.sizes() == p.dha.sizes()),
                "LoRA gradients: row_scale must be [", p.g.size(0), "] and dha_scaled dha's shape");
  }
  if (LoraGradientPairsFused(pairs, options)) {
#ifdef QLORA_HAVE_CUDA
    std::vector<cuda::PairOperands> operands;
    for (const LoraGradientPairOperands& p : pairs) operands.push_back(KernelOperands(p));
    cuda::LoraGradientPairs(operands, std::max(1, options.blocks_per_sm), options.tile_rows);
    return;
#endif
  }
  for (const LoraGradientPairOperands& p : pairs) {
    LoraGradientPair(p.g, p.b, p.ha, p.scale, p.dha, p.db, options);
    if (p.row_scale.defined()) {
      at::Tensor scaled = p.dha_scaled;
      at::mul_out(scaled, p.dha, p.row_scale.reshape({-1, 1}));
    }
  }
}

}  // namespace qlora::kernels
