// Cross-entropy over rows of logits with its gradient in the same pass: the loss step of a
// fused linear + cross-entropy (the caller runs the GEMMs), as Liger's fused linear cross-entropy
// does, so that no float32 logits are made and backward never recomputes them.
//
//   loss_i = logsumexp(z_i) - z_i[t_i]                    (0 where t_i == ignore_index)
//   grad_i = (softmax(z_i) - onehot(t_i)) * grad_scale   (0 where t_i == ignore_index)
//
// z_i: row i of the logits taken to float32 (exactly what `logits.to(kFloat)` holds); the loss is
// float32, the gradient rounded once to the logits' dtype and written over them. CPU (and any
// tensor the CUDA kernel does not take): ATen ops, the oracle of tests/kernels/cross_entropy_test.
// CUDA: one block per row, the row read twice (the second read from L2) and written once.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  // Whether to overwrite the logits with the gradient; when false they are left unchanged.
  bool write_gradient = true;
  double grad_scale = 1.0;  // multiplies the gradient before its rounding
};

// logits [n, vocab] (float32, float16 or bfloat16; rows contiguous), targets [n] int64 on the
// same device. Returns the per-row losses [n] in float32.
at::Tensor CrossEntropyWithGradient(at::Tensor& logits, const at::Tensor& targets,
                                    const CrossEntropyOptions& options = {});

}  // namespace qlora::kernels
