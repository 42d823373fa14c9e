// Activation offloading: the tensors a decoder layer saves for backward wait in pinned host
// memory instead of device memory, so the layer needs neither their memory nor a recomputation.
//
// Between a layer's forward and its backward there is the rest of forward and the backward of
// every layer above it; at sequence 2048 a layer's saved activations cross PCIe (both ways, on
// copy engines beside the compute) in less time than that. So a layer that would be
// checkpointed for lack of memory can instead be offloaded: its frozen GEMMs, attention and
// elementwise work run once instead of twice, for PCIe traffic.
//
// How: the autograd functions of this engine save through SaveForBackward /
// SavedForBackward below. While an OffloadScope is open on the calling thread (the model opens
// one around an offloaded layer's forward) SaveForBackward hands each activation (not the
// parameters, not tensors under `min_bytes`) to the ActivationOffloader, which copies its
// storage to pinned host memory on a side stream once the compute stream has produced it, and
// lets the device copy go when the transfer is done. The host runs ahead of the GPU and sees a
// transfer done late, so at forward's peak most layers' copies would still hold device memory:
// when a layer (group g) first saves, the compute stream waits for the transfers of groups up to
// g - `max_layers_pending` and their device copies go at once (the compute stream's later work,
// which may reuse that memory, runs after the copies). At most `max_pending_bytes` wait in all;
// beyond that the host waits for the oldest transfer. A storage saved twice while alive (the
// attention output and the o_proj input that views it) travels once. As with autograd's own saves, a
// saved tensor must not be written in place before backward (the copy may still be reading it). Prefetch(group) starts the copies back on a
// second side stream into memory allocated on the compute stream; SavedForBackward makes the
// compute stream wait for them. The model calls Prefetch a few layers ahead of backward (a hook
// on a higher layer's output), so the copies overlap the layers above.
//
// Values are bit-for-bit those a device save keeps. On a CPU model "offloading" copies into
// fresh host memory synchronously (what the tests use to check the plumbing). Thread-safe; the
// offloader must outlive the graphs whose saves it holds. Clear() drops what a forward left
// without a backward.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/engine/pinned_block_pool.h"

namespace qlora::engine {

struct ActivationOffloadOptions {
  int64_t min_bytes = 1 << 20;                 // smaller tensors stay on the device
  int64_t max_pending_bytes = int64_t{2} << 30;  // device bytes waiting for their transfer
  // Groups (layers) whose transfers may still hold device memory when the next one saves (0: no
  // bound): two, the checkpoint inputs the memory plan counts in transit
  // (worker/memory/activation_plan.cc; it counts one offloaded layer's tensors, which the
  // placement spreads apart). A checkpointed layer's input crosses the link in a fraction of a
  // layer's forward.
  int64_t max_layers_pending = 2;
  // Groups a layer spans: group g is layer g / groups_per_layer (LlamaForCausalLM gives each
  // layer a late and an early group).
  int64_t groups_per_layer = 1;
  // Where a CUDA model's host copies go (null: a pool of its own over cudaHostAlloc). A block
  // goes back to it once the copies into and out of it are done.
  std::shared_ptr<PinnedBlockPool> host_blocks;
};

class ActivationOffloader {
 public:
  ActivationOffloader(at::Device device, ActivationOffloadOptions options = {});
  ~ActivationOffloader();
  ActivationOffloader(const ActivationOffloader&) = delete;
  ActivationOffloader& operator=(const ActivationOffloader&) = delete;

  // Whether `t` would be offloaded: defined, on this device, not a parameter (a leaf that
  // requires grad), at least min_bytes, and at least a third of its storage.
  bool Offloadable(const at::Tensor& t) const;
  // Starts moving `t` to host memory under `group` (a decoder layer); returns its ticket.
  int64_t Offload(const at::Tensor& t, int64_t group);
  // Starts bringing `group`'s tensors back (no-op for tensors already back or unknown groups).
  void Prefetch(int64_t group);
  // The ticket's tensor on the device, ready for the compute stream; each ticket once.
  at::Tensor Restore(int64_t ticket);
  // Lets go of tickets not restored (a node whose backward never ran: called when the node dies).
  void Forget(const std::vector<int64_t>& tickets);
  // Forgets every ticket not restored yet.
  void Clear();

  // Bytes of pinned host memory held now (tests, logs), in all or of one group.
  int64_t host_bytes() const;
  int64_t host_bytes_of(int64_t group) const;
  // Bytes copied to the host since construction (a storage shared by two saves counts once).
  int64_t offloaded_bytes() const;
  // Device bytes held for transfers the host has not yet seen finish (tests).
  int64_t pending_bytes() const;
  // Storages Restore had to fetch itself, no Prefetch having started their copy back (tests:
  // backward's prefetches should leave none).
  int64_t demand_fetches() const;

 private:
  struct Entry;
  struct Ticket;
  struct Streams;

  void ReleaseFinishedLocked();
  // Makes the compute stream wait for the transfers of the groups of layers at or below
  // `group`'s layer - max_layers_pending and lets their device copies go.
  void ReleaseLayersBelowLocked(int64_t group);
  void FetchLocked(Entry& entry);
  // The entry's last ticket is done: drop it (the device copy stays alive while a restored view
  // of it does); its host block waits in retiring_ until its copies are done.
  void DropEntryLocked(const std::shared_ptr<Entry>& entry);
  void RetireLocked(const std::shared_ptr<Entry>& entry);

  const at::Device device_;
  const ActivationOffloadOptions options_;
  std::unique_ptr<Streams> streams_;  // null on a CPU model
  mutable std::mutex mu_;
  int64_t next_ = 0;
  std::map<int64_t, std::shared_ptr<Entry>> entries_;  // by entry id
  std::map<int64_t, Ticket> tickets_;
  std::map<const void*, std::shared_ptr<Entry>> by_storage_;  // by storage, while it lives
  std::vector<std::shared_ptr<Entry>> retiring_;  // dropped, a copy maybe still using the block
  std::shared_ptr<PinnedBlockPool> host_blocks_;  // null on a CPU model
  int64_t pending_bytes_ = 0;
  int64_t offloaded_bytes_ = 0;
  int64_t demand_fetches_ = 0;
};

// Offloads what the engine's autograd functions save on this thread while alive (nestable; the
// innermost wins). `offloader` null: a no-op scope.
class OffloadScope {
 public:
  // The nodes saved meanwhile share ownership of `offloader` (their tickets are released when
  // they die).
  OffloadScope(std::shared_ptr<ActivationOffloader> offloader, int64_t group);
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;

 private:
  std::shared_ptr<ActivationOffloader> previous_;
  int64_t previous_group_;
};

// ctx->save_for_backward(tensors), offloading the activations among them inside an
// OffloadScope. Undefined tensors are fine.
void SaveForBackward(torch::autograd::AutogradContext* ctx,
                     const torch::autograd::variable_list& tensors);
// ctx->get_saved_variables() with the offloaded ones restored.
torch::autograd::variable_list SavedForBackward(torch::autograd::AutogradContext* ctx);

}  // namespace qlora::engine
