// BaseWeightStore: the decoder layers' frozen base weights when they do not all sit whole on the
// device: partitioned across ranks (ZeRO stage 3), in host memory (offload_param), or both.
//
// Each layer's weights are one byte buffer (layer_bytes.h: the 4-bit codes, block scales and
// nested state, never a dequantized copy) cut into world_size equal shards; a rank keeps its
// own, on the device or in pinned host memory. Whole(i) makes layer i whole on the device: the
// shard copied from the host (on a side stream, overlapping the compute stream's work) and
// all-gathered from the other ranks. The store keeps the layer last asked for and the one
// prefetched after it; every other gathered layer lives only as long as something reading it
// (a layer's autograd graph keeps what its backward reads), so a checkpointed layer is gathered
// again for its recomputation and released after its backward.
//
// Which layer comes next is the model's to say (Prefetch): it knows the order of forward and of
// the recomputations in backward. Embeddings, norms, biases and lm_head never come here: they
// stay whole on every rank (at 70B, 1 GB of 36; gathering them twice a step would cost more).
//
// Collective when partitioned: every rank calls Whole and Prefetch in the same order, which the
// model's fixed order of layers gives. Failures throw c10::Error (the forward's error path).
// Thread-safe (forward runs on the caller's thread, a CUDA backward on autograd's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "worker/engine/layer_bytes.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/pinned_block_pool.h"

namespace qlora::engine {

struct BaseWeightStoreOptions {
  at::Device device = at::kCPU;  // where layers are used
  int rank = 0;
  int world_size = 1;  // 1: every layer whole on this rank
  // All-gathers every rank's `shard` (uint8 [n], n a multiple of 8) into `full` (uint8
  // [world_size n], rank r's shard at [r n, (r + 1) n)). A collective; needed when world_size > 1.
  std::function<absl::Status(const at::Tensor& shard, const at::Tensor& full)> all_gather;
  // Shards in host memory, copied to the device when used (offload_param: {device: cpu}).
  bool on_host = false;
  bool pin_memory = true;  // pinned host memory (asynchronous copies) on a CUDA device
};

struct BaseWeightStats {
  int64_t fetches = 0;         // layers made whole
  int64_t prefetched = 0;      // of which were started before they were asked for
  int64_t gathered_bytes = 0;  // received from other ranks
  int64_t copied_bytes = 0;    // copied from host memory to the device
  double waited_seconds = 0;   // host time blocked fetching a layer that was not prefetched,
                               // or in a gather
};

class BaseWeightStore {
 public:
  explicit BaseWeightStore(BaseWeightStoreOptions options);
  ~BaseWeightStore();
  BaseWeightStore(const BaseWeightStore&) = delete;
  BaseWeightStore& operator=(const BaseWeightStore&) = delete;

  // Keeps this rank's shard of `layer`'s frozen weights and takes them out of it (the loader
  // calls it as each layer arrives, so no rank ever holds more than one layer whole).
  void Take(int64_t index, DecoderLayer& layer);

  // `skeleton` (layer `index` as Take left it) with its weights whole on the device.
  std::shared_ptr<const DecoderLayer> Whole(int64_t index, const DecoderLayer& skeleton);
  // Starts making layer `index` whole, for a Whole(index) to come (out of range: no-op).
  void Prefetch(int64_t index);

  int world_size() const { return options_.world_size; }
  bool on_host() const { return options_.on_host; }
  BaseWeightStats stats() const;
  // Bytes of the shards kept, on the device and in host memory.
  int64_t device_bytes() const;
  int64_t host_bytes() const;
  // Bytes of the largest layer made whole (what one gathered layer costs on the device).
  int64_t largest_layer_bytes() const;
  // One line for the job log: where the weights live and what a step moves.
  std::string Describe() const;

 private:
  struct Fetched;
  std::shared_ptr<Fetched> FetchLocked(int64_t index, bool ahead);
  void ReadyLocked(Fetched& fetched);

  BaseWeightStoreOptions options_;
  std::vector<LayerByteLayout> layouts_;
  std::vector<at::Tensor> shards_;
  struct Streams;
  std::unique_ptr<Streams> streams_;  // CUDA with host shards: the copy stream
  // CUDA with pinned host shards (pin_memory): blocks within an eighth of a shard (torch's host
  // allocator would take the next power of two: 512 MiB for a 70B layer's 421 MiB).
  std::unique_ptr<PinnedBlockPool> host_blocks_;
  mutable std::mutex mu_;
  std::shared_ptr<Fetched> current_, ahead_;
  BaseWeightStats stats_;
};

}  // namespace qlora::engine
