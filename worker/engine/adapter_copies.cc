// AdapterCopies: compute-dtype copies of the adapters, cast once a scope into kept storage.
#include "worker/engine/adapter_copies.h"

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace qlora::engine {

at::Tensor CastAdapters(at::TensorList params, at::ScalarType dtype) {
  if (params.size() == 1) return params[0].to(dtype);
  return at::cat(params).to(dtype);
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
  Key key;
  for (const at::Tensor& p : sources) std::get<0>(key).emplace_back(p.data_ptr(), p.sizes().vec());
  std::get<1>(key) = static_cast<int>(dtype);
  auto it = copies_.find(key);
  if (it == copies_.end()) {
    it = copies_.emplace(std::move(key), Copy{CastAdapters(sources, dtype), true}).first;
  } else if (!it->second.current) {  // made in an earlier scope: cast again into its storage
    int64_t row = 0;
    for (const at::Tensor& p : sources) {
      it->second.tensor.narrow(0, row, p.size(0)).copy_(p);
      row += p.size(0);
    }
    it->second.current = true;
  }
  return it->second.tensor;
}

int64_t AdapterCopies::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [key, copy] : copies_) total += copy.tensor.nbytes();
  return total;
}

void AdapterCopies::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  ++scopes_;
}

void AdapterCopies::Leave() {
  std::vector<at::Tensor> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (--scopes_ > 0) return;
  for (auto it = copies_.begin(); it != copies_.end();) {
    if (it->second.current) {
      (it++)->second.current = false;
    } else {  // not used in the scope that ended
      dropped.push_back(std::move(it->second.tensor));
      it = copies_.erase(it);
    }
  }
}

}  // namespace qlora::engine
