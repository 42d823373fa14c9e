// BaseWeightStore: partitioned and streamed (host memory) frozen base weights (base_weight_store.h).
#include "worker/engine/base_weight_store.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_format.h"

#ifdef QLORA_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace qlora::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

#ifdef QLORA_HAVE_CUDA
struct BaseWeightStore::Streams {
  c10::cuda::CUDAStream to_device;
};
#else
struct BaseWeightStore::Streams {};
#endif

// A layer made whole (or on its way): its bytes on the device, and the copy the compute stream
// must wait for before reading them.
struct BaseWeightStore::Fetched {
  int64_t index = -1;
  at::Tensor bytes;
  bool ahead = false;
#ifdef QLORA_HAVE_CUDA
  c10::cuda::CUDAEvent copied;
#endif
};

BaseWeightStore::BaseWeightStore(BaseWeightStoreOptions options)
    : options_(std::move(options)) {
  TORCH_CHECK(options_.world_size >= 1 && options_.rank >= 0 &&
                  options_.rank < options_.world_size,
              "base weight store: rank ", options_.rank, " of ", options_.world_size);
  TORCH_CHECK(options_.world_size == 1 || options_.all_gather,
              "base weight store: partitioned over ", options_.world_size,
              " ranks without an all-gather");
#ifdef QLORA_HAVE_CUDA
  if (options_.on_host && options_.device.is_cuda()) {
    streams_ = std::make_unique<Streams>(
        Streams{c10::cuda::getStreamFromPool(false, options_.device.index())});
    if (options_.pin_memory) {
      host_blocks_ = std::make_unique<PinnedBlockPool>(
          PinnedHostSource(), "offload_param (base weights in host memory)");
    }
  }
#endif
}

BaseWeightStore::~BaseWeightStore() {
#ifdef QLORA_HAVE_CUDA
  // A prefetch's copy may still read a host shard, whose block goes back as the shards go.
  if (streams_ != nullptr) streams_->to_device.synchronize();
#endif
}

void BaseWeightStore::Take(int64_t index, DecoderLayer& layer) {
  TORCH_CHECK(index >= 0, "base weight store: no layer ", index);
  const int world = options_.world_size;
  PackedLayer packed = PackLayerWeights(layer, int64_t{8} * world);
  const int64_t per_rank = packed.layout.nbytes / world;
  at::Tensor mine = world == 1 ? packed.bytes
                               : packed.bytes.narrow(0, options_.rank * per_rank, per_rank).clone();
  packed.bytes = at::Tensor();
  if (options_.on_host && !mine.device().is_cpu()) {
    at::Tensor host = host_blocks_ != nullptr && mine.is_cuda()
                          ? host_blocks_->Allocate(per_rank)
                          : at::empty({per_rank}, at::dtype(at::kByte));
    host.copy_(mine);
    mine = std::move(host);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (index >= static_cast<int64_t>(shards_.size())) {
    layouts_.resize(index + 1);
    shards_.resize(index + 1);
  }
  layouts_[index] = std::move(packed.layout);
  shards_[index] = std::move(mine);
  StripLayerWeights(layer);
}

std::shared_ptr<BaseWeightStore::Fetched> BaseWeightStore::FetchLocked(int64_t index, bool ahead) {
  // Its copies and gathers, for the profile's attribution (bench/attribute_profile.py).
  RECORD_FUNCTION("qlora::base_weights", std::vector<c10::IValue>());
  const at::Tensor& shard = shards_[index];
  TORCH_CHECK(shard.defined(), "base weight store: layer ", index, " was never loaded");
  const auto start = std::chrono::steady_clock::now();
  auto fetched = std::make_shared<Fetched>();
  fetched->index = index;
  fetched->ahead = ahead;
  at::Tensor local = shard;
  if (shard.device() != options_.device) {
    stats_.copied_bytes += shard.numel();
#ifdef QLORA_HAVE_CUDA
    if (streams_ != nullptr) {
      // Allocated in the compute stream's order; the copy waits for the compute stream's work so
      // far (whatever used this memory before) and the memory is not reused before the copy is
      // done, even if the layer is dropped unread.
      const c10::cuda::CUDAStream compute =
          c10::cuda::getCurrentCUDAStream(options_.device.index());
      local = at::empty({shard.numel()}, at::dtype(at::kByte).device(options_.device));
      c10::cuda::CUDAEvent allocated;
      allocated.record(compute);
      allocated.block(streams_->to_device);
      {
        c10::cuda::CUDAStreamGuard guard(streams_->to_device);
        local.copy_(shard, /*non_blocking=*/true);
      }
      c10::cuda::CUDACachingAllocator::recordStream(local.storage().data_ptr(),
                                                    streams_->to_device);
      fetched->copied.record(streams_->to_device);
    } else {
      local = shard.to(options_.device);
    }
#else
    local = shard.to(options_.device);
#endif
  }
  if (options_.world_size == 1) {
    fetched->bytes = std::move(local);
  } else {
    ReadyLocked(*fetched);  // the gather reads the copied shard on the compute stream
    at::Tensor full = at::empty({local.numel() * options_.world_size}, local.options());
    const absl::Status gathered = options_.all_gather(local.view(at::kLong), full.view(at::kLong));
    TORCH_CHECK(gathered.ok(), "gathering layer ", index, "'s base weights: ",
                std::string(gathered.message()));
    stats_.gathered_bytes += local.numel() * (options_.world_size - 1);
    fetched->bytes = std::move(full);
    stats_.waited_seconds += SecondsSince(start);
  }
  ++stats_.fetches;
  if (ahead) ++stats_.prefetched;
  return fetched;
}

void BaseWeightStore::ReadyLocked(Fetched& fetched) {
#ifdef QLORA_HAVE_CUDA
  if (fetched.copied.isCreated()) {
    fetched.copied.block(c10::cuda::getCurrentCUDAStream(options_.device.index()));
  }
#else
  (void)fetched;
#endif
}

std::shared_ptr<const DecoderLayer> BaseWeightStore::Whole(int64_t index,
                                                           const DecoderLayer& skeleton) {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(shards_.size()),
              "base weight store: no layer ", index);
  std::shared_ptr<Fetched> fetched;
  if (current_ != nullptr && current_->index == index) {
    fetched = current_;
  } else if (ahead_ != nullptr && ahead_->index == index) {
    fetched = ahead_;
  } else {
    const auto start = std::chrono::steady_clock::now();
    fetched = FetchLocked(index, /*ahead=*/false);
    if (options_.world_size == 1) stats_.waited_seconds += SecondsSince(start);
  }
  ReadyLocked(*fetched);
  if (fetched != current_) {
    current_ = fetched;
    ahead_.reset();  // asked for or passed over
  }
  return std::make_shared<const DecoderLayer>(
      UnpackLayerWeights(skeleton, layouts_[index], fetched->bytes));
}

void BaseWeightStore::Prefetch(int64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= static_cast<int64_t>(shards_.size())) return;
  if ((current_ != nullptr && current_->index == index) ||
      (ahead_ != nullptr && ahead_->index == index)) {
    return;
  }
  ahead_ = FetchLocked(index, /*ahead=*/true);
}

BaseWeightStats BaseWeightStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t BaseWeightStore::device_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const at::Tensor& shard : shards_) {
    if (shard.defined() && shard.device() == options_.device && !options_.on_host) {
      total += shard.numel();
    }
  }
  return total;
}

int64_t BaseWeightStore::host_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const at::Tensor& shard : shards_) {
    if (shard.defined() && options_.on_host) total += shard.numel();
  }
  return total;
}

int64_t BaseWeightStore::largest_layer_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t most = 0;
  for (const LayerByteLayout& layout : layouts_) most = std::max(most, layout.nbytes);
  return most;
}

std::string BaseWeightStore::Describe() const {
  const int64_t device = device_bytes(), host = host_bytes(), layer = largest_layer_bytes();
  const int world = options_.world_size;
  return absl::StrFormat(
      "base weights: %s, %s%s; %.1f MiB on the device, %.1f MiB in host memory; a layer "
      "made whole is %.1f MiB",
      world > 1 ? absl::StrFormat("partitioned over %d ranks (each keeps 1/%d of every layer)",
                                  world, world)
                : std::string("whole on this rank"),
      options_.on_host ? "kept in host memory and copied to the device a layer ahead of use"
                       : "kept on the device",
      options_.on_host && options_.device.is_cuda() && !options_.pin_memory
          ? " (not pinned: copies are synchronous)"
          : "",
      device / 1048576.0, host / 1048576.0, layer / 1048576.0);
}

}  // namespace qlora::engine
