// PinnedBlockPool (see pinned_block_pool.h).
#include "worker/engine/pinned_block_pool.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include "worker/memory/pinned_block_bytes.h"

#ifdef QLORA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace qlora::engine {

HostBlockSource PinnedHostSource() {
  HostBlockSource source;
#ifdef QLORA_HAVE_CUDA
  source.allocate = [](int64_t bytes) -> void* {
    void* block = nullptr;
    if (cudaHostAlloc(&block, static_cast<size_t>(bytes), cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();  // a failed allocation leaves no sticky error to others
      return nullptr;
    }
    return block;
  };
  source.release = [](void* block) { (void)cudaFreeHost(block); };
#else
  source.allocate = [](int64_t) -> void* { return nullptr; };
  source.release = [](void*) {};
#endif
  return source;
}

// Shared with the tensors' deleters, so that a block coming back after the pool is gone is freed.
struct PinnedBlockPool::State {
  State(HostBlockSource s, std::string u) : source(std::move(s)), user(std::move(u)) {}

  void FreeKept() {
    for (auto& [bytes, blocks] : kept) {
      for (void* block : blocks) source.release(block);
    }
    kept.clear();
    stats.kept_bytes = 0;
  }

  // The smallest kept block of at least `bytes` and at most twice that (its size in *size), or
  // nullptr. Sizes whose blocks are all out leave the map.
  void* TakeKept(int64_t bytes, int64_t* size) {
    auto it = kept.lower_bound(bytes);
    if (it == kept.end() || it->first > 2 * bytes) return nullptr;
    void* block = it->second.back();
    it->second.pop_back();
    *size = it->first;
    stats.kept_bytes -= it->first;
    if (it->second.empty()) kept.erase(it);
    return block;
  }

  void Return(void* block, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    stats.held_bytes -= bytes;
    if (closed) {
      source.release(block);
      return;
    }
    kept[bytes].push_back(block);
    stats.kept_bytes += bytes;
  }

  HostBlockSource source;
  const std::string user;
  std::mutex mu;
  std::map<int64_t, std::vector<void*>> kept;  // by block size
  PinnedBlockPoolStats stats;
  bool closed = false;  // the pool is gone: blocks coming back are freed
};

PinnedBlockPool::PinnedBlockPool(HostBlockSource source, std::string user)
    : state_(std::make_shared<State>(std::move(source), std::move(user))) {}

PinnedBlockPool::~PinnedBlockPool() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->closed = true;
  state_->FreeKept();
}

at::Tensor PinnedBlockPool::Allocate(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "PinnedBlockPool: a negative size (", bytes, ")");
  const int64_t wanted = std::max<int64_t>(memory::PinnedBlockBytes(bytes), memory::kPinnedPage);
  int64_t size = wanted;
  void* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    block = state_->TakeKept(wanted, &size);
    if (block != nullptr) {
      ++state_->stats.reuses;
    } else {
      block = state_->source.allocate(size);
      if (block == nullptr && state_->stats.kept_bytes > 0) {  // the kept ones go, once
        state_->FreeKept();
        block = state_->source.allocate(size);
      }
      TORCH_CHECK(block != nullptr, state_->user, ": no pinned host memory for a block of ", size,
                  " bytes");
      ++state_->stats.allocations;
    }
    state_->stats.held_bytes += size;
  }
  std::shared_ptr<State> state = state_;
  return at::from_blob(
      block, {bytes},
      [state = std::move(state), size](void* data) { state->Return(data, size); },
      at::TensorOptions().dtype(at::kByte));
}

PinnedBlockPoolStats PinnedBlockPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

}  // namespace qlora::engine
