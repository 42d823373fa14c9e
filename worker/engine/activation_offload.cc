// ActivationOffloader: saved activations in pinned host memory between forward and backward
// (activation_offload.h).
#include "worker/engine/activation_offload.h"

#include <algorithm>
#include <string>
#include <utility>

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

#ifdef QLORA_HAVE_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The scope open on this thread (the autograd analogue: GradMode's thread-local flag).
thread_local std::shared_ptr<ActivationOffloader> current_offloader;
thread_local int64_t current_group = -1;

constexpr const char* kTicketsKey = "qlora.offload_tickets";

// Kept in a node's saved_data: restores its tickets, and lets go of the ones never restored when
// the node dies (a backward that never reached it, or a graph dropped without backward).
struct SavedTickets : torch::CustomClassHolder {
  SavedTickets(std::shared_ptr<ActivationOffloader> offloader, std::vector<int64_t> ids)
      : offloader(std::move(offloader)), ids(std::move(ids)) {}
  ~SavedTickets() override { offloader->Forget(ids); }
  std::shared_ptr<ActivationOffloader> offloader;
  std::vector<int64_t> ids;  // -1: kept by the node itself
};

// The bytes of t's storage as a flat uint8 tensor on t's device (no copy).
at::Tensor StorageBytes(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  return at::empty({0}, t.options().dtype(at::kByte))
      .set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
}

}  // namespace

#ifdef QLORA_HAVE_CUDA
struct ActivationOffloader::Streams {
  c10::cuda::CUDAStream to_host;
  c10::cuda::CUDAStream to_device;
};
#else
struct ActivationOffloader::Streams {};
#endif

// One storage's trip: its bytes on the host, and on the device before the transfer is done
// (`source`) and after Prefetch (`restored`).
struct ActivationOffloader::Entry {
  int64_t id = -1;               // its key in entries_
  const void* key = nullptr;     // its key in by_storage_ (the storage's address)
  int64_t group = -1;
  int64_t nbytes = 0;
  at::Tensor host;      // uint8 [nbytes], pinned on a CUDA model
  at::Tensor source;    // the device bytes, held until the copy to the host is done
  at::Tensor restored;  // uint8 [nbytes] on the device, once fetched
  int64_t open_tickets = 0;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
#ifdef QLORA_HAVE_CUDA
  c10::cuda::CUDAEvent to_host_done;
  c10::cuda::CUDAEvent to_device_done;
#endif
};

// A saved tensor: a view of its entry's storage.
struct ActivationOffloader::Ticket {
  std::shared_ptr<Entry> entry;
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;
};

ActivationOffloader::ActivationOffloader(at::Device device, ActivationOffloadOptions options)
    : device_(device), options_(options) {
#ifdef QLORA_HAVE_CUDA
  if (device_.is_cuda()) {
    streams_ = std::make_unique<Streams>(
        Streams{c10::cuda::getStreamFromPool(false, device_.index()),
                c10::cuda::getStreamFromPool(false, device_.index())});
  }
#endif
  TORCH_CHECK(device_.is_cpu() || streams_, "activation offloading needs a CPU or CUDA model, got ",
              device_.str());
  if (streams_ != nullptr) {
    host_blocks_ = options_.host_blocks != nullptr
                       ? options_.host_blocks
                       : std::make_shared<PinnedBlockPool>(
                             PinnedHostSource(),
                             "activation offload (lower trainer.offload_activation_layers, or "
                             "the job's rows)");
  }
}

ActivationOffloader::~ActivationOffloader() {
#ifdef QLORA_HAVE_CUDA
  // No block goes back to its pool while a copy may still use it.
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : entries_) RetireLocked(e);
  for (const std::shared_ptr<Entry>& e : retiring_) {
    e->to_host_done.synchronize();
    e->to_device_done.synchronize();
  }
#endif
}

bool ActivationOffloader::Offloadable(const at::Tensor& t) const {
  if (!t.defined() || t.device() != device_) return false;
  if (t.is_leaf() && t.requires_grad()) return false;  // a parameter
  // A small view of a big buffer stays (it would move the whole buffer); a third of one goes: the
  // packed q/k/v rows, whose three column blocks attention saves, travel once for all three.
  return static_cast<int64_t>(t.nbytes()) >= options_.min_bytes &&
         t.storage().nbytes() <= 3 * t.nbytes();
}

int64_t ActivationOffloader::Offload(const at::Tensor& t, int64_t group) {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseFinishedLocked();
  const void* key = t.storage().unsafeGetStorageImpl();
  std::shared_ptr<Entry> entry;
  auto found = by_storage_.find(key);
  if (found != by_storage_.end() && found->second->storage.lock().get() == key) {
    entry = found->second;  // the same live storage, saved again: one transfer
  } else {
    entry = std::make_shared<Entry>();
    entry->id = next_++;
    entry->key = key;
    entry->group = group;
    entry->nbytes = static_cast<int64_t>(t.storage().nbytes());
    entry->storage = t.storage().getWeakStorageImpl();
    const at::Tensor bytes = StorageBytes(t);
    if (streams_ == nullptr) {
      entry->host = bytes.clone();
    } else {
#ifdef QLORA_HAVE_CUDA
      ReleaseLayersBelowLocked(group);
      while (pending_bytes_ > 0 && pending_bytes_ + entry->nbytes > options_.max_pending_bytes) {
        // Wait for the oldest transfer still holding device memory.
        for (auto& [id, e] : entries_) {
          if (!e->source.defined()) continue;
          e->to_host_done.synchronize();
          break;
        }
        ReleaseFinishedLocked();
      }
      entry->host = host_blocks_->Allocate(entry->nbytes);
      entry->source = bytes;
      const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
      c10::cuda::CUDAEvent produced;
      produced.record(compute);
      produced.block(streams_->to_host);
      {
        c10::cuda::CUDAStreamGuard guard(streams_->to_host);
        entry->host.copy_(bytes, /*non_blocking=*/true);
      }
      entry->to_host_done.record(streams_->to_host);
      pending_bytes_ += entry->nbytes;
#endif
    }
    offloaded_bytes_ += entry->nbytes;
    entries_[entry->id] = entry;
    by_storage_[key] = entry;
  }
  ++entry->open_tickets;
  Ticket ticket;
  ticket.entry = entry;
  ticket.dtype = t.scalar_type();
  ticket.sizes = t.sizes().vec();
  ticket.strides = t.strides().vec();
  ticket.storage_offset = t.storage_offset();
  const int64_t id = next_++;
  tickets_.emplace(id, std::move(ticket));
  return id;
}

void ActivationOffloader::ReleaseFinishedLocked() {
#ifdef QLORA_HAVE_CUDA
  for (auto& [id, e] : entries_) {
    if (e->source.defined() && e->to_host_done.query()) {
      e->source.reset();
      pending_bytes_ -= e->nbytes;
    }
  }
  // Host blocks whose copies are done go back to the pool (as their entries go).
  retiring_.erase(std::remove_if(retiring_.begin(), retiring_.end(),
                                 [](const std::shared_ptr<Entry>& e) {
                                   return e->to_host_done.query() && e->to_device_done.query();
                                 }),
                  retiring_.end());
#endif
  for (auto it = by_storage_.begin(); it != by_storage_.end();) {
    // A storage that died may have its address reused: forget it (a live one is saved once).
    if (it->second->storage.expired()) {
      it = by_storage_.erase(it);
    } else {
      ++it;
    }
  }
}

void ActivationOffloader::ReleaseLayersBelowLocked(int64_t group) {
#ifdef QLORA_HAVE_CUDA
  if (options_.max_layers_pending <= 0) return;
  // Every offloaded storage was made on this thread's forward stream, the one current here (the
  // allocator reuses a block only on the stream it was made on): its later work waits.
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  const int64_t per_layer = std::max<int64_t>(options_.groups_per_layer, 1);
  const int64_t last_layer = group / per_layer - options_.max_layers_pending;
  for (auto& [id, e] : entries_) {
    if (e->source.defined() && e->group / per_layer <= last_layer) {
      e->to_host_done.block(compute);  // what the compute stream runs next may reuse the memory
      e->source.reset();
      pending_bytes_ -= e->nbytes;
    }
  }
#else
  (void)group;
#endif
}

void ActivationOffloader::FetchLocked(Entry& entry) {
  if (entry.restored.defined()) return;
  if (entry.source.defined()) {  // still on the device: no round trip
    entry.restored = entry.source;
    return;
  }
  if (streams_ == nullptr) {
    entry.restored = entry.host.clone();
    return;
  }
#ifdef QLORA_HAVE_CUDA
  // Allocated in the compute stream's order; the copy waits for the compute stream's work so far
  // (whatever used this memory before), and the compute stream waits for the copy at Restore.
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  entry.restored = at::empty({entry.nbytes}, at::dtype(at::kByte).device(device_));
  c10::cuda::CUDAEvent allocated;
  allocated.record(compute);
  allocated.block(streams_->to_device);
  // The host bytes are whole once the copy out is (the compute stream waited for it when the
  // device copy went, but this stream owes that wait nothing).
  entry.to_host_done.block(streams_->to_device);
  {
    c10::cuda::CUDAStreamGuard guard(streams_->to_device);
    entry.restored.copy_(entry.host, /*non_blocking=*/true);
  }
  entry.to_device_done.record(streams_->to_device);
#endif
}

void ActivationOffloader::Prefetch(int64_t group) {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseFinishedLocked();
  for (auto& [id, e] : entries_) {
    if (e->group == group) FetchLocked(*e);
  }
}

at::Tensor ActivationOffloader::Restore(int64_t ticket_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tickets_.find(ticket_id);
  TORCH_CHECK(it != tickets_.end(), "activation offload: ticket ", ticket_id,
              " is unknown or was restored already (backward ran twice, or after Clear)");
  Ticket ticket = std::move(it->second);
  tickets_.erase(it);
  Entry& entry = *ticket.entry;
  if (!entry.restored.defined() && !entry.source.defined()) ++demand_fetches_;
  FetchLocked(entry);
#ifdef QLORA_HAVE_CUDA
  if (streams_ != nullptr && entry.to_device_done.isCreated()) {
    entry.to_device_done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
  at::Tensor restored =
      at::empty({0}, entry.restored.options().dtype(ticket.dtype))
          .set_(entry.restored.storage(), ticket.storage_offset, ticket.sizes, ticket.strides);
  if (--entry.open_tickets == 0) DropEntryLocked(ticket.entry);
  return restored;
}

void ActivationOffloader::DropEntryLocked(const std::shared_ptr<Entry>& entry) {
  entries_.erase(entry->id);
  auto mapped = by_storage_.find(entry->key);
  if (mapped != by_storage_.end() && mapped->second == entry) by_storage_.erase(mapped);
  if (entry->source.defined()) {
    pending_bytes_ -= entry->nbytes;
    entry->source.reset();
  }
  RetireLocked(entry);
}

void ActivationOffloader::RetireLocked(const std::shared_ptr<Entry>& entry) {
  entry->restored.reset();  // the restored views keep their storage; the entry need not
  if (streams_ != nullptr && entry->host.defined()) retiring_.push_back(entry);
}

void ActivationOffloader::Forget(const std::vector<int64_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t id : ids) {
    auto it = tickets_.find(id);
    if (it == tickets_.end()) continue;  // restored (or cleared) already
    std::shared_ptr<Entry> entry = std::move(it->second.entry);
    tickets_.erase(it);
    if (--entry->open_tickets == 0) DropEntryLocked(entry);
  }
}

void ActivationOffloader::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : entries_) {
    e->source.reset();
    RetireLocked(e);
  }
  tickets_.clear();
  by_storage_.clear();
  entries_.clear();
  pending_bytes_ = 0;
}

int64_t ActivationOffloader::host_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [id, e] : entries_) total += e->nbytes;
  return total;
}

int64_t ActivationOffloader::demand_fetches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return demand_fetches_;
}

int64_t ActivationOffloader::host_bytes_of(int64_t group) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [id, e] : entries_) total += e->group == group ? e->nbytes : 0;
  return total;
}

int64_t ActivationOffloader::offloaded_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return offloaded_bytes_;
}

int64_t ActivationOffloader::pending_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_bytes_;
}

OffloadScope::OffloadScope(std::shared_ptr<ActivationOffloader> offloader, int64_t group)
    : previous_(current_offloader), previous_group_(current_group) {
  if (offloader != nullptr) {
    current_offloader = std::move(offloader);
    current_group = group;
  }
}

OffloadScope::~OffloadScope() {
  current_offloader = previous_;
  current_group = previous_group_;
}

void SaveForBackward(AutogradContext* ctx, const variable_list& tensors) {
  const std::shared_ptr<ActivationOffloader>& offloader = current_offloader;
  if (offloader == nullptr) {
    ctx->save_for_backward(tensors);
    return;
  }
  variable_list kept(tensors.size());
  std::vector<int64_t> tickets(tensors.size(), -1);
  bool any = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (offloader->Offloadable(tensors[i])) {
      tickets[i] = offloader->Offload(tensors[i], current_group);
      any = true;
    } else {
      kept[i] = tensors[i];
    }
  }
  ctx->save_for_backward(kept);
  if (!any) return;
  ctx->saved_data[kTicketsKey] =
      at::IValue::make_capsule(c10::make_intrusive<SavedTickets>(offloader, std::move(tickets)));
}

variable_list SavedForBackward(AutogradContext* ctx) {
  variable_list saved = ctx->get_saved_variables();
  auto found = ctx->saved_data.find(kTicketsKey);
  if (found == ctx->saved_data.end()) return saved;
  const auto tickets = c10::static_intrusive_pointer_cast<SavedTickets>(found->second.toCapsule());
  for (size_t i = 0; i < tickets->ids.size(); ++i) {
    if (tickets->ids[i] >= 0) saved[i] = tickets->offloader->Restore(tickets->ids[i]);
  }
  return saved;
}

}  // namespace qlora::engine
