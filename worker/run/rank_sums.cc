// SumOverRanks (see rank_sums.h).
#include "worker/run/rank_sums.h"

#include <ATen/ATen.h>

#include "common/status_macros.h"

namespace qlora::worker {

absl::StatusOr<std::vector<double>> SumOverRanks(comm::Communicator& comm,
                                                 const std::vector<double>& values,
                                                 const at::Device& device) {
  // One rank's sum is its own values: no device round trip, which would wait for every kernel
  // queued so far (at a step's end, the GPU would idle while the host catches up).
  if (comm.world_size() == 1) return values;
  at::Tensor t = at::tensor(at::ArrayRef<double>(values), at::TensorOptions().dtype(at::kDouble)).to(device);
  QLORA_RETURN_IF_ERROR(comm.AllReduceSum(t, absl::Minutes(5)));
  t = t.cpu();
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = t[i].item<double>();
  return out;
}

}  // namespace qlora::worker
