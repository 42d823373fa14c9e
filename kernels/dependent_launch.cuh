// Kernel launches that overlap the previous kernel's end (programmatic dependent launch, sm_90):
// where two of these kernels follow each other in a stream, the second's blocks are launched
// while the first's last ones run, and wait at their start until the first has finished and its
// writes are visible, instead of the GPU launching the second only once the first is done (the
// ~1.5 us bubble between dependent kernels, round 27's 7B profile). After any other kind of
// kernel, or a copy, the launch is an ordinary one: the driver overlaps only a kernel that asks
// for it (AwaitPrecedingGrids' trigger).
//
// Every kernel launched by LaunchDependent must call AwaitPrecedingGrids before it reads or
// writes global memory (first thing, in every block), so that it never runs ahead of what came
// before it in the stream.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include <c10/cuda/CUDAException.h>

namespace qlora::kernels::cuda {

// Waits for the kernels before this one in the stream (and their writes), then lets the next
// one's blocks launch once every block of this one has started. Nothing on GPUs before sm_90,
// where LaunchDependent's launches are ordinary ones.
__device__ __forceinline__ void AwaitPrecedingGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to overlap the end of the
// kernel before it.
template <typename... Params, typename... Args>
void LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                     cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace qlora::kernels::cuda
