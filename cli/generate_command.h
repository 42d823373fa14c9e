// `qloractl generate JOB_ID --prompt TEXT | --prompts-file FILE [settings]`: text from a trained
// job, generated on a worker the coordinator starts, printed as it comes.
#pragma once

#include <functional>

#include <grpcpp/support/status.h>

#include "absl/status/statusor.h"
#include "cli/cli_args.h"
#include "cli/client.h"
#include "qlora/v1/job_service.pb.h"

namespace qlora::cli {

// The request the flags describe; INVALID_ARGUMENT naming a bad flag or an unreadable file.
// A prompts file holds one prompt a line (blank lines skipped); a line that is a JSON object
// gives the template's columns or a conversation (`messages`).
absl::StatusOr<v1::GenerateRequest> GenerateRequestFromArgs(const ParsedArgs& args);

// Text: each prompt's output as it streams (with a "--- prompt N ---" line before each when
// there are several). JSON: one line a prompt once done: prompt_index, prompt, text,
// finish_reason, prompt_tokens, generated_tokens. `report_error` prints a failed call and gives
// the exit status.
int RunGenerate(Client& client, const ParsedArgs& args, bool json,
                const std::function<int(const grpc::Status&)>& report_error);

}  // namespace qlora::cli
