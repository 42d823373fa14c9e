// qlora-worker: one rank of one job. Spawned by the coordinator with its rank and startup
// token; registers, receives its assignment, heartbeats, trains, and reports the outcome.
// With --generate it runs one generation session instead (generation_session.h).
// Exit status: 0 success, 1 training failed, 2 bad arguments, 3 coordinator unreachable,
// 4 stopped (cancelled).
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/config/job_config_parser.h"
#include "common/program/program_flags.h"
#include "worker/comm/nccl_unique_id.h"
#include "worker/data/spm_model.h"
#include "worker/run/fault_injection.h"
#include "worker/run/training_job.h"
#include "worker/service/coordinator_client.h"
#include "worker/service/file_confinement.h"
#include "worker/service/generation_session.h"
#include "worker/service/grpc_rendezvous_store.h"
#include "worker/service/progress_publisher.h"

ABSL_FLAG(std::string, coordinator, "", "coordinator host:port");
ABSL_FLAG(std::string, job, "", "job id");
ABSL_FLAG(int, rank, 0, "this worker's rank");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::vector<std::string>, confine_read, {},
          "folders this worker may read beneath (the coordinator's read roots; empty: reads "
          "are not confined)");
ABSL_FLAG(std::vector<std::string>, confine_write, {},
          "folders this worker may write beneath (its job's output folder); set by the "
          "coordinator when it has roots: file accesses are then confined by Landlock");
ABSL_FLAG(std::string, generate, "",
          "run generation session SESSION (started by the coordinator's Generate call) instead "
          "of a training rank; --job and --rank are then unused");
ABSL_FLAG(bool, check_spm_module, false,
          "load the SentencePiece module (libqlora_spm.so), print where it was found, and exit");

namespace {

std::atomic<bool> g_stop_requested{false};  // set from the signal handler only

void OnTerm(int) { g_stop_requested.store(true); }

// The value of environment variable `name`, "" when unset.
std::string Environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

void Log(const std::string& line) {
  fprintf(stderr, "[rank %d] %s\n", absl::GetFlag(FLAGS_rank), line.c_str());
  fflush(stderr);
}

// Reports a failed run; the coordinator also learns of it from the exit, so a report that does
// not arrive is logged, not fatal.
void ReportFailure(qlora::worker::CoordinatorClient& client, const absl::Status& failure,
                   bool stepped) {
  if (absl::Status reported = client.ReportCompletion(qlora::FailedCompletion(failure, stepped));
      !reported.ok()) {
    Log(absl::StrCat("failure not delivered: ", reported.ToString()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  qlora::ProgramFlagsOptions program;
  program.program = "qlora-worker";
  program.usage = "qlora-worker --coordinator=HOST:PORT --job=ID --rank=N [--device=cpu|cuda]\n"
                  "One rank of one job; started by qlora-coordinator, not by hand.";
  program.flag_files = {"worker_main.cc"};
  qlora::ParseProgramFlags(argc, argv, program);
  if (absl::GetFlag(FLAGS_check_spm_module)) {
    absl::StatusOr<std::string> module = qlora::data::SpmModel::ModulePath();
    if (!module.ok()) {
      fprintf(stderr, "qlora-worker: %s\n", std::string(module.status().message()).c_str());
      return 1;
    }
    printf("%s\n", module->c_str());
    return 0;
  }
  qlora::worker::WorkerIdentity id;
  id.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  id.job_id = absl::GetFlag(FLAGS_job);
  // The startup token comes in the environment, never in argv; it is not passed on to any child.
  if (const char* token = std::getenv(qlora::kWorkerTokenVariable)) id.startup_token = token;
  unsetenv(qlora::kWorkerTokenVariable);
  id.rank = absl::GetFlag(FLAGS_rank);
  // Set on a cluster (the Ray launcher): this host's address as the other ranks reach it.
  const std::string host_address = Environment("QLORA_HOST_ADDRESS");
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string session = absl::GetFlag(FLAGS_generate);
  if (!session.empty()) id.job_id = session;  // for the checks below
  if (id.coordinator_address.empty() || id.job_id.empty() || id.startup_token.empty()) {
    fprintf(stderr, "qlora-worker: --coordinator, --job and $%s (the startup token) are required\n",
            qlora::kWorkerTokenVariable);
    return 2;
  }
  if (device != "cpu" && device != "cuda") {
    fprintf(stderr, "qlora-worker: --device must be cpu or cuda, not '%s'\n", device.c_str());
    return 2;
  }
  // The coordinator's mask for what this worker creates (on a Ray host too).
  if (const char* mask = std::getenv(qlora::kWorkerUmaskVariable); mask != nullptr && *mask != 0) {
    char* end = nullptr;
    const long bits = std::strtol(mask, &end, 8);
    if (end != nullptr && *end == 0 && bits >= 0 && bits <= 0777) umask(static_cast<mode_t>(bits));
  }
  // Before any thread exists (Landlock confines the calling thread and what it starts later).
  if (!absl::GetFlag(FLAGS_confine_write).empty() || !absl::GetFlag(FLAGS_confine_read).empty()) {
    qlora::worker::FileConfinement confinement;
    confinement.read_beneath = absl::GetFlag(FLAGS_confine_read);
    confinement.write_beneath = absl::GetFlag(FLAGS_confine_write);
    const absl::Status confined = qlora::worker::ConfineFiles(confinement);
    if (absl::IsUnimplemented(confined)) {
      Log(absl::StrCat("WARNING: ", confined.message(),
                       "; the roots were checked at submit only"));
    } else if (!confined.ok()) {
      Log(std::string(confined.message()));
      return 3;
    } else {
      Log(absl::StrCat("file accesses confined: reads beneath ",
                       confinement.read_beneath.empty()
                           ? std::string("anywhere")
                           : absl::StrJoin(confinement.read_beneath, ", "),
                       " and the system's folders; writes beneath ",
                       absl::StrJoin(confinement.write_beneath, ", ")));
    }
  }
  // Less fragmentation in the CUDA caching allocator (dequantized weights are short-lived
  // tensors of many sizes): its peak reservation stays close to what is allocated. A setting the
  // user made wins.
  setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", /*overwrite=*/0);
  struct sigaction sa = {};
  sa.sa_handler = OnTerm;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  if (!session.empty()) {
    return qlora::worker::RunGenerationSession(id.coordinator_address, session, id.startup_token,
                                               device, g_stop_requested, qlora::worker::RunGeneration);
  }
  absl::StatusOr<std::unique_ptr<qlora::worker::CoordinatorClient>> connected =
      qlora::worker::CoordinatorClient::Connect(id);
  if (!connected.ok()) {
    Log(absl::StrCat("cannot dial the coordinator: ", connected.status().ToString()));
    return 3;
  }
  std::unique_ptr<qlora::worker::CoordinatorClient> client = *std::move(connected);
  if (absl::Status registered = client->Register(); !registered.ok()) {
    Log(absl::StrCat("cannot register: ", registered.ToString()));
    return 3;
  }
  Log(absl::StrCat("registered with ", id.coordinator_address, " for ", id.job_id));
  if (device == "cuda" && id.rank == 0) {
    absl::StatusOr<std::string> nccl_id = qlora::comm::MakeNcclUniqueId();
    absl::Status published = nccl_id.ok() ? client->PublishNcclId(*nccl_id) : nccl_id.status();
    if (!published.ok()) {
      Log(absl::StrCat("cannot publish the NCCL id: ", published.ToString()));
      ReportFailure(*client, published, /*stepped=*/false);
      return 1;
    }
  }
  absl::StatusOr<qlora::WorkerAssignment> assignment = client->GetAssignment(absl::Minutes(10));
  if (!assignment.ok()) {
    Log(absl::StrCat("no assignment: ", assignment.status().ToString()));
    return 3;
  }

  // Heartbeats; a cancel from the coordinator (or SIGTERM) stops training at the next step.
  std::atomic<bool> cancelled{false};
  std::atomic<bool> stepped{false};  // an optimizer step of this run finished
  absl::Notification done;
  std::thread heartbeat([&] {
    while (!done.WaitForNotificationWithTimeout(absl::Seconds(2))) {
      absl::StatusOr<bool> cancel = client->Heartbeat();
      if (cancel.ok() && *cancel) cancelled.store(true);
    }
  });

  absl::StatusOr<qlora::JobConfig> config = qlora::ParseResolvedJobConfig(assignment->resolved_config_yaml);
  qlora::worker::GrpcRendezvousStore store(client.get(), assignment->generation);
  absl::StatusOr<qlora::worker::TrainingOutcome> outcome =
      config.ok() ? absl::UnknownError("not run") : config.status();
  if (config.ok()) {
    qlora::worker::TrainingContext context;
    context.config = *config;
    context.assignment = *assignment;
    context.store = &store;
    context.should_stop = [&] { return cancelled.load() || g_stop_requested.load(); };
    // Progress goes to the coordinator from a thread of its own (a step never waits for the
    // RPC), in order, all of it before the completion below.
    qlora::worker::ProgressPublisher progress(
        [&](const qlora::ProgressSnapshot& p) { return client->ReportProgress(p); },
        [](const std::string& line) { Log(line); });
    context.report_progress = [&](const qlora::ProgressSnapshot& p) {
      stepped.store(true);  // a report follows every optimizer step
      progress.Publish(p);
    };
    // Tests of the coordinator's restarts may arm a crash here (fault_injection.h).
    std::unique_ptr<qlora::worker::TrainingObserver> fault =
        qlora::worker::FaultInjectorFromEnvironment(assignment->rank);
    context.observer = fault.get();
    if (!host_address.empty()) context.gloo_hostname = host_address;
    context.gloo_iface = Environment("GLOO_SOCKET_IFNAME");
    outcome = qlora::worker::RunTrainingJob(context);
    progress.Close();
  }
  done.Notify();
  heartbeat.join();
  if (cancelled.load() || g_stop_requested.load()) {
    Log("stopped");
    return 4;
  }
  if (!outcome.ok()) {
    Log(absl::StrCat("training failed: ", outcome.status().ToString()));
    absl::Status failure = outcome.status();
    // On a cluster, name the host: a dataset path that this host lacks is the usual cause.
    if (!host_address.empty()) {
      failure = absl::Status(failure.code(), absl::StrCat("on host ", host_address, ": ", failure.message()));
    }
    ReportFailure(*client, failure, stepped.load());
    return 1;
  }
  qlora::WorkerCompletion completed;
  completed.ok = true;
  completed.adapter_path = outcome->adapter_path;
  completed.merged_path = outcome->merged_path;
  completed.summary = outcome->summary;
  absl::Status reported = client->ReportCompletion(completed);
  if (!reported.ok()) {
    Log(absl::StrCat("completion not delivered: ", reported.ToString()));
    return 3;
  }
  Log("done");
  return 0;
}
