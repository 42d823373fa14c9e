// RunGenerationSession: the task from the coordinator, RunGeneration, each piece reported back.
#include "worker/service/generation_session.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/config/job_config_parser.h"
#include "common/text/utf8.h"
#include "worker/run/generation_request.h"
#include "worker/service/generation_client.h"

namespace qlora::worker {
namespace {

void Log(const std::string& line) {
  fprintf(stderr, "[generate] %s\n", line.c_str());
  fflush(stderr);
}

GenerationConfig FromProto(const v1::GenerationParameters& p) {
  GenerationConfig g;
  if (p.has_max_new_tokens()) g.max_new_tokens = p.max_new_tokens();
  if (p.has_min_new_tokens()) g.min_new_tokens = p.min_new_tokens();
  if (p.has_do_sample()) g.do_sample = p.do_sample();
  if (p.has_temperature()) g.temperature = p.temperature();
  if (p.has_top_k()) g.top_k = p.top_k();
  if (p.has_top_p()) g.top_p = p.top_p();
  if (p.has_repetition_penalty()) g.repetition_penalty = p.repetition_penalty();
  return g;
}

}  // namespace

int RunGenerationSession(const std::string& coordinator_address, const std::string& session_id,
                         const std::string& startup_token, const std::string& device,
                         const std::atomic<bool>& stop_requested, const GenerationRunner& run) {
  absl::StatusOr<std::unique_ptr<GenerationClient>> client =
      GenerationClient::Connect(coordinator_address, session_id, startup_token);
  if (!client.ok()) {
    Log(absl::StrCat("cannot dial the coordinator: ", client.status().ToString()));
    return 3;
  }
  absl::StatusOr<v1::GenerationTask> task = (*client)->Task();
  if (!task.ok()) {
    Log(absl::StrCat("no task: ", task.status().ToString()));
    return 3;
  }
  auto fail = [&](const absl::Status& status) {
    Log(absl::StrCat("generation failed: ", status.ToString()));
    if (absl::Status sent = (*client)->ReportFailure(status); !sent.ok()) {
      Log(absl::StrCat("failure not delivered: ", sent.ToString()));
    }
    return 1;
  };
  absl::StatusOr<JobConfig> job = ParseResolvedJobConfig(task->resolved_config_yaml());
  if (!job.ok()) return fail(job.status());
  GenerationRequest request;
  request.job = *std::move(job);
  request.adapter_dir = task->adapter_dir();
  request.prompts.assign(task->prompts().begin(), task->prompts().end());
  request.parameters = FromProto(task->parameters());
  if (task->parameters().has_seed()) request.seed = task->parameters().seed();
  request.stop.assign(task->parameters().stop().begin(), task->parameters().stop().end());
  Log(absl::StrCat(request.prompts.size(), " prompt(s) with the adapter in ", request.adapter_dir));
  const absl::Status status = run(
      request, device,
      [&](const GeneratedPiece& piece) -> absl::StatusOr<bool> {
        if (stop_requested.load()) return false;
        v1::GeneratedText proto;
        proto.set_prompt_index(piece.prompt_index);
        // Bytes that decode to no character (a byte-level model may emit them) as U+FFFD: a
        // proto string must be UTF-8.
        proto.set_text(ValidUtf8(piece.text));
        proto.set_done(piece.done);
        proto.set_finish_reason(piece.finish_reason);
        proto.set_prompt_tokens(piece.prompt_tokens);
        proto.set_generated_tokens(piece.generated_tokens);
        return (*client)->Report(proto);
      });
  if (!status.ok()) return fail(status);
  Log("done");
  return 0;
}

}  // namespace qlora::worker
