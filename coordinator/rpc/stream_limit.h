// Caps on the server streams open at once (WatchJob, StreamLogs): each holds a gRPC thread for
// as long as its client keeps it, so without a cap a client could exhaust the server's threads.
// One cap for everyone and one per user (so one user cannot take every place). TryOpen() gives
// a slot, closed when the slot is destroyed; none past either cap. Thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"

namespace qlora::coordinator {

class StreamLimit {
 public:
  // `per_user_limit` 0 = no per-user cap.
  explicit StreamLimit(int limit, int per_user_limit = 0) : limit_(limit), per_user_limit_(per_user_limit) {}

  class Slot {
   public:
    Slot(StreamLimit* owner, std::string user) : owner_(owner), user_(std::move(user)) {}
    Slot(Slot&& other) noexcept : owner_(other.owner_), user_(std::move(other.user_)) { other.owner_ = nullptr; }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        Release();
        owner_ = other.owner_;
        user_ = std::move(other.user_);
        other.owner_ = nullptr;
      }
      return *this;
    }
    ~Slot() { Release(); }

   private:
    void Release() {
      if (owner_ != nullptr) owner_->Close(user_);
      owner_ = nullptr;
    }
    StreamLimit* owner_;
    std::string user_;
  };

  enum class Refusal { kTotal, kPerUser };

  // A slot for `user`, or which cap refused it.
  std::optional<Slot> TryOpen(const std::string& user, Refusal* refusal) {
    absl::MutexLock lock(&mu_);
    if (open_ >= limit_) {
      *refusal = Refusal::kTotal;
      return std::nullopt;
    }
    int& mine = open_by_user_[user];
    if (per_user_limit_ > 0 && mine >= per_user_limit_) {
      *refusal = Refusal::kPerUser;
      return std::nullopt;
    }
    ++open_;
    ++mine;
    return std::optional<Slot>(std::in_place, this, user);
  }
  int limit() const { return limit_; }
  int per_user_limit() const { return per_user_limit_; }

 private:
  void Close(const std::string& user) {
    absl::MutexLock lock(&mu_);
    --open_;
    if (--open_by_user_[user] == 0) open_by_user_.erase(user);
  }

  const int limit_;
  const int per_user_limit_;
  absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> open_by_user_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qlora::coordinator
