// A cap on the server streams open at once (WatchJob, StreamLogs): each holds a gRPC thread for
// as long as its client keeps it, so without a cap a client could exhaust the server's threads.
// TryOpen() gives a slot, closed when the slot is destroyed; none past the limit. Thread-safe.
#pragma once

#include <atomic>
#include <optional>

namespace qlora::coordinator {

class StreamLimit {
 public:
  explicit StreamLimit(int limit) : limit_(limit) {}

  class Slot {
   public:
    explicit Slot(std::atomic<int>* open) : open_(open) {}
    Slot(Slot&& other) noexcept : open_(other.open_) { other.open_ = nullptr; }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        Release();
        open_ = other.open_;
        other.open_ = nullptr;
      }
      return *this;
    }
    ~Slot() { Release(); }

   private:
    void Release() {
      if (open_ != nullptr) open_->fetch_sub(1);
      open_ = nullptr;
    }
    std::atomic<int>* open_;
  };

  // A slot, or nullopt when `limit` streams are open.
  std::optional<Slot> TryOpen() {
    if (open_.fetch_add(1) >= limit_) {
      open_.fetch_sub(1);
      return std::nullopt;
    }
    return Slot(&open_);
  }
  int limit() const { return limit_; }

 private:
  const int limit_;
  std::atomic<int> open_{0};
};

}  // namespace qlora::coordinator
