// Gradient-norm clipping arithmetic of torch.nn.utils.clip_grad_norm_: gradients are multiplied
// by min(1, max_norm / (total_norm + 1e-6)). The strategies compute the global norm across
// partitions and apply the coefficient.
#pragma once

namespace qlora::optim {

// 1 when max_norm <= 0 (clipping off).
double ClipCoefficient(double total_norm, double max_norm);

}  // namespace qlora::optim
