// qloractl generate (see generate_command.h).
#include "cli/generate_command.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace qlora::cli {
namespace {

template <typename T>
absl::Status ParseNumber(const ParsedArgs& args, const char* flag, T* out, bool* set) {
  *set = args.values.count(flag) > 0;
  if (!*set) return absl::OkStatus();
  bool ok = false;
  if constexpr (std::is_same_v<T, double>) {
    ok = absl::SimpleAtod(args.Get(flag), out);
  } else {
    ok = absl::SimpleAtoi(args.Get(flag), out);
  }
  return ok ? absl::OkStatus()
            : absl::InvalidArgumentError(absl::StrCat(flag, ": not a number: '", args.Get(flag), "'"));
}

}  // namespace

absl::StatusOr<v1::GenerateRequest> GenerateRequestFromArgs(const ParsedArgs& args) {
  if (args.positional.size() != 1) return absl::InvalidArgumentError("expected one job id");
  v1::GenerateRequest request;
  request.set_job_id(args.positional[0]);
  request.set_checkpoint(args.Get("--checkpoint"));
  if (args.values.count("--prompt")) request.add_prompts(args.Get("--prompt"));
  if (args.values.count("--prompts-file")) {
    const std::string path = args.Get("--prompts-file");
    std::ifstream in(path);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("--prompts-file: cannot read ", path));
    std::string line;
    while (std::getline(in, line)) {
      if (!absl::StripAsciiWhitespace(line).empty()) request.add_prompts(line);
    }
  }
  if (request.prompts().empty()) {
    return absl::InvalidArgumentError("give --prompt TEXT or --prompts-file FILE");
  }
  v1::GenerationParameters& p = *request.mutable_parameters();
  bool set = false;
  int64_t integer = 0;
  double real = 0;
  uint64_t seed = 0;
  if (absl::Status s = ParseNumber(args, "--max-new-tokens", &integer, &set); !s.ok()) return s;
  if (set) p.set_max_new_tokens(integer);
  if (absl::Status s = ParseNumber(args, "--min-new-tokens", &integer, &set); !s.ok()) return s;
  if (set) p.set_min_new_tokens(integer);
  if (absl::Status s = ParseNumber(args, "--top-k", &integer, &set); !s.ok()) return s;
  if (set) p.set_top_k(integer);
  if (absl::Status s = ParseNumber(args, "--temperature", &real, &set); !s.ok()) return s;
  if (set) p.set_temperature(real);
  if (absl::Status s = ParseNumber(args, "--top-p", &real, &set); !s.ok()) return s;
  if (set) p.set_top_p(real);
  if (absl::Status s = ParseNumber(args, "--repetition-penalty", &real, &set); !s.ok()) return s;
  if (set) p.set_repetition_penalty(real);
  if (absl::Status s = ParseNumber(args, "--seed", &seed, &set); !s.ok()) return s;
  if (set) p.set_seed(seed);
  if (args.Has("--sample")) p.set_do_sample(true);
  if (args.Has("--greedy")) p.set_do_sample(false);
  if (args.values.count("--stop")) p.add_stop(args.Get("--stop"));
  return request;
}

int RunGenerate(Client& client, const ParsedArgs& args, bool json,
                const std::function<int(const grpc::Status&)>& report_error) {
  absl::StatusOr<v1::GenerateRequest> request = GenerateRequestFromArgs(args);
  if (!request.ok()) {
    fprintf(stderr, "qloractl generate: %s\n", std::string(request.status().message()).c_str());
    return 2;
  }
  grpc::ClientContext ctx;
  client.Prepare(&ctx, /*with_deadline=*/false);  // generation takes what it takes
  auto reader = client.stub()->Generate(&ctx, *request);
  v1::GeneratedText piece;
  std::string text;  // JSON: the current prompt's output so far
  int shown = -1;    // text: the prompt whose header was printed
  const bool several = request->prompts_size() > 1;
  while (reader->Read(&piece)) {
    if (json) {
      text += piece.text();
      if (!piece.done()) continue;
      nlohmann::json line = {{"prompt_index", piece.prompt_index()},
                             {"prompt", request->prompts(piece.prompt_index())},
                             {"text", text},
                             {"finish_reason", piece.finish_reason()},
                             {"prompt_tokens", piece.prompt_tokens()},
                             {"generated_tokens", piece.generated_tokens()}};
      printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      text.clear();
    } else {
      if (several && shown != piece.prompt_index()) {
        printf("%s--- prompt %d ---\n", shown >= 0 ? "\n" : "", piece.prompt_index() + 1);
        shown = piece.prompt_index();
      }
      fwrite(piece.text().data(), 1, piece.text().size(), stdout);
      if (piece.done()) printf("\n");
    }
    fflush(stdout);
  }
  const grpc::Status status = reader->Finish();
  return status.ok() ? 0 : report_error(status);
}

}  // namespace qlora::cli
