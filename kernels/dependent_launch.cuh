// Kernel launches that overlap the previous kernel's end (programmatic dependent launch, sm_90):
// where a kernel launched here follows one that allows it (ours all do, in BeginDependentKernel;
// library kernels may), its blocks are launched while that one's last blocks run and wait at
// their start until it has finished and its writes are visible, instead of the GPU launching it
// only once the first is done (a bubble between dependent kernels, which adds up over a step's
// thousands of kernels). After a copy or a kernel that does not allow it, the launch is an
// ordinary one.
//
// Every kernel launched by LaunchDependent must call BeginDependentKernel before it reads or
// writes global memory (first thing, in every block), so that it never runs ahead of what came
// before it in the stream. Built only where every CUDA architecture of the build is sm_90 or
// later (QLORA_DEPENDENT_LAUNCH, cmake/Dependencies.cmake); elsewhere both are ordinary.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include <c10/cuda/CUDAException.h>

#ifndef QLORA_DEPENDENT_LAUNCH
#define QLORA_DEPENDENT_LAUNCH 0
#endif
#if QLORA_DEPENDENT_LAUNCH && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "QLORA_DEPENDENT_LAUNCH needs every CUDA architecture of the build to be sm_90 or later"
#endif

namespace qlora::kernels::cuda {

// The first statement of a kernel launched by LaunchDependent. Two things: waits for the
// kernels before this one in the stream (and their writes), then releases the next kernel, whose
// blocks may launch once every block of this one has passed here.
__device__ __forceinline__ void BeginDependentKernel() {
#if QLORA_DEPENDENT_LAUNCH && defined(__CUDA_ARCH__)
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
  config.numAttrs = QLORA_DEPENDENT_LAUNCH ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace qlora::kernels::cuda
