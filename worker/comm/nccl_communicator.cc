// NcclCommunicator: a non-blocking NCCL communicator. Every call is issued on the current stream
// of the rank's device, then completion is polled (cudaEventQuery + ncclCommGetAsyncError) until
// the deadline; past it the communicator is aborted and the liveness board names absent ranks.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/comm/collective_failure.h"
#include "worker/comm/liveness.h"

namespace qlora::comm {
namespace {

bool ToNcclType(at::ScalarType type, ncclDataType_t* out) {
  switch (type) {
    case at::kFloat: *out = ncclFloat32; return true;
    case at::kDouble: *out = ncclFloat64; return true;
    case at::kLong: *out = ncclInt64; return true;
    case at::kBFloat16: *out = ncclBfloat16; return true;
    case at::kHalf: *out = ncclFloat16; return true;
    default: return false;
  }
}

// Polls the communicator's asynchronous state until it leaves ncclInProgress or `deadline`.
ncclResult_t AwaitComm(ncclComm_t comm, absl::Time deadline) {
  ncclResult_t state = ncclInProgress;
  while (true) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress || absl::Now() >= deadline) return state;
    std::this_thread::yield();
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclOptions& options, ncclComm_t comm, std::unique_ptr<LivenessBoard> board)
      : options_(options), comm_(comm), board_(std::move(board)) {}

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    if (broken_.ok()) {
      ncclCommFinalize(comm_);
      AwaitComm(comm_, absl::Now() + absl::Seconds(10));
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  absl::Status AllReduceSum(const at::Tensor& tensor, absl::Duration timeout) override {
    ncclDataType_t type;
    QLORA_RETURN_IF_ERROR(Check("all_reduce", tensor, &type));
    return Run("all_reduce", tensor, timeout, [&](cudaStream_t stream) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type, ncclSum,
                           comm_, stream);
    });
  }

  absl::Status ReduceScatterSum(const at::Tensor& input, const at::Tensor& output,
                                absl::Span<const int64_t> counts,
                                absl::Duration timeout) override {
    ncclDataType_t type;
    QLORA_RETURN_IF_ERROR(Check("reduce_scatter", input, &type));
    QLORA_RETURN_IF_ERROR(Check("reduce_scatter", output, &type));
    if (static_cast<int>(counts.size()) != world_size() ||
        std::accumulate(counts.begin(), counts.end(), int64_t{0}) != input.numel() ||
        counts[rank()] != output.numel() || input.scalar_type() != output.scalar_type()) {
      return Invalid("reduce_scatter", "counts must have one entry per rank, sum to the input's "
                                       "size and give this rank's output size");
    }
    const bool equal = std::all_of(counts.begin(), counts.end(),
                                   [&](int64_t c) { return c == counts[0]; });
    const int64_t largest = *std::max_element(counts.begin(), counts.end());
    at::Tensor scratch = equal ? at::Tensor() : at::empty({largest}, input.options());
    const size_t element = input.element_size();
    return Run("reduce_scatter", input, timeout, [&](cudaStream_t stream) -> ncclResult_t {
      if (equal) {
        return ncclReduceScatter(input.data_ptr(), output.data_ptr(), counts[0], type, ncclSum,
                                 comm_, stream);
      }
      // Unequal parts: one reduce per owner, fused into one group (DeepSpeed's dist.reduce path).
      ncclResult_t result = ncclGroupStart();
      int64_t offset = 0;
      for (int root = 0; root < world_size() && result == ncclSuccess; ++root) {
        if (counts[root] > 0) {
          void* out = root == rank() ? output.data_ptr() : scratch.data_ptr();
          result = ncclReduce(static_cast<char*>(input.data_ptr()) + offset * element, out,
                              counts[root], type, ncclSum, root, comm_, stream);
        }
        offset += counts[root];
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    });
  }

  absl::Status AllGather(const at::Tensor& input, const at::Tensor& output,
                         absl::Duration timeout) override {
    ncclDataType_t type;
    QLORA_RETURN_IF_ERROR(Check("all_gather", input, &type));
    QLORA_RETURN_IF_ERROR(Check("all_gather", output, &type));
    if (output.numel() != input.numel() * world_size() ||
        input.scalar_type() != output.scalar_type()) {
      return Invalid("all_gather", "output must hold world_size x input elements of its dtype");
    }
    return Run("all_gather", input, timeout, [&](cudaStream_t stream) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), type, comm_,
                           stream);
    });
  }

  absl::Status Broadcast(const at::Tensor& tensor, int root, absl::Duration timeout) override {
    ncclDataType_t type;
    QLORA_RETURN_IF_ERROR(Check("broadcast", tensor, &type));
    if (root < 0 || root >= world_size()) return Invalid("broadcast", "root out of range");
    return Run("broadcast", tensor, timeout, [&](cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type, root,
                           comm_, stream);
    });
  }

  absl::Status Barrier(absl::Duration timeout) override {
    at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(
                                       at::kCUDA, options_.device));
    return Run("barrier", at::Tensor(), timeout, [&](cudaStream_t stream) {
      return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, stream);
    });
  }

 private:
  std::string Where(const char* op) const {
    return absl::StrCat("nccl rank ", rank(), " of ", world_size(), ": ", op);
  }

  absl::Status Invalid(const char* op, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(op), ": ", why));
  }

  absl::Status Check(const char* op, const at::Tensor& t, ncclDataType_t* type) const {
    if (!t.defined() || !t.is_cuda() || !t.is_contiguous() || t.is_sparse() ||
        t.get_device() != options_.device) {
      return Invalid(op, absl::StrCat("tensor must be dense, contiguous and on cuda:",
                                      options_.device));
    }
    if (!ToNcclType(t.scalar_type(), type)) {
      return Invalid(op, absl::StrCat("unsupported dtype ", c10::toString(t.scalar_type())));
    }
    return absl::OkStatus();
  }

  absl::Status Fail(const char* op, uint64_t seq, const at::Tensor& tensor, bool timed_out,
                    absl::Duration timeout, absl::Duration grace, const std::string& detail) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    std::optional<std::vector<int>> absent;  // nullopt: no store to ask
    if (board_ != nullptr) absent = board_->RanksAbsentFrom(absl::StrCat("op/", seq), grace);
    broken_ = CollectiveFailureStatus({Where(op), seq, tensor, timed_out, timeout, absent, detail});
    return broken_;
  }

  absl::Status Run(const char* op, const at::Tensor& tensor, absl::Duration timeout,
                   const std::function<ncclResult_t(cudaStream_t)>& issue) {
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(op), ": communicator is broken by an earlier failure: ", broken_.message()));
    }
    const uint64_t seq = seq_++;
    const absl::Duration grace =
        board_ == nullptr ? absl::ZeroDuration() : std::min(timeout / 4, options_.liveness_grace);
    const absl::Time deadline = absl::Now() + timeout - grace;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(options_.device).stream();
    ncclResult_t issued = issue(stream);
    if (issued == ncclInProgress) issued = AwaitComm(comm_, deadline);
    if (issued != ncclSuccess) {
      return Fail(op, seq, tensor, issued == ncclInProgress, timeout, grace,
                  absl::StrCat("nccl: ", ncclGetErrorString(issued), " ", ncclGetLastError(comm_)));
    }
    cudaEvent_t done;
    if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(done, stream) != cudaSuccess) {
      return Fail(op, seq, tensor, false, timeout, grace, "cuda: event record failed");
    }
    while (true) {
      const cudaError_t query = cudaEventQuery(done);
      if (query == cudaSuccess) break;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const bool late = absl::Now() >= deadline;
      if ((query != cudaErrorNotReady) || (async != ncclSuccess && async != ncclInProgress) ||
          late) {
        cudaEventDestroy(done);
        return Fail(op, seq, tensor, late, timeout, grace,
                    absl::StrCat("cuda: ", cudaGetErrorString(query),
                                 "; nccl: ", ncclGetErrorString(async)));
      }
      std::this_thread::yield();
    }
    cudaEventDestroy(done);
    return absl::OkStatus();
  }

  NcclOptions options_;
  ncclComm_t comm_;
  std::unique_ptr<LivenessBoard> board_;
  absl::Status broken_;
  uint64_t seq_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(const NcclOptions& options) {
  const std::string where =
      absl::StrCat("nccl rank ", options.rank, " of ", options.world_size, ": init");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": rank out of range"));
  }
  if (options.unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unique id has ",
                                                   options.unique_id.size(), " bytes, expected ",
                                                   NCCL_UNIQUE_ID_BYTES));
  }
  if (cudaSetDevice(options.device) != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": no CUDA device ", options.device));
  }
  const absl::Time deadline = absl::Now() + options.init_timeout;
  std::unique_ptr<LivenessBoard> board;
  if (options.store != nullptr) {
    board = std::make_unique<LivenessBoard>(options.store, options.prefix, options.rank,
                                            options.world_size);
    QLORA_RETURN_IF_ERROR(board->Join(options.init_timeout));
  }
  ncclUniqueId id;
  std::memcpy(id.internal, options.unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result =
      ncclCommInitRankConfig(&comm, options.world_size, id, options.rank, &config);
  if (result == ncclInProgress) result = AwaitComm(comm, deadline);
  if (result != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    if (result == ncclInProgress) {
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": not every rank joined within ", absl::FormatDuration(options.init_timeout)));
    }
    return absl::UnavailableError(absl::StrCat(where, ": ", ncclGetErrorString(result)));
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(options, comm, std::move(board)));
}

}  // namespace qlora::comm
