// AdapterCopies: compute-dtype copies of the adapters, cast once a scope into kept storage.
#include "worker/engine/adapter_copies.h"

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace qlora::engine {
namespace {

// At the last scope's end: the copies used in it go stale (their storage kept), the others are
// moved to `dropped`.
template <typename Map>
void EndScope(Map& copies, std::vector<at::Tensor>& dropped) {
  for (auto it = copies.begin(); it != copies.end();) {
    if (it->second.current) {
      (it++)->second.current = false;
    } else {  // not used in the scope that ended
      dropped.push_back(std::move(it->second.tensor));
      it = copies.erase(it);
    }
  }
}

}  // namespace

at::Tensor CastAdapters(at::TensorList params, at::ScalarType dtype) {
  if (params.size() == 1) return params[0].to(dtype);
  return at::cat(params).to(dtype);
}

at::Tensor AdapterCopies::Mirrored(const at::Tensor& param, at::ScalarType dtype) {
  const at::Storage& storage = param.storage();
  const int64_t elements = static_cast<int64_t>(storage.nbytes()) / param.element_size();
  Copy& mirror = mirrors_[{storage.data(), static_cast<int>(dtype)}];
  if (!mirror.tensor.defined() || mirror.tensor.numel() != elements) {
    mirror.tensor = at::empty({elements}, param.options().dtype(dtype));
    mirror.current = false;
  }
  if (!mirror.current) {  // the whole storage in one cast
    mirror.tensor.copy_(at::empty({0}, param.options()).set_(storage, 0, {elements}, {1}));
    mirror.current = true;
  }
  return mirror.tensor.as_strided(param.sizes(), param.strides(), param.storage_offset());
}

at::Tensor AdapterCopies::Get(at::TensorList params, at::ScalarType dtype) {
  // Detached: the copies feed the LoRA nodes' own GEMMs, never autograd.
  std::vector<at::Tensor> sources;
  for (const at::Tensor& p : params) sources.push_back(p.detach());
  if (sources.size() == 1 && sources[0].scalar_type() == dtype) return sources[0];  // no copy
  // One lock for the scope test and the insertion, so that no copy enters the map after the
  // last scope has emptied it (a later scope would be handed stale values).
  std::unique_lock<std::mutex> lock(mu_);
  if (scopes_ == 0) {
    lock.unlock();
    return CastAdapters(sources, dtype);
  }
  std::vector<at::Tensor> views;
  for (const at::Tensor& p : sources) views.push_back(Mirrored(p, dtype));
  if (views.size() == 1) return views[0];
  Key key;
  for (const at::Tensor& p : sources) std::get<0>(key).emplace_back(p.data_ptr(), p.sizes().vec());
  std::get<1>(key) = static_cast<int>(dtype);
  auto it = copies_.find(key);
  if (it == copies_.end()) {
    it = copies_.emplace(std::move(key), Copy{at::cat(views), true}).first;
  } else if (!it->second.current) {  // made in an earlier scope: concatenated again in place
    at::cat_out(it->second.tensor, views);
    it->second.current = true;
  }
  return it->second.tensor;
}

int64_t AdapterCopies::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [key, copy] : copies_) total += copy.tensor.nbytes();
  for (const auto& [key, mirror] : mirrors_) total += mirror.tensor.nbytes();
  return total;
}

bool AdapterCopies::in_scope() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scopes_ > 0;
}

bool AdapterCopies::Written(const void* key, uint64_t signature) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = writes_.find(key);
  return scopes_ > 0 && it != writes_.end() && it->second == signature;
}

void AdapterCopies::NoteWritten(const void* key, uint64_t signature) {
  std::lock_guard<std::mutex> lock(mu_);
  if (scopes_ > 0) writes_[key] = signature;
}

void AdapterCopies::ForgetWrites() {
  std::lock_guard<std::mutex> lock(mu_);
  writes_.clear();
}

void AdapterCopies::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  ++scopes_;
}

void AdapterCopies::Leave() {
  std::vector<at::Tensor> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (--scopes_ > 0) return;
  writes_.clear();
  EndScope(copies_, dropped);
  EndScope(mirrors_, dropped);
}

}  // namespace qlora::engine
