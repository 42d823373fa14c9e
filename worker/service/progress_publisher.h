// Sends the training loop's progress snapshots to the coordinator from a thread of its own, in
// the order they were published, so that a step never waits for the RPC: sent inline, the
// report (a round trip to the coordinator, which records the event) kept the GPU idle at every
// step boundary, between one step's end and the next one's first kernel.
//
// Publish never blocks on the send. Should the coordinator fall behind by max_pending snapshots,
// the oldest waiting one is dropped (and counted): a snapshot is a progress report, and the
// newest is what the coordinator shows. Close() sends what waits and stops the thread; the
// worker calls it before reporting completion, so that the coordinator sees every progress
// report before the job ends. A failed send is logged and the next one is tried.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/worker_protocol.h"

namespace qlora::worker {

struct ProgressPublisherOptions {
  size_t max_pending = 256;  // snapshots waiting for the send, at most
};

class ProgressPublisher {
 public:
  using Send = std::function<absl::Status(const ProgressSnapshot&)>;
  using Log = std::function<void(const std::string&)>;

  ProgressPublisher(Send send, Log log, ProgressPublisherOptions options = {});
  ~ProgressPublisher();  // Close()
  ProgressPublisher(const ProgressPublisher&) = delete;
  ProgressPublisher& operator=(const ProgressPublisher&) = delete;

  // Queues `snapshot` for the thread; ignored after Close().
  void Publish(ProgressSnapshot snapshot);
  // Sends every waiting snapshot, then stops the thread. Idempotent.
  void Close();
  // Snapshots dropped because max_pending were waiting.
  int64_t dropped() const;

 private:
  void Run();
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Send send_;
  const Log log_;
  const ProgressPublisherOptions options_;
  mutable absl::Mutex mu_;
  std::deque<ProgressSnapshot> pending_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace qlora::worker
