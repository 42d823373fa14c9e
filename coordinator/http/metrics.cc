// The coordinator's Prometheus metrics (see metrics.h).
#include "coordinator/http/metrics.h"

#include <cmath>
#include <map>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace qlora::coordinator {
namespace {

constexpr JobState kAllStates[] = {JobState::kQueued,    JobState::kStarting, JobState::kRunning,
                                   JobState::kSucceeded, JobState::kFailed,   JobState::kCancelled};

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry, const char* name,
                                                   const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

}  // namespace

const char* ExitCause(const WorkerExit& exit) {
  if (!exit.info.cause.empty()) return "lost";
  if (exit.info.signaled) return "signal";
  return exit.completed && exit.info.code == 0 ? "completed" : "exit_status";
}

CoordinatorMetrics::CoordinatorMetrics(std::set<std::string> rpc_methods)
    : rpc_methods_(std::move(rpc_methods)), registry_(std::make_shared<prometheus::Registry>()) {
  rpc_duration_ = &prometheus::BuildHistogram()
                       .Name(kMetricRpcDuration)
                       .Help("gRPC calls served, by method and status code: seconds from the call's "
                             "start to its status (streams: their whole life)")
                       .Register(*registry_);
  worker_exits_ = &prometheus::BuildCounter()
                       .Name(kMetricWorkerExits)
                       .Help("worker processes (ranks) that ended, by cause: completed, exit_status, "
                             "signal, lost")
                       .Register(*registry_);
  for (const char* cause : {"completed", "exit_status", "signal", "lost"}) worker_exits_->Add({{"cause", cause}});
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::ObserveRpc(const std::string& method, const std::string& code, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  const std::string label = rpc_methods_.count(method) ? method : "other";
  rpc_duration_->Add({{"method", label}, {"code", code}}, kBuckets).Observe(seconds);
}

void CoordinatorMetrics::CountWorkerExit(const WorkerExit& exit) {
  worker_exits_->Add({{"cause", ExitCause(exit)}}).Increment();
}

std::string CoordinatorMetrics::Render(const ManagerSnapshot& now) const {
  // The current picture goes into a registry of its own, made for this scrape.
  prometheus::Registry current;
  auto& jobs = GaugeFamily(current, kMetricJobs, "jobs known to the coordinator, by state");
  auto& queue = GaugeFamily(current, kMetricQueueLength, "jobs waiting in the queue (state queued)");
  auto& slots = GaugeFamily(current, kMetricSlots, "GPU ids or CPU slots of this host, by kind");
  auto& busy = GaugeFamily(current, kMetricSlotsBusy, "slots held by a live local worker process, by kind");
  auto& step = GaugeFamily(current, kMetricJobStep, "optimizer steps done (rank 0), per starting or running job");
  auto& total = GaugeFamily(current, kMetricJobTotalSteps, "optimizer steps the job will run (rank 0)");
  auto& loss = GaugeFamily(current, kMetricJobLoss, "training loss last reported (rank 0)");
  auto& eval_loss = GaugeFamily(current, kMetricJobEvalLoss, "validation loss last reported (rank 0; absent until evaluated)");
  auto& lr = GaugeFamily(current, kMetricJobLearningRate, "learning rate last reported (rank 0)");
  auto& tps = GaugeFamily(current, kMetricJobTokensPerSecond, "training tokens per second, summed over the ranks");
  auto& device = GaugeFamily(current, kMetricJobDeviceMemory, "device memory allocated, per rank");
  auto& peak = GaugeFamily(current, kMetricJobDevicePeak, "peak device memory allocated, per rank");
  auto& rss = GaugeFamily(current, kMetricJobHostRss, "worker process resident set size, per rank");

  std::map<JobState, int> per_state;
  for (JobState s : kAllStates) per_state[s] = 0;
  for (const JobRecord& job : now.jobs) {
    ++per_state[job.state];
    if (job.state != JobState::kStarting && job.state != JobState::kRunning) continue;
    if (job.progress.empty()) continue;
    const prometheus::Labels labels = {{"job", job.id}};
    const ProgressSnapshot& first = job.progress.front();
    step.Add(labels).Set(static_cast<double>(first.step));
    total.Add(labels).Set(static_cast<double>(first.total_steps));
    loss.Add(labels).Set(first.loss);
    if (!std::isnan(first.eval_loss)) eval_loss.Add(labels).Set(first.eval_loss);
    lr.Add(labels).Set(first.learning_rate);
    double tokens = 0;
    for (const ProgressSnapshot& p : job.progress) tokens += p.tokens_per_second;
    tps.Add(labels).Set(tokens);
    for (size_t r = 0; r < job.progress.size(); ++r) {
      const prometheus::Labels rank = {{"job", job.id}, {"rank", absl::StrCat(r)}};
      const MemorySnapshot& m = job.progress[r].memory;
      device.Add(rank).Set(static_cast<double>(m.device_allocated_bytes));
      peak.Add(rank).Set(static_cast<double>(m.device_peak_bytes));
      rss.Add(rank).Set(static_cast<double>(m.host_rss_bytes));
    }
  }
  for (const auto& [state, n] : per_state) {
    jobs.Add({{"state", absl::AsciiStrToLower(JobStateName(state))}}).Set(n);
  }
  queue.Add({}).Set(per_state[JobState::kQueued]);
  const std::string kind = now.gpu ? "gpu" : "cpu";
  slots.Add({{"kind", kind}}).Set(now.slots_total);
  busy.Add({{"kind", kind}}).Set(now.slots_busy);

  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : current.Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace qlora::coordinator
