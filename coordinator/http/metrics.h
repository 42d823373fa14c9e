// The coordinator's Prometheus metrics (prometheus-cpp's types and text format).
//
// Two kinds: what happens over time is counted as it happens (RPC latencies per method and
// status code, worker process ends by cause) in a Registry this object owns; what the jobs look
// like now (jobs per state, the queue, slots in use, each running job's step, loss, tokens/s and
// memory) is rendered at scrape time from a ManagerSnapshot, so a finished job's series vanish
// with it and nothing needs the manager's lock while the text is built.
//
// Thread-safe (prometheus::Registry and its metrics are). No gRPC here: the RPC interceptor
// (rpc_metrics_interceptor.h) reports method names and codes as plain values.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/worker_group.h"

namespace prometheus {
class Registry;
template <typename T> class Family;
class Counter;
class Histogram;
}  // namespace prometheus

namespace qlora::coordinator {

// The metric names, one source of truth for the code, the tests and the README.
inline constexpr char kMetricJobs[] = "qlora_jobs";
inline constexpr char kMetricQueueLength[] = "qlora_queue_length";
inline constexpr char kMetricSlots[] = "qlora_worker_slots";
inline constexpr char kMetricSlotsBusy[] = "qlora_worker_slots_busy";
inline constexpr char kMetricJobStep[] = "qlora_job_step";
inline constexpr char kMetricJobTotalSteps[] = "qlora_job_total_steps";
inline constexpr char kMetricJobLoss[] = "qlora_job_loss";
inline constexpr char kMetricJobEvalLoss[] = "qlora_job_eval_loss";
inline constexpr char kMetricJobLearningRate[] = "qlora_job_learning_rate";
inline constexpr char kMetricJobTokensPerSecond[] = "qlora_job_tokens_per_second";
inline constexpr char kMetricJobDeviceMemory[] = "qlora_job_device_memory_allocated_bytes";
inline constexpr char kMetricJobDevicePeak[] = "qlora_job_device_memory_peak_bytes";
inline constexpr char kMetricJobHostRss[] = "qlora_job_host_rss_bytes";
inline constexpr char kMetricWorkerExits[] = "qlora_worker_exits_total";
inline constexpr char kMetricRpcDuration[] = "qlora_rpc_duration_seconds";

// A worker process's end as a bounded label value: "completed" (reported success, exit status
// 0), "exit_status" (any other exit), "signal", or "lost" (no exit status known: a lost node).
const char* ExitCause(const WorkerExit& exit);

class CoordinatorMetrics {
 public:
  // `rpc_methods`: the full names ("/pkg.Service/Method") counted under their own name; any
  // other method a client invents is counted as "other", so labels stay bounded.
  explicit CoordinatorMetrics(std::set<std::string> rpc_methods);
  ~CoordinatorMetrics();

  void ObserveRpc(const std::string& method, const std::string& code, double seconds);
  void CountWorkerExit(const WorkerExit& exit);

  // The Prometheus text format (version 0.0.4) of the counters and of `now`. Per-job series are
  // labelled job="<id>" and exist for jobs starting or running; per-rank memory adds rank.
  std::string Render(const ManagerSnapshot& now) const;

 private:
  const std::set<std::string> rpc_methods_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  prometheus::Family<prometheus::Counter>* worker_exits_;
};

}  // namespace qlora::coordinator
