// The LoRA adapters in the compute dtype, cast once per optimizer step instead of at every use.
//
// A and B are float32 parameters; the LoRA nodes (*_function.cc) multiply in the compute dtype
// (bf16). Cast at each use, a decoder layer's adapters cost ~45 cast kernels a micro-batch
// (forward, a checkpointed layer's recomputation, backward), ~1,450 a step at 7B, each a kernel
// launch and a bubble between kernels on the GPU. Within an AdapterCopyScope, Get makes a copy on
// first use and hands the same one back afterwards; outside any scope it casts every time (the
// behaviour without this class). A scope must only span work during which no adapter changes:
// the trainer opens one over an optimizer step's forwards and backwards and closes it before the
// optimizer updates the parameters, so no copy outlives the values it was made from. Casting is
// exact and deterministic, so a cached copy is the fresh cast's bits.
//
// Inside a scope a parameter's copy is a view of its storage's mirror: the whole storage cast at
// once, on the first use in the scope. The trainer's adapters are views of the strategy's flat
// float32 buffer, so one cast kernel a step makes every adapter's copy (at 7B, r = 16 on every
// projection: 80 MB in bf16), where a cast per adapter cost ~450 kernels a step, each a launch
// and a bubble between kernels on the GPU. Several tensors asked together (the q/k/v or gate/up
// As) are concatenated from their views, that concatenation kept as well (keyed by the members'
// addresses and sizes and the dtype). When the last scope ends the copies go stale but keep their
// memory, and the next scope casts into the same storage: freeing and reallocating ~290 tensors a
// step cost host time at each step's end, where the GPU waits for the host. A copy not used
// during a scope is freed when it ends. So a copy handed out is only valid until its scope ends.
// Thread-safe: concurrent forwards may share a scope.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::engine {

// The tensors (each [rows_i, cols], same cols) concatenated along dim 0 and cast to `dtype`;
// one tensor: just cast. What AdapterCopies::Get hands back outside a scope.
at::Tensor CastAdapters(at::TensorList params, at::ScalarType dtype);

class AdapterCopies {
 public:
  // CastAdapters(params, dtype): inside a scope the copy made on first use; a single tensor that
  // has `dtype` already is handed back itself (detached, never cached).
  at::Tensor Get(at::TensorList params, at::ScalarType dtype);
  at::Tensor Get(const at::Tensor& param, at::ScalarType dtype) { return Get(at::TensorList(param), dtype); }

  // Bytes of the copies held now, stale ones included (for tests and memory accounting).
  int64_t cached_bytes() const;

  // Writes made from the adapters while a scope is open (the adapters' columns and rows of the
  // weights kept dequantized, dequantized_layers.h), so that a pass that would write the same
  // again skips it: where a write went (`key`) and what it wrote (`signature`: its destinations
  // and sources, tensors whose values the scope fixes). Written is false outside any scope, and
  // every note goes when the last scope ends.
  bool in_scope() const;
  bool Written(const void* key, uint64_t signature) const;
  void NoteWritten(const void* key, uint64_t signature);  // ignored outside any scope
  // Drops every note (the buffers they name are going: LlamaForCausalLM::SetDequantizedLayers).
  void ForgetWrites();

 private:
  friend class AdapterCopyScope;
  void Enter();
  void Leave();
  // param's values in dtype as a view of its storage's mirror (cast whole, once a scope).
  at::Tensor Mirrored(const at::Tensor& param, at::ScalarType dtype);

  // (data pointer, sizes) per source tensor, then the dtype.
  using Key = std::tuple<std::vector<std::pair<const void*, std::vector<int64_t>>>, int>;
  mutable std::mutex mu_;
  int scopes_ = 0;
  struct Copy {
    at::Tensor tensor;
    bool current = false;  // cast within the open scope (else stale: cast again before use)
  };
  std::map<Key, Copy> copies_;                              // concatenations
  std::map<std::pair<const void*, int>, Copy> mirrors_;    // by storage address and dtype
  std::map<const void*, uint64_t> writes_;                  // NoteWritten's, this scope's
};

// Caches copies in `copies` while alive; when the last scope ends they go stale.
class AdapterCopyScope {
 public:
  explicit AdapterCopyScope(AdapterCopies& copies) : copies_(copies) { copies_.Enter(); }
  ~AdapterCopyScope() { copies_.Leave(); }
  AdapterCopyScope(const AdapterCopyScope&) = delete;
  AdapterCopyScope& operator=(const AdapterCopyScope&) = delete;

 private:
  AdapterCopies& copies_;
};

}  // namespace qlora::engine
