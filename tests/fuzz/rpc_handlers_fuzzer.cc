// Fuzz target: the coordinator's RPC handlers (JobService and WorkerService), called directly on
// a fresh coordinator per input (rpc_fuzz_env.h). The input is up to 8 calls, each
// [selector byte][length: 2 bytes little-endian][that many bytes: the serialized request]; the
// selector (modulo 12) picks the RPC. After each call the manager runs one scheduling pass, so submitted
// jobs start (their workers only recorded) and worker calls reach running jobs.
// Fix-ups that keep the fuzzer inside its folder and its time:
//  - a submission without base_dir gets the environment's folder (model/, train.jsonl, ... there);
//  - an accepted job whose output folder lies outside that folder is cancelled before it can
//    start (a start creates the output folder);
//  - a worker's startup_token "@N" becomes the token of the N-th launched worker (N = 0-9), so
//    calls get past authentication;
//  - StoreGet waits at most 5 ms. Not called: GetAssignment (waits up to 10 minutes for the
//    rendezvous), WatchJob and StreamLogs (streams: a grpc::ServerWriter only exists inside a
//    server).
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/rpc_fuzz_env.h"

namespace {

using qlora::fuzz::RpcFuzzEnv;
namespace v1 = qlora::v1;

constexpr int kMaxCalls = 8;

// Parses `bytes` as a Request, lets `fix` adjust it, calls `handler` on a fresh context.
template <typename Request, typename Response, typename Service, typename Fix>
void Call(const std::string& bytes, Service* service,
          grpc::Status (Service::*handler)(grpc::ServerContext*, const Request*, Response*),
          Fix fix) {
  Request request;
  if (!request.ParseFromString(bytes)) return;
  fix(&request);
  Response response;
  std::unique_ptr<grpc::ServerContext> context = qlora::fuzz::MakeServerContext();
  (void)(service->*handler)(context.get(), &request, &response);
}

template <typename Request, typename Response, typename Service>
void Call(const std::string& bytes, Service* service,
          grpc::Status (Service::*handler)(grpc::ServerContext*, const Request*, Response*)) {
  Call(bytes, service, handler, [](Request*) {});
}

// "@N" -> the N-th launched worker's token.
template <typename Request>
void FixToken(const RpcFuzzEnv& env, Request* request) {
  const std::string& token = request->startup_token();
  if (token.size() == 2 && token[0] == '@' && token[1] >= '0' && token[1] <= '9')
    request->set_startup_token(env.launcher().TokenOf(token[1] - '0'));
}

void Submit(RpcFuzzEnv& env, const std::string& bytes) {
  v1::SubmitJobRequest request;
  if (!request.ParseFromString(bytes)) return;
  if (request.base_dir().empty()) request.set_base_dir(env.root());
  v1::SubmitJobResponse response;
  std::unique_ptr<grpc::ServerContext> context = qlora::fuzz::MakeServerContext();
  if (!env.services().jobs->SubmitJob(context.get(), &request, &response).ok()) return;
  if (!absl::StartsWith(response.job().output_dir(), env.root() + "/"))
    (void)env.manager().Cancel(response.job().id());
}

void Dispatch(RpcFuzzEnv& env, uint8_t selector, const std::string& bytes) {
  using qlora::coordinator::JobServiceImpl;
  using qlora::coordinator::WorkerServiceImpl;
  JobServiceImpl* jobs = env.services().jobs.get();
  WorkerServiceImpl* workers = env.services().workers.get();
  auto token = [&env](auto* request) { FixToken(env, request); };
  switch (selector % 12) {
    case 0: return Submit(env, bytes);
    case 1:
      return Call(bytes, jobs, &JobServiceImpl::ValidateJob, [&env](v1::SubmitJobRequest* r) {
        if (r->base_dir().empty()) r->set_base_dir(env.root());
      });
    case 2: return Call(bytes, jobs, &JobServiceImpl::GetJob);
    case 3: return Call(bytes, jobs, &JobServiceImpl::ListJobs);
    case 4: return Call(bytes, jobs, &JobServiceImpl::CancelJob);
    case 5: return Call(bytes, workers, &WorkerServiceImpl::Register, token);
    case 6: return Call(bytes, workers, &WorkerServiceImpl::PublishNcclId, token);
    case 7: return Call(bytes, workers, &WorkerServiceImpl::Heartbeat, token);
    case 8: return Call(bytes, workers, &WorkerServiceImpl::ReportProgress, token);
    case 9: return Call(bytes, workers, &WorkerServiceImpl::ReportCompletion, token);
    case 10: return Call(bytes, workers, &WorkerServiceImpl::StoreSet, token);
    default:
      return Call(bytes, workers, &WorkerServiceImpl::StoreGet, [&env](v1::StoreGetRequest* r) {
        FixToken(env, r);
        // Zero or negative means the service's 60 s default: capped like any other.
        if (r->timeout_ms() <= 0 || r->timeout_ms() > 5) r->set_timeout_ms(5);
      });
  }
}

}  // namespace

// Once per process: protobuf's complaints about invalid UTF-8 in string fields are dropped (the
// handlers see such strings as a real server would), and the per-input state folders go to
// /dev/shm when $TMPDIR is unset: SQLite's syncs on a disk cut the rate five-fold.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
  struct stat shm {};
  if (std::getenv("TMPDIR") == nullptr && ::stat("/dev/shm", &shm) == 0 &&
      S_ISDIR(shm.st_mode) && ::access("/dev/shm", W_OK) == 0)
    ::setenv("TMPDIR", "/dev/shm", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RpcFuzzEnv env;
  size_t at = 0;
  for (int call = 0; call < kMaxCalls && at + 3 <= size; ++call) {
    const uint8_t selector = data[at];
    const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    Dispatch(env, selector, std::string(reinterpret_cast<const char*>(data + at + 3), length));
    at += 3 + length;
    env.manager().PollOnce();
  }
  return 0;
}
