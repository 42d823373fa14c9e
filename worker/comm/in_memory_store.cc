// InMemoryRendezvousStore: a map guarded by a mutex; Get waits on the mutex's condition.
#include "worker/comm/in_memory_store.h"

#include "absl/strings/str_cat.h"

namespace qlora::comm {

absl::Status InMemoryRendezvousStore::Set(const std::string& key, const std::string& bytes) {
  absl::MutexLock lock(&mu_);
  values_[key] = bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryRendezvousStore::Get(const std::string& key,
                                                         absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key '", key, "' did not appear within ", absl::FormatDuration(timeout)));
  }
  return values_[key];
}

}  // namespace qlora::comm
