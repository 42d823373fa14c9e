// GlooStoreAdapter: forwards to RendezvousStore, converting absl::Status to gloo::IoException.
#include "worker/comm/gloo_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace qlora::comm {

GlooStoreAdapter::GlooStoreAdapter(RendezvousStore& store, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

std::string GlooStoreAdapter::Key(const std::string& key) const {
  return absl::StrCat(prefix_, "/gloo/", key);
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_.Set(Key(key), std::string(data.begin(), data.end()));
  if (!status.ok()) throw gloo::IoException(std::string(status.message()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value =
      store_.Get(Key(key), absl::FromChrono(timeout_));
  if (!value.ok()) throw gloo::IoException(std::string(value.status().message()));
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value =
        store_.Get(Key(key), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!value.ok()) throw gloo::IoException(std::string(value.status().message()));
  }
}

}  // namespace qlora::comm
