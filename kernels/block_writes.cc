// Entry points of block_writes.h: the checks, then one CUDA launch where the build has the
// kernels, else ATen ops block by block.
#include "kernels/block_writes.h"

#include <ATen/ATen.h>

#ifdef QLORA_HAVE_CUDA
#include "kernels/block_writes_backend.h"
#endif

namespace qlora::kernels {
namespace {

void CheckBlock(const BlockWrite& w, const at::Tensor& first) {
  const at::Tensor& out = w.out;
  TORCH_CHECK(out.defined() && out.dim() == 2 && (out.size(1) == 0 || out.stride(1) == 1),
              "WriteBlocks: a block must be [rows, cols] with unit column stride");
  TORCH_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == at::kHalf ||
                  out.scalar_type() == at::kBFloat16,
              "WriteBlocks: blocks of float32, float16 or bfloat16, not ", out.scalar_type());
  TORCH_CHECK(out.device() == first.device() && out.scalar_type() == first.scalar_type(),
              "WriteBlocks: every block on one device in one dtype");
  if (!w.source.defined()) return;
  const at::Tensor& s = w.source;
  TORCH_CHECK(s.sizes() == out.sizes() && s.device() == out.device() &&
                  (s.size(1) == 0 || s.stride(1) == 1),
              "WriteBlocks: a source must match its block ", out.sizes(), " on ", out.device(),
              " with unit column stride, got ", s.sizes(), " on ", s.device());
  TORCH_CHECK(s.scalar_type() == at::kFloat || (s.scalar_type() == out.scalar_type() && w.scale == 1.0),
              "WriteBlocks: a source is float32 (scaled) or the block's dtype (copied, scale 1), "
              "got ", s.scalar_type(), " scale ", w.scale, " for a ", out.scalar_type(), " block");
}

}  // namespace

void WriteBlocks(const std::vector<BlockWrite>& writes) {
  if (writes.empty()) return;
  const at::Tensor& first = writes[0].out;
  for (const BlockWrite& w : writes) CheckBlock(w, first);
#ifdef QLORA_HAVE_CUDA
  if (first.is_cuda() && cuda::WriteBlocks(writes)) return;
#endif
  for (const BlockWrite& w : writes) {
    at::Tensor out = w.out;
    if (out.numel() == 0) continue;
    if (!w.source.defined()) {
      out.zero_();
    } else if (w.source.scalar_type() == out.scalar_type() && w.scale == 1.0) {
      out.copy_(w.source);
    } else {
      // A CPU 0-dim factor: the product is formed in float32 and rounded once into the block.
      at::mul_out(out, w.source, at::scalar_tensor(w.scale, at::kDouble));
    }
  }
}

}  // namespace qlora::kernels
