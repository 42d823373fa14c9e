// JobService.Generate: checks the request and the caller's right to the job, finds the adapter
// (the job's final one, or a checkpoint's), and streams a generation session's text.
#include <sys/stat.h>

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_dirs.h"
#include "common/config/job_config_parser.h"
#include "coordinator/rpc/job_service.h"
#include "coordinator/rpc/proto_convert.h"

namespace qlora::coordinator {
namespace {

constexpr int kMaxPrompts = 256;
constexpr size_t kMaxPromptBytes = 256 * 1024;
constexpr int64_t kMaxNewTokens = 1 << 20;

absl::Status CheckRequest(const v1::GenerateRequest& r) {
  if (r.prompts().empty()) return absl::InvalidArgumentError("no prompt given");
  if (r.prompts_size() > kMaxPrompts) {
    return absl::InvalidArgumentError(absl::StrCat(r.prompts_size(), " prompts: at most ", kMaxPrompts, " a call"));
  }
  for (int i = 0; i < r.prompts_size(); ++i) {
    if (r.prompts(i).empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", i + 1, " is empty"));
    if (r.prompts(i).size() > kMaxPromptBytes) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i + 1, " has ", r.prompts(i).size(),
                                                     " bytes: at most ", kMaxPromptBytes));
    }
  }
  const v1::GenerationParameters& p = r.parameters();
  if (p.has_max_new_tokens() && (p.max_new_tokens() < 1 || p.max_new_tokens() > kMaxNewTokens)) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens must be in [1, ", kMaxNewTokens, "]"));
  }
  if (p.has_min_new_tokens() && p.min_new_tokens() < 0) {
    return absl::InvalidArgumentError("min_new_tokens must not be negative");
  }
  // 0 is greedy, as in job files; sampling at 0 is refused by CheckAgainstJob (either may ask).
  if (p.has_temperature() && !(p.temperature() >= 0)) {
    return absl::InvalidArgumentError("temperature must not be negative");
  }
  if (p.has_top_k() && p.top_k() < 0) return absl::InvalidArgumentError("top_k must not be negative");
  if (p.has_top_p() && !(p.top_p() > 0 && p.top_p() <= 1)) {
    return absl::InvalidArgumentError("top_p must be in (0, 1]");
  }
  if (p.has_repetition_penalty() && !(p.repetition_penalty() > 0)) {
    return absl::InvalidArgumentError("repetition_penalty must be above 0");
  }
  return absl::OkStatus();
}

// The request's settings over the job file's `generation:` section: sampling at temperature 0
// is refused here, before a worker loads the model, whichever of the two asked for what.
absl::Status CheckAgainstJob(const v1::GenerationParameters& p, const JobRecord& job) {
  GenerationConfig written;  // a stored copy that does not parse: the worker reports it
  if (absl::StatusOr<JobConfig> config = ParseResolvedJobConfig(job.resolved_config_yaml); config.ok()) {
    written = config->generation;
  }
  const std::optional<double> temperature =
      p.has_temperature() ? std::optional<double>(p.temperature()) : written.temperature;
  const bool sampling = p.has_do_sample() ? p.do_sample() : written.do_sample.value_or(false);
  if (sampling && temperature == 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature 0 with do_sample (", p.has_temperature() ? "temperature from the request" : "temperature from the job file",
        ", ", p.has_do_sample() ? "sampling from the request" : "sampling from the job file",
        "): sampling needs a temperature above 0"));
  }
  return absl::OkStatus();
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The adapter folder to generate with: the succeeded job's, or checkpoint `name` ("step-N",
// "checkpoint-N" or "N") of any job.
absl::StatusOr<std::string> AdapterFor(const JobRecord& job, const std::string& name) {
  if (name.empty()) {
    if (job.state != JobState::kSucceeded || job.adapter_path.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job.id, " is ", JobStateName(job.state),
          ": it has no final adapter; name one of its checkpoints (step-N)"));
    }
    return job.adapter_path;
  }
  absl::string_view digits = name;
  for (absl::string_view prefix : {"step-", "checkpoint-"}) absl::ConsumePrefix(&digits, prefix);
  int64_t step = 0;
  if (!absl::SimpleAtoi(digits, &step) || step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint '", name, "': expected step-N"));
  }
  const std::string dir = absl::StrCat(
      CheckpointDir(CheckpointsDir(job.output_dir, job.id, job.uid), step), "/", kCheckpointAdapterDir);
  if (!IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("job ", job.id, " has no checkpoint at step ", step));
  }
  return dir;
}

}  // namespace

grpc::Status JobServiceImpl::Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                                      grpc::ServerWriter<v1::GeneratedText>* writer) {
  if (sessions_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "generation is off");
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  absl::StatusOr<JobRecord> job = AccessibleJob(*caller, request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  if (absl::Status checked = CheckRequest(*request); !checked.ok()) return ToGrpc(checked);
  if (absl::Status checked = CheckAgainstJob(request->parameters(), *job); !checked.ok()) return ToGrpc(checked);
  absl::StatusOr<std::string> adapter = AdapterFor(*job, request->checkpoint());
  if (!adapter.ok()) return ToGrpc(adapter.status());
  std::optional<StreamLimit::Slot> slot;
  if (grpc::Status open = OpenStream(caller->user, &slot); !open.ok()) return open;

  GenerationStart start;
  start.job_id = job->id;
  start.job_dir = manager_->JobDir(job->id);
  start.confine_read = manager_->ReadRoots();
  start.confine_read.push_back(job->output_dir);
  start.task.set_resolved_config_yaml(job->resolved_config_yaml);
  start.task.set_adapter_dir(*adapter);
  *start.task.mutable_prompts() = request->prompts();
  *start.task.mutable_parameters() = request->parameters();
  absl::StatusOr<std::string> session = sessions_->Start(std::move(start));
  if (!session.ok()) return ToGrpc(session.status());
  absl::Status outcome;
  while (!context->IsCancelled()) {
    std::vector<v1::GeneratedText> pieces;
    bool finished = false;
    outcome = sessions_->Next(*session, absl::Now() + absl::Seconds(1), &pieces, &finished);
    if (!outcome.ok()) break;
    bool written = true;
    for (const v1::GeneratedText& piece : pieces) written = written && writer->Write(piece);
    if (!written || finished) break;
  }
  sessions_->End(*session);
  return ToGrpc(outcome);
}

}  // namespace qlora::coordinator
