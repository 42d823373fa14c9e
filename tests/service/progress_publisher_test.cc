// ProgressPublisher (worker/service/progress_publisher.h): snapshots reach the sender in order,
// Publish does not wait for a slow sender, Close sends what waits, and a full queue drops the
// oldest. The sender here stands in for the coordinator's RPC so that a slow or failing peer can
// be forced; the end-to-end service tests run it against the real coordinator.
#include "worker/service/progress_publisher.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace qlora::worker {
namespace {

ProgressSnapshot Step(int64_t step) {
  ProgressSnapshot p;
  p.step = step;
  return p;
}

struct Recorder {
  absl::Mutex mu;
  std::vector<int64_t> steps;
  std::vector<std::string> logs;
};

TEST(ProgressPublisher, SendsEverySnapshotInOrderAndCloseWaitsForThem) {
  Recorder r;
  ProgressPublisher publisher(
      [&](const ProgressSnapshot& p) {
        absl::MutexLock lock(&r.mu);
        r.steps.push_back(p.step);
        return absl::OkStatus();
      },
      [&](const std::string& line) { r.logs.push_back(line); });
  for (int64_t s = 1; s <= 100; ++s) publisher.Publish(Step(s));
  publisher.Close();
  std::vector<int64_t> expected;
  for (int64_t s = 1; s <= 100; ++s) expected.push_back(s);
  EXPECT_EQ(r.steps, expected);
  EXPECT_TRUE(r.logs.empty());
  publisher.Publish(Step(101));  // after Close: ignored
  publisher.Close();             // idempotent
  EXPECT_EQ(r.steps.size(), 100u);
}

TEST(ProgressPublisher, PublishDoesNotWaitForASlowCoordinator) {
  absl::Notification release;
  Recorder r;
  ProgressPublisher publisher(
      [&](const ProgressSnapshot& p) {
        release.WaitForNotification();  // the coordinator answers only when released
        absl::MutexLock lock(&r.mu);
        r.steps.push_back(p.step);
        return absl::OkStatus();
      },
      [](const std::string&) {});
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = 1; s <= 10; ++s) publisher.Publish(Step(s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  {
    absl::MutexLock lock(&r.mu);
    EXPECT_TRUE(r.steps.empty());
  }
  release.Notify();
  publisher.Close();
  EXPECT_EQ(r.steps.size(), 10u);
  EXPECT_EQ(publisher.dropped(), 0);
}

TEST(ProgressPublisher, AFullQueueDropsTheOldestAndFailuresAreLogged) {
  absl::Notification release;
  Recorder r;
  ProgressPublisherOptions options;
  options.max_pending = 3;
  ProgressPublisher publisher(
      [&](const ProgressSnapshot& p) {
        release.WaitForNotification();
        absl::MutexLock lock(&r.mu);
        r.steps.push_back(p.step);
        return p.step == 10 ? absl::UnavailableError("coordinator gone") : absl::OkStatus();
      },
      [&](const std::string& line) {
        absl::MutexLock lock(&r.mu);
        r.logs.push_back(line);
      },
      options);
  publisher.Publish(Step(1));
  // Step 1 is taken by the sender (blocked) or still waiting; either way at most 3 wait, and
  // the last three published are among those sent.
  for (int64_t s = 2; s <= 10; ++s) publisher.Publish(Step(s));
  release.Notify();
  publisher.Close();
  ASSERT_GE(r.steps.size(), 3u);
  EXPECT_EQ(std::vector<int64_t>(r.steps.end() - 3, r.steps.end()), (std::vector<int64_t>{8, 9, 10}));
  EXPECT_EQ(static_cast<int64_t>(r.steps.size()) + publisher.dropped(), 10);
  EXPECT_GT(publisher.dropped(), 0);
  ASSERT_EQ(r.logs.size(), 1u);
  EXPECT_NE(r.logs[0].find("progress not delivered"), std::string::npos);
  EXPECT_NE(r.logs[0].find("coordinator gone"), std::string::npos);
}

}  // namespace
}  // namespace qlora::worker
