// How one rank of a job is started: the qlora-worker command line, its environment (the GPU it
// sees, or its share of the CPU cores) and its log file. A pure function of its inputs, so the
// launch of every rank can be checked without starting a process.
#pragma once

#include <map>
#include <vector>
#include <string>

#include "common/worker_protocol.h"
#include "coordinator/launch/process_launcher.h"

namespace qlora::coordinator {

struct WorkerLaunchRequest {
  std::string worker_binary;         // path of qlora-worker
  std::string coordinator_address;   // host:port the worker dials
  std::string job_id;
  std::string job_dir;               // <state_dir>/jobs/<id>; logs go to <job_dir>/logs
  std::string startup_token;         // authenticates the worker's calls
  int rank = 0;
  int world_size = 1;
  bool use_gpu = false;
  int slot = 0;                      // the local GPU id (use_gpu), else the CPU slot number
  int threads_per_worker = 1;        // a CPU worker's OMP_NUM_THREADS
  // Passed to every worker as is: how to dial the coordinator over TLS (QLORA_TLS_CA,
  // QLORA_TLS_SERVER_NAME; see common/rpc/coordinator_channel.h). Never a secret.
  std::map<std::string, std::string> extra_env;
  // Non-empty: the worker confines its file accesses to these (--confine_read, --confine_write:
  // worker/service/file_confinement.h): the read roots, and the job's output folder.
  std::vector<std::string> confine_read;
  std::vector<std::string> confine_write;
};

// The log file of `rank` under `job_dir` (what `qloractl logs` reads).
std::string WorkerLogPath(const std::string& job_dir, int rank);

// The startup token travels in the environment (kWorkerTokenVariable), never in argv.
// A GPU worker sees only its GPU (CUDA_VISIBLE_DEVICES=<slot>, --device=cuda; on a Ray cluster
// the launcher there replaces it with the GPU Ray assigned); a CPU worker sees none
// (CUDA_VISIBLE_DEVICES="") and gets OMP_NUM_THREADS = threads_per_worker.
LaunchSpec BuildWorkerLaunchSpec(const WorkerLaunchRequest& request);

}  // namespace qlora::coordinator
