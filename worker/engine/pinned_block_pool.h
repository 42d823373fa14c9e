// Pinned host blocks for the activation offloader, sized by memory::PinnedBlockBytes (within an
// eighth of the request, where torch's caching host allocator takes the next power of two) and
// kept for reuse: the same sizes come back every step, and freeing pinned memory is slow.
//
// Allocate(bytes) gives a CPU uint8 tensor of `bytes` over a block; when its last reference goes
// the block returns to the pool, whose caller must make sure that no copy still reads or writes
// it by then (the offloader keeps a block until its copies' events are done). A request takes the
// smallest kept block of its size up to twice it (a micro-batch is as wide as its longest row, so
// sizes vary from step to step, and the blocks of the widest rows serve the narrower ones);
// failing that, a new one is taken from the source. Kept blocks are not freed on the way (freeing
// pinned memory waits for the GPU, and pinning it again takes long): only when the source fails
// (the host is out of memory it may pin) do they all go, and the source is tried once more.
// Blocks outlive the pool safely: the last one back frees the rest. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace qlora::engine {

// Where blocks come from: cudaHostAlloc / cudaFreeHost on a CUDA worker (PinnedHostSource);
// tests count calls.
struct HostBlockSource {
  std::function<void*(int64_t bytes)> allocate;  // nullptr on failure
  std::function<void(void* block)> release;
};

// cudaHostAlloc'd blocks (portable, so any device's copies run at full speed); on a build
// without CUDA, none (allocate fails).
HostBlockSource PinnedHostSource();

struct PinnedBlockPoolStats {
  int64_t allocations = 0;   // blocks the source gave
  int64_t reuses = 0;        // requests served from kept blocks
  int64_t held_bytes = 0;    // blocks' bytes in tensors now
  int64_t kept_bytes = 0;    // blocks' bytes kept for reuse
};

class PinnedBlockPool {
 public:
  // `user` names what the blocks are for in the out-of-memory error.
  PinnedBlockPool(HostBlockSource source, std::string user);
  ~PinnedBlockPool();
  PinnedBlockPool(const PinnedBlockPool&) = delete;
  PinnedBlockPool& operator=(const PinnedBlockPool&) = delete;

  // A uint8 [bytes] CPU tensor over a block of at least PinnedBlockBytes(bytes); throws
  // (c10::Error) naming the size when the source has none even after the kept blocks are freed.
  at::Tensor Allocate(int64_t bytes);
  PinnedBlockPoolStats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace qlora::engine
