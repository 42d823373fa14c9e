// GlooCommunicator: each collective maps to Gloo's options-style API (allreduce, reduce,
// allgather, broadcast, barrier) with an explicit timeout; reduce-scatter with per-rank counts is
// one gloo::reduce per owner (DeepSpeed's reduce_scatter=true path does the same with dist.reduce).
// A timeout keeps back a grace period to ask the LivenessBoard who never entered the collective.
#include "worker/comm/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/reduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "worker/comm/gloo_store.h"
#include "worker/comm/collective_failure.h"
#include "worker/comm/liveness.h"

namespace qlora::comm {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Calls fn(T{}) with T the C++ type of `type`; false when the dtype is not supported.
template <typename Fn>
bool DispatchDtype(at::ScalarType type, Fn&& fn) {
  switch (type) {
    case at::kFloat: fn(float{}); return true;
    case at::kDouble: fn(double{}); return true;
    case at::kLong: fn(int64_t{}); return true;
    default: return false;
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const GlooOptions& options, std::shared_ptr<gloo::Context> context,
                   LivenessBoard board)
      : options_(options), context_(std::move(context)), board_(std::move(board)) {}

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  absl::Status AllReduceSum(const at::Tensor& tensor, absl::Duration timeout) override {
    QLORA_RETURN_IF_ERROR(Check("all_reduce", tensor));
    return Run("all_reduce", tensor, timeout, [&](absl::Time deadline) {
      if (tensor.numel() == 0) return;
      DispatchDtype(tensor.scalar_type(), [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput<T>(tensor.data_ptr<T>(), tensor.numel());
        opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<T>));
        opts.setTag(next_tag_++);
        opts.setTimeout(Remaining(deadline));
        gloo::allreduce(opts);
      });
    });
  }

  absl::Status ReduceScatterSum(const at::Tensor& input, const at::Tensor& output,
                                absl::Span<const int64_t> counts,
                                absl::Duration timeout) override {
    QLORA_RETURN_IF_ERROR(Check("reduce_scatter", input));
    QLORA_RETURN_IF_ERROR(Check("reduce_scatter", output));
    if (static_cast<int>(counts.size()) != world_size() ||
        std::accumulate(counts.begin(), counts.end(), int64_t{0}) != input.numel() ||
        counts[rank()] != output.numel() || input.scalar_type() != output.scalar_type()) {
      return Invalid("reduce_scatter", "counts must have one entry per rank, sum to the input's "
                                       "size and give this rank's output size");
    }
    const int64_t largest = *std::max_element(counts.begin(), counts.end());
    at::Tensor scratch = at::empty({largest}, input.options());
    return Run("reduce_scatter", input, timeout, [&](absl::Time deadline) {
      DispatchDtype(input.scalar_type(), [&](auto zero) {
        using T = decltype(zero);
        int64_t offset = 0;
        for (int root = 0; root < world_size(); ++root) {
          const int64_t n = counts[root];
          if (n > 0) {
            gloo::ReduceOptions opts(context_);
            opts.setInput<T>(input.data_ptr<T>() + offset, n);
            opts.setOutput<T>(root == rank() ? output.data_ptr<T>() : scratch.data_ptr<T>(), n);
            opts.setRoot(root);
            opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<T>));
            opts.setTag(next_tag_++);
            opts.setTimeout(Remaining(deadline));
            gloo::reduce(opts);
          }
          offset += n;
        }
      });
    });
  }

  absl::Status AllGather(const at::Tensor& input, const at::Tensor& output,
                         absl::Duration timeout) override {
    QLORA_RETURN_IF_ERROR(Check("all_gather", input));
    QLORA_RETURN_IF_ERROR(Check("all_gather", output));
    if (output.numel() != input.numel() * world_size() ||
        input.scalar_type() != output.scalar_type()) {
      return Invalid("all_gather", "output must hold world_size x input elements of its dtype");
    }
    return Run("all_gather", input, timeout, [&](absl::Time deadline) {
      if (input.numel() == 0) return;
      DispatchDtype(input.scalar_type(), [&](auto zero) {
        using T = decltype(zero);
        gloo::AllgatherOptions opts(context_);
        opts.setInput<T>(input.data_ptr<T>(), input.numel());
        opts.setOutput<T>(output.data_ptr<T>(), output.numel());
        opts.setTag(next_tag_++);
        opts.setTimeout(Remaining(deadline));
        gloo::allgather(opts);
      });
    });
  }

  absl::Status Broadcast(const at::Tensor& tensor, int root, absl::Duration timeout) override {
    QLORA_RETURN_IF_ERROR(Check("broadcast", tensor));
    if (root < 0 || root >= world_size()) return Invalid("broadcast", "root out of range");
    return Run("broadcast", tensor, timeout, [&](absl::Time deadline) {
      if (tensor.numel() == 0) return;
      DispatchDtype(tensor.scalar_type(), [&](auto zero) {
        using T = decltype(zero);
        gloo::BroadcastOptions opts(context_);
        opts.setOutput<T>(tensor.data_ptr<T>(), tensor.numel());
        opts.setRoot(root);
        opts.setTag(next_tag_++);
        opts.setTimeout(Remaining(deadline));
        gloo::broadcast(opts);
      });
    });
  }

  absl::Status Barrier(absl::Duration timeout) override {
    return Run("barrier", at::Tensor(), timeout, [&](absl::Time deadline) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag_++);
      opts.setTimeout(Remaining(deadline));
      gloo::barrier(opts);
    });
  }

 private:
  static std::chrono::milliseconds Remaining(absl::Time deadline) {
    return ToMillis(deadline - absl::Now());
  }

  std::string Where(const char* op) const {
    return absl::StrCat("gloo rank ", rank(), " of ", world_size(), ": ", op);
  }

  absl::Status Invalid(const char* op, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(op), ": ", why));
  }

  absl::Status Check(const char* op, const at::Tensor& t) const {
    if (!t.defined() || !t.is_cpu() || !t.is_contiguous() || t.is_sparse()) {
      return Invalid(op, "tensor must be a defined, dense, contiguous CPU tensor");
    }
    if (!DispatchDtype(t.scalar_type(), [](auto) {})) {
      return Invalid(op, absl::StrCat("unsupported dtype ", c10::toString(t.scalar_type())));
    }
    return absl::OkStatus();
  }

  // Runs one collective: `body` issues the Gloo calls, which throw on failure or timeout.
  absl::Status Run(const char* op, const at::Tensor& tensor, absl::Duration timeout,
                   const std::function<void(absl::Time)>& body) {
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(op), ": communicator is broken by an earlier failure: ", broken_.message()));
    }
    const uint64_t seq = seq_++;
    const absl::Duration grace = std::min(timeout / 4, options_.liveness_grace);
    try {
      body(absl::Now() + timeout - grace);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      const std::vector<int> absent = board_.RanksAbsentFrom(absl::StrCat("op/", seq), grace);
      const std::string what = e.what();
      const bool timed_out = what.find("Timed out") != std::string::npos ||
                             what.find("timed out") != std::string::npos;
      broken_ = CollectiveFailureStatus({Where(op), seq, tensor, timed_out, timeout, absent,
                                         absl::StrCat("gloo: ", what)});
      return broken_;
    }
  }

  GlooOptions options_;
  std::shared_ptr<gloo::Context> context_;
  LivenessBoard board_;
  absl::Status broken_;
  uint64_t seq_ = 0;
  uint32_t next_tag_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const GlooOptions& options, std::shared_ptr<RendezvousStore> store) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo: rank ", options.rank,
                                                   " is not in a world of ", options.world_size));
  }
  if (store == nullptr || options.prefix.empty()) {
    return absl::InvalidArgumentError("gloo: a rendezvous store and a prefix are required");
  }
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  LivenessBoard board(store, options.prefix, options.rank, options.world_size);
  QLORA_RETURN_IF_ERROR(board.Join(options.connect_timeout));
  try {
    gloo::transport::tcp::attr attr;
    if (options.iface.empty()) {
      attr.hostname = options.hostname;
    } else {
      attr.iface = options.iface;
    }
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    const std::chrono::milliseconds left = ToMillis(deadline - absl::Now());
    context->setTimeout(left);
    GlooStoreAdapter adapter(*store, options.prefix, left);
    context->connectFullMesh(adapter, device);
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(options, std::move(context), std::move(board)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous '", options.prefix, "' rank ",
                                               options.rank, " of ", options.world_size,
                                               ": connecting the mesh failed: ", e.what()));
  }
}

}  // namespace qlora::comm
