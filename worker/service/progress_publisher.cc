// ProgressPublisher (see progress_publisher.h).
#include "worker/service/progress_publisher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace qlora::worker {

ProgressPublisher::ProgressPublisher(Send send, Log log, ProgressPublisherOptions options)
    : send_(std::move(send)), log_(std::move(log)), options_(options) {
  thread_ = std::thread([this] { Run(); });
}

ProgressPublisher::~ProgressPublisher() { Close(); }

void ProgressPublisher::Publish(ProgressSnapshot snapshot) {
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  if (pending_.size() >= std::max<size_t>(options_.max_pending, 1)) {
    pending_.pop_front();
    ++dropped_;
  }
  pending_.push_back(std::move(snapshot));
}

void ProgressPublisher::Close() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t ProgressPublisher::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

bool ProgressPublisher::ReadyLocked() const { return closing_ || !pending_.empty(); }

void ProgressPublisher::Run() {
  while (true) {
    ProgressSnapshot next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ProgressPublisher::ReadyLocked));
      if (pending_.empty()) return;  // closing, and nothing left to send
      next = std::move(pending_.front());
      pending_.pop_front();
    }
    absl::Status sent = send_(next);
    if (!sent.ok()) log_(absl::StrCat("progress not delivered: ", sent.ToString()));
  }
}

}  // namespace qlora::worker
