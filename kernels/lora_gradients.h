// The two rank-r products of a LoRA layer's backward that read its output gradient g [T, out]:
//
//   dh' = scale * g B              [T, r]     (B [out, r]: the adapter's up projection)
//   dB  = scale * g^T (h A^T)      [out, r]   (ha = h A^T [T, r], saved by forward)
//
// As two GEMMs each reads all of g (for a 7B layer at micro-batch 4 ~680 MB of gradients, twice).
// CUDA: one kernel reads each tile of g once and feeds both products from it on the tensor cores
// (float32 sums of fixed order: the same bits every run), then a small kernel adds the per-chunk
// partial sums and rounds once, as a GEMM's epilogue does; a grouped layer's adapters (q/k/v,
// gate/up) go in one launch of each (LoraGradientPairs). At rank 16 only by default: above it the
// kernel is slower than the GEMMs. CPU (and any tensor the kernel does not take,
// LoraGradientPairFused): the two GEMMs as ATen ops, the oracle of
// tests/kernels/lora_gradients_test.cc.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

struct LoraGradientPairOptions {
  // The CUDA kernel's grid: about this many blocks an SM (more hide memory latency better, but
  // each block's chunk of rows adds a partial dB of out x r float32 values to write and add).
  int blocks_per_sm = 2;
  // Rows of the kernel's 16 KB tiles of g: 32 (x 256 columns: longer pieces of each row a tile;
  // r 16 and 32 only, others take 64) or 64 (x 128). 32 was faster at the 7B shapes
  // (bench/reports/kernels_h200_2026-12-01_04.md, "The LoRA gradient pair kernel").
  int tile_rows = 32;
  // The kernel runs for ranks up to this (it takes 16, 32, 48 and 64); higher ranks get the two
  // GEMMs. Its work per byte of g grows with r and it does not keep up: at the 7B shapes it beats
  // the GEMMs at r 16 and falls behind them from 32 on, the more the higher r
  // (bench/reports/kernels_h200_2026-12-01_04.md, "The LoRA gradient pair kernel").
  int64_t max_rank = 16;
};

// Whether LoraGradientPair runs the one-pass CUDA kernel for these tensors: CUDA, float16 or
// bfloat16 throughout, r a multiple of 16 up to options.max_rank (and 64), out a multiple of 8,
// unit column strides, row strides multiples of 8 values and 16-byte aligned rows for g and ha.
bool LoraGradientPairFused(const at::Tensor& g, const at::Tensor& b, const at::Tensor& ha,
                           const at::Tensor& dha, const at::Tensor& db,
                           const LoraGradientPairOptions& options = {});

// Writes dha [T, r] and db [out, r] (g's dtype; either may be rows of a wider buffer) for
// g [T, out], b [out, r], ha [T, r].
void LoraGradientPair(const at::Tensor& g, const at::Tensor& b, const at::Tensor& ha, double scale,
                      const at::Tensor& dha, const at::Tensor& db,
                      const LoraGradientPairOptions& options = {});

// One adapter's tensors for LoraGradientPairs, as LoraGradientPair takes them.
//
// Optionally (both or neither) dha_scaled [T, r] (dha's dtype, unit column stride) is written
// too: dh' with each row times row_scale (float32 [T], contiguous), the product of dh''s rounded
// values formed in float32 and rounded once, as at::mul_out(dha_scaled, dha, row_scale[:, None])
// makes it. The norm's rstd on the q/k/v and gate/up nodes' dh' (worker/engine GroupBackward,
// the As' gradient taken from the norm's source): the kernel's reduction writes it with dh', no
// launch and pass of its own.
struct LoraGradientPairOperands {
  at::Tensor g, b, ha;
  double scale = 1.0;
  at::Tensor dha, db;
  at::Tensor row_scale, dha_scaled;
};

// The adapters LoraGradientPairs runs in one launch at most.
inline constexpr int kMaxLoraGradientPairs = 4;

// Whether LoraGradientPairs runs these adapters in one launch: 2 to kMaxLoraGradientPairs of
// them, each LoraGradientPairFused, of one rank, one T and one dtype.
bool LoraGradientPairsFused(const std::vector<LoraGradientPairOperands>& pairs,
                            const LoraGradientPairOptions& options = {});

// LoraGradientPair for each of a grouped layer's adapters (q/k/v, gate/up). Where
// LoraGradientPairsFused, one launch over all of their column chunks (and one reduction): the
// grid fills the GPU with fewer row chunks, so fewer partial dB sums are written and added, and
// n - 1 launches of each kernel go. dh' has the bits of separate calls (its partial sums are
// per column chunk); dB may differ from them in the last bit (grouped by other row chunks),
// the same bits on every run.
void LoraGradientPairs(const std::vector<LoraGradientPairOperands>& pairs,
                       const LoraGradientPairOptions& options = {});

}  // namespace qlora::kernels
