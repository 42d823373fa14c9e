// Internal: the CUDA side of block_writes.h (compiled only with QLORA_HAVE_CUDA).
#pragma once

#include <vector>

#include "kernels/block_writes.h"

namespace qlora::kernels::cuda {

// The blocks (checked by the caller: one CUDA device and floating dtype) in one launch. False,
// writing nothing, where the dtype is not one the kernel takes.
bool WriteBlocks(const std::vector<BlockWrite>& writes);

}  // namespace qlora::kernels::cuda
