// ClipCoefficient: torch's clip_coef, clamped to 1.
#include "worker/optim/clip.h"

#include <algorithm>

namespace qlora::optim {

double ClipCoefficient(double total_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace qlora::optim
