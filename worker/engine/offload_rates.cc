// The host link's and the GEMMs' rates on this GPU (offload_rates.h).
#include "worker/engine/offload_rates.h"

#include <algorithm>
#include <chrono>

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/activation_offload.h"

#ifdef QLORA_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace qlora::engine {

#ifdef QLORA_HAVE_CUDA
namespace {

// The measurement itself; throws c10::Error when memory runs out.
memory::OffloadRates Measure(const OffloadRateOptions& o) {
  using Clock = std::chrono::steady_clock;
  const c10::cuda::CUDAGuard guard(o.device);
  c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(o.device.index());
  // Seconds per call of `work`, over `reps` calls after one unmeasured.
  auto time = [&](auto&& work, int reps) {
    work();
    stream.synchronize();
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < reps; ++i) work();
    stream.synchronize();
    return std::chrono::duration<double>(Clock::now() - start).count() / reps;
  };
  memory::OffloadRates rates;
  rates.host_bytes = o.host_bytes;
  rates.max_pending_bytes = ActivationOffloadOptions{}.max_pending_bytes;  // what the model uses
  {
    const at::Tensor host =
        at::empty({o.link_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    const at::Tensor device =
        at::empty({o.link_bytes}, at::TensorOptions().dtype(at::kByte).device(o.device));
    at::Tensor to_host = host, to_device = device;
    const double down = time([&] { to_host.copy_(device, /*non_blocking=*/true); }, 4);
    const double up = time([&] { to_device.copy_(host, /*non_blocking=*/true); }, 4);
    rates.host_link_bytes_per_s = static_cast<double>(o.link_bytes) / std::max(down, up);
  }
  const int64_t rows = std::clamp<int64_t>(o.tokens, 256, 8192);
  const at::TensorOptions options = at::TensorOptions().dtype(o.dtype).device(o.device);
  const at::Tensor x = at::randn({rows, o.model.hidden_size}, options);
  const at::Tensor w = at::randn({o.model.intermediate_size, o.model.hidden_size}, options);
  at::Tensor y = at::empty({rows, o.model.intermediate_size}, options);
  const double once = time([&] { at::mm_out(y, x, w.t()); }, 1);
  // Half of the time heats the GPU to its power limit (where training runs); the rest counts.
  const int reps = std::max(2, static_cast<int>(o.gemm_seconds / 2 / std::max(once, 1e-6)));
  time([&] { at::mm_out(y, x, w.t()); }, reps);
  const double seconds = time([&] { at::mm_out(y, x, w.t()); }, reps);
  rates.gemm_flops_per_s = 2.0 * static_cast<double>(rows) *
                           static_cast<double>(o.model.hidden_size) *
                           static_cast<double>(o.model.intermediate_size) / seconds;
  return rates;
}

}  // namespace
#endif

absl::StatusOr<memory::OffloadRates> MeasureOffloadRates(const OffloadRateOptions& o) {
#ifdef QLORA_HAVE_CUDA
  if (!o.device.is_cuda()) {
    return absl::FailedPreconditionError("offload rates: the model is not on a GPU");
  }
  try {  // out of device or pinned memory: an error to report, not a failed job
    return Measure(o);
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("offload rates: ", e.what_without_backtrace()));
  }
#else
  (void)o;
  return absl::FailedPreconditionError("offload rates: this build has no CUDA");
#endif
}

}  // namespace qlora::engine
