// qlora-coordinator: the daemon's flags, turned into CoordinatorOptions for RunCoordinator
// (coordinator_server.h), which serves until a stop signal. Exit status 2: the flags are refused;
// 1: the state folder or a port could not be taken.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/program/program_flags.h"
#include "common/rpc/coordinator_channel.h"
#include "coordinator/admission/path_confinement.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/rpc/job_service.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "host:port to listen on (port 0 picks a free one)");
ABSL_FLAG(bool, insecure, false,
          "allow a non-loopback --address without TLS and client authentication (and a non-loopback "
          "--metrics-address, which is plain HTTP)");
ABSL_FLAG(std::string, tls_cert, "", "TLS: this server's certificate chain (PEM; re-read when it changes)");
ABSL_FLAG(std::string, tls_key, "", "TLS: the certificate's private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "mTLS: CA bundle (PEM) for client certificates; a verified certificate's common name is its user");
ABSL_FLAG(std::string, tls_ca, "",
          "the CA (PEM) that signed --tls-cert, handed to workers to verify this coordinator "
          "(default: the system roots)");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name workers check the certificate against (default: the host they dial, 127.0.0.1 "
          "for a wildcard --address)");
ABSL_FLAG(std::string, auth_tokens, "",
          "tokens file: lines 'sha256:<hex> USER ROLE' (qloractl hash-token); re-read on SIGHUP");
ABSL_FLAG(std::string, read_roots, "",
          "comma-separated folders jobs may read datasets and models from (default: anywhere)");
ABSL_FLAG(std::string, output_root, "", "the folder jobs' output_dir must lie in (default: anywhere)");
ABSL_FLAG(bool, confine_workers, true,
          "with --read-roots or --output-root, workers confine their own file accesses to the "
          "read roots and their job's output folder (Linux Landlock), so that a path swapped for "
          "a link after submit cannot lead out");
ABSL_FLAG(int, max_queued_jobs, qlora::coordinator::JobManagerOptions{}.max_queued_jobs,
          "refuse submissions (RESOURCE_EXHAUSTED) while this many jobs are queued");
ABSL_FLAG(int, max_restarts, qlora::coordinator::JobManagerOptions{}.default_max_restarts,
          "automatic restarts from the last checkpoint after a worker fails, for jobs whose file "
          "does not set trainer.max_restarts (0 = fail at once)");
ABSL_FLAG(double, restart_backoff_s,
          absl::ToDoubleSeconds(qlora::coordinator::JobManagerOptions{}.restart_backoff),
          "seconds before the first restart; each next one waits twice as long (at most 5 min)");
ABSL_FLAG(int, max_queued_jobs_per_user, 0, "the same per user (0 = no per-user cap)");
ABSL_FLAG(int, max_ended_jobs_per_user, 1000,
          "ended jobs each user keeps, newest first; older ones are forgotten: their rows, "
          "events, logs and outputs in the state folder (0 = keep all)");
ABSL_FLAG(absl::Duration, ended_job_retention, absl::ZeroDuration(),
          "forget ended jobs this long after they ended, e.g. 720h (0 = no age limit)");
ABSL_FLAG(int, max_streams, qlora::coordinator::JobServiceOptions{}.max_streams,
          "at most this many watch and log streams open at once");
ABSL_FLAG(int, max_streams_per_user, qlora::coordinator::JobServiceOptions{}.max_streams_per_user,
          "at most this many per user (0 = no per-user cap)");
ABSL_FLAG(std::string, health_address, "",
          "also serve grpc.health.v1 alone, in plaintext, on this host:port (for probes that cannot "
          "speak TLS, e.g. Kubernetes' grpc probe): only grpc.health (and its reflection) is served there");
ABSL_FLAG(std::string, ray_address, "",
          "a Ray cluster's dashboard, http://HEAD:8265: jobs with backend.type: ray run their "
          "workers there (needs --advertise-address)");
ABSL_FLAG(std::string, ray_python, "python3", "the Python with ray on the cluster's hosts");
ABSL_FLAG(std::string, ray_launcher_script, "",
          "path of qlora_ray_launcher.py on the cluster's hosts (default: beside qlora-worker)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port workers dial (default: --address; 127.0.0.1 for a wildcard address); "
          "a port of 0 means the bound port");
ABSL_FLAG(std::string, state_dir, "qlora-state", "folder for the job store, logs and outputs");
ABSL_FLAG(std::string, state_umask, "077",
          "octal file-mode creation mask for the state folder and the workers' outputs (077: "
          "private to this user; 027: also readable by the folder's group)");
ABSL_FLAG(int, cpu_workers, 0, "run jobs on this many CPU worker processes (machines without GPUs)");
ABSL_FLAG(std::string, gpus, "auto", "GPU ids to use, e.g. 0,1,2,3; 'auto' = every GPU; 'none' = no GPU");
ABSL_FLAG(std::string, worker_binary, "", "path of qlora-worker (default: beside this binary)");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once serving");
ABSL_FLAG(std::string, metrics_address, "",
          "also serve Prometheus /metrics and the read-only status page (/, /jobs/ID) over plain HTTP "
          "on this IP:port (port 0 picks a free one; off when empty); a non-loopback address needs "
          "--insecure, and with --auth-tokens every data request needs 'Authorization: Bearer'");
ABSL_FLAG(std::string, metrics_port_file, "", "write the bound --metrics-address port here once serving");
ABSL_FLAG(int, shutdown_grace_ms, 500, "NOT_SERVING period before the listener closes");
// The job manager's own defaults are the flags' defaults (one source of truth).
ABSL_FLAG(int, register_timeout_s,
          static_cast<int>(absl::ToInt64Seconds(qlora::coordinator::JobManagerOptions().register_timeout)),
          "seconds for spawned workers to register");
ABSL_FLAG(int, heartbeat_timeout_s,
          static_cast<int>(absl::ToInt64Seconds(qlora::coordinator::JobManagerOptions().heartbeat_timeout)),
          "seconds without a heartbeat before a worker counts as lost");

namespace {

std::vector<int> DetectGpus() {
  std::vector<int> gpus;
  // A restriction the coordinator was started with holds for its workers too.
  if (const char* visible = getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    for (absl::string_view part : absl::StrSplit(visible, ',', absl::SkipEmpty())) {
      int id;
      if (absl::SimpleAtoi(part, &id) && id >= 0) gpus.push_back(id);
    }
    return gpus;
  }
  std::error_code ec;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)entry;
    gpus.push_back(n++);
  }
  return gpus;
}

absl::StatusOr<std::vector<int>> ParseGpus(const std::string& spec) {
  if (spec == "auto") return DetectGpus();
  if (spec == "none" || spec.empty()) return std::vector<int>{};
  std::vector<int> gpus;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int id;
    if (!absl::SimpleAtoi(part, &id) || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: '", part, "' is not a GPU id"));
    }
    gpus.push_back(id);
  }
  return gpus;
}

// Accepts --cpu-workers as well as absl's --cpu_workers.
std::vector<char*> DashesToUnderscores(int argc, char** argv, std::vector<std::string>* storage) {
  storage->assign(argv, argv + argc);
  for (std::string& arg : *storage) {
    if (arg.rfind("--", 0) != 0) continue;
    for (size_t i = 2; i < arg.size() && arg[i] != '='; ++i) {
      if (arg[i] == '-') arg[i] = '_';
    }
  }
  std::vector<char*> out;
  for (std::string& arg : *storage) out.push_back(arg.data());
  return out;
}

std::string SelfDir() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
}

// The job manager's options from the flags.
absl::StatusOr<qlora::coordinator::JobManagerOptions> OptionsFromFlags() {
  absl::StatusOr<std::vector<int>> gpus = ParseGpus(absl::GetFlag(FLAGS_gpus));
  if (!gpus.ok()) return gpus.status();
  qlora::coordinator::JobManagerOptions options;
  options.state_dir = std::filesystem::absolute(absl::GetFlag(FLAGS_state_dir)).string();
  options.cpu_workers = absl::GetFlag(FLAGS_cpu_workers);
  if (options.cpu_workers == 0) options.gpus = *gpus;
  options.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  if (options.worker_binary.empty()) {
    // Installed side by side, or in the build tree (coordinator/ and worker/).
    options.worker_binary = SelfDir() + "/qlora-worker";
    if (!std::filesystem::exists(options.worker_binary)) options.worker_binary = SelfDir() + "/../worker/qlora-worker";
  }
  options.register_timeout = absl::Seconds(absl::GetFlag(FLAGS_register_timeout_s));
  options.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  options.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  absl::StatusOr<qlora::coordinator::PathRoots> roots =
      qlora::coordinator::ResolvePathRoots(absl::GetFlag(FLAGS_read_roots), absl::GetFlag(FLAGS_output_root));
  if (!roots.ok()) return roots.status();
  options.roots = *std::move(roots);
  options.max_queued_jobs_per_user = absl::GetFlag(FLAGS_max_queued_jobs_per_user);
  options.confine_workers = absl::GetFlag(FLAGS_confine_workers);
  options.max_ended_jobs_per_user = absl::GetFlag(FLAGS_max_ended_jobs_per_user);
  options.ended_job_retention = absl::GetFlag(FLAGS_ended_job_retention);
  options.default_max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.restart_backoff = absl::Seconds(absl::GetFlag(FLAGS_restart_backoff_s));
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    // Workers dial over TLS too; the CA and name are not secrets.
    options.worker_env[qlora::kTlsVariable] = "1";
    const std::string ca = absl::GetFlag(FLAGS_tls_ca);
    options.worker_env[qlora::kTlsCaVariable] = ca.empty() ? "" : std::filesystem::absolute(ca).string();
    options.worker_env[qlora::kTlsServerNameVariable] = absl::GetFlag(FLAGS_tls_server_name);
  }
  // Workers on other hosts do not inherit this environment: how NCCL and Gloo pick their network
  // interface (and NCCL's other settings) is passed on explicitly.
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    const std::string name = entry.substr(0, eq);
    if (eq != std::string::npos && (name.rfind("NCCL_", 0) == 0 || name == "GLOO_SOCKET_IFNAME")) {
      options.worker_env[name] = entry.substr(eq + 1);
    }
  }
  if (options.gpus.empty() && options.cpu_workers == 0) {
    options.cpu_workers = 1;
    fprintf(stderr, "qlora-coordinator: no GPUs found; running jobs on 1 CPU worker (see --cpu-workers)\n");
  }
  return options;
}

// Every flag, as the options RunCoordinator takes.
absl::StatusOr<qlora::coordinator::CoordinatorOptions> CoordinatorOptionsFromFlags() {
  qlora::coordinator::CoordinatorOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth.tokens_file = absl::GetFlag(FLAGS_auth_tokens);
  options.auth.client_certificates = !options.tls.client_ca_file.empty();
  options.health_address = absl::GetFlag(FLAGS_health_address);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  absl::StatusOr<qlora::coordinator::JobManagerOptions> manager = OptionsFromFlags();
  if (!manager.ok()) return manager.status();
  options.job_manager = *std::move(manager);
  if (const std::string ray_address = absl::GetFlag(FLAGS_ray_address); !ray_address.empty()) {
    qlora::coordinator::RayLauncherOptions ray;
    ray.address = ray_address;
    ray.python = absl::GetFlag(FLAGS_ray_python);
    ray.launcher_script = absl::GetFlag(FLAGS_ray_launcher_script);
    if (ray.launcher_script.empty()) {
      ray.launcher_script = (std::filesystem::path(options.job_manager.worker_binary).parent_path() /
                             "qlora_ray_launcher.py").string();
    }
    ray.placement_timeout = options.job_manager.register_timeout;
    ray.stop_grace = options.job_manager.stop_grace;
    options.ray = ray;
  }
  options.job_service.max_streams = absl::GetFlag(FLAGS_max_streams);
  options.job_service.max_streams_per_user = absl::GetFlag(FLAGS_max_streams_per_user);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  options.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  const std::string mask = absl::GetFlag(FLAGS_state_umask);
  char* end = nullptr;
  const unsigned long bits = std::strtoul(mask.c_str(), &end, 8);
  if (mask.empty() || *end != '\0' || bits > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state-umask: '", mask, "' is not an octal mode mask such as 077"));
  }
  // A mask that lets others (not only the group) read would expose every user's jobs.
  if ((bits & 007) != 007) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state-umask ", mask, " lets every local user reach the state folder; keep the last "
        "digit 7 (e.g. 077 or 027)"));
  }
  options.state_umask = static_cast<unsigned>(bits);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  qlora::ProgramFlagsOptions program;
  program.program = "qlora-coordinator";
  program.usage =
      "qlora-coordinator --address=HOST:PORT --state-dir=DIR [--cpu-workers=N | --gpus=0,1]\n"
      "Queues QLoRA fine-tuning jobs and runs each on one worker process per GPU (or CPU slot).";
  program.flag_files = {"coordinator_main.cc"};
  program.dashed_names = true;
  std::vector<std::string> arg_storage;
  std::vector<char*> args = DashesToUnderscores(argc, argv, &arg_storage);
  qlora::ParseProgramFlags(static_cast<int>(args.size()), args.data(), program);

  absl::StatusOr<qlora::coordinator::CoordinatorOptions> options = CoordinatorOptionsFromFlags();
  const absl::Status ran =
      options.ok() ? qlora::coordinator::RunCoordinator(*std::move(options)) : options.status();
  if (ran.ok()) return 0;
  fprintf(stderr, "qlora-coordinator: %s\n", std::string(ran.message()).c_str());
  return options.ok() && ran.code() != absl::StatusCode::kInvalidArgument ? 1 : 2;
}
