// qloractl: the command-line client of the QLoRA training service (JobService over gRPC), plus
// `validate`, which checks a job file offline.
//
// Exit status: 0 ok; 1 the followed job FAILED or was CANCELLED; 2 usage error; 3 invalid job
// file or input; 4 no such job; 5 coordinator unavailable or deadline exceeded; 6 other errors;
// 7 not authenticated (UNAUTHENTICATED) or not allowed (PERMISSION_DENIED).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "cli/cli_args.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/event_json.h"
#include "cli/generate_command.h"
#include "cli/progress.h"
#include "common/auth/token_hash.h"
#include "common/config/job_config_emit.h"
#include "common/config/job_config_parser.h"
#include "common/config/job_config_schema.h"
#include "common/config/job_file_reference.h"
#include "common/config/yaml_overrides.h"
#include "common/posix_files.h"
#include "common/program/version.h"
#include "common/rpc/worker_protocol_convert.h"
#include "common/train_summary_text.h"
#include "worker/data/data_preview.h"
#include "worker/data/tokenizer.h"
#include "qlora/v1/job_service.grpc.pb.h"

namespace qlora::cli {
namespace {

enum Exit {
  kOk = 0, kJobFailed = 1, kUsage = 2, kInvalid = 3, kNotFound = 4, kUnavailable = 5, kOther = 6, kDenied = 7
};

int ExitFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return kOk;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: return kInvalid;
    case grpc::StatusCode::NOT_FOUND: return kNotFound;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED: return kUnavailable;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED: return kDenied;
    default: return kOther;
  }
}

int ReportError(const grpc::Status& s) {
  fprintf(stderr, "qloractl: %s\n", s.error_message().c_str());
  return ExitFor(s.error_code());
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

void PrintJob(const v1::Job& job, bool json) {
  if (json) {
    printf("%s\n", ToJson(job).c_str());
    return;
  }
  printf("id:          %s\n", job.id().c_str());
  if (!job.name().empty()) printf("name:        %s\n", job.name().c_str());
  if (!job.owner().empty()) printf("owner:       %s\n", job.owner().c_str());
  printf("state:       %s (%s)\n", StateName(job.state()), job.state_reason_code().c_str());
  if (!job.state_message().empty()) printf("message:     %s\n", job.state_message().c_str());
  printf("workers:     %d\nzero stage:  %d\n", job.num_workers(), job.zero_stage());
  printf("output:      %s\n", job.output_dir().c_str());
  if (job.restarts() > 0) {
    printf("restarts:    %d (%s)\n", job.restarts(),
           job.restart_causes_size() > 0 ? job.restart_causes(job.restart_causes_size() - 1).c_str() : "");
  }
  if (!job.adapter_path().empty()) printf("adapter:     %s\n", job.adapter_path().c_str());
  if (!job.merged_path().empty()) printf("merged:      %s\n", job.merged_path().c_str());
  printf("progress:    %s\n", ProgressLine(job).c_str());
  for (const v1::Progress& p : job.progress()) {
    const v1::RecordReport& e = p.epoch_records();
    const v1::RecordReport& t = p.total_records();
    printf("records:     rank %d epoch %d: %lld trained, %lld left over, %lld malformed, %lld without "
           "target; all epochs: %lld trained, %lld left over, %lld malformed, %lld without target\n",
           p.rank(), p.epoch(), static_cast<long long>(e.trained()), static_cast<long long>(e.left_over()),
           static_cast<long long>(e.malformed()), static_cast<long long>(e.without_target()),
           static_cast<long long>(t.trained()), static_cast<long long>(t.left_over()),
           static_cast<long long>(t.malformed()), static_cast<long long>(t.without_target()));
    const std::string checkpoint = CheckpointLine(p);
    if (!checkpoint.empty()) printf("checkpoint:  %s\n", checkpoint.c_str());
    const std::string base_weights = BaseWeightsLine(p);
    if (!base_weights.empty()) printf("weights:     %s\n", base_weights.c_str());
  }
  if (job.has_summary()) printf("summary:     %s\n", FormatTrainSummary(FromProto(job.summary())).c_str());
}

// Streams a job's events until it ends; returns the exit status for its final state.
int Watch(Client& client, const std::string& id, bool json) {
  v1::WatchJobRequest req;
  req.set_id(id);
  // JSON is for scripts: the whole history first (every stored event), then what follows.
  req.set_from_start(json);
  ProgressPrinter printer(isatty(STDOUT_FILENO) != 0);
  EventJson lines;
  int64_t after = 0;
  for (int attempt = 0; attempt < 30; ++attempt) {
    grpc::ClientContext ctx;
    client.Prepare(&ctx, /*with_deadline=*/false);
    req.set_after_sequence(after);
    if (after > 0) req.set_from_start(false);  // resuming after a disconnect
    auto reader = client.stub()->WatchJob(&ctx, req);
    v1::WatchJobResponse msg;
    v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
    while (reader->Read(&msg)) {
      after = std::max(after, msg.event().sequence());
      last = msg.job().state();
      if (json) {
        for (const std::string& line : lines.Add(msg)) printf("%s\n", line.c_str());
      } else {
        printf("%s", printer.Update(msg.job()).c_str());
        const std::string& reason = msg.event().reason_code();
        if (reason == "RECORDS_WITHOUT_TARGET" || reason == "WORKER_NOTICE") {  // said once, not redrawn
          printf("%swarning: %s\n", isatty(STDOUT_FILENO) != 0 ? "\n" : "", msg.event().message().c_str());
        }
      }
      fflush(stdout);
    }
    grpc::Status s = reader->Finish();
    if (IsTerminal(last)) {
      for (const std::string& line : lines.Flush()) printf("%s\n", line.c_str());
      printf("%s", printer.Finish().c_str());
      if (!json) {
        grpc::ClientContext gctx;
        client.Prepare(&gctx);
        v1::GetJobRequest g;
        g.set_id(id);
        v1::Job job;
        if (client.stub()->GetJob(&gctx, g, &job).ok()) {
          printf("%s %s: %s\n", job.id().c_str(), StateName(job.state()), job.state_message().c_str());
        }
      }
      return last == v1::JOB_STATE_SUCCEEDED ? kOk : kJobFailed;
    }
    if (!s.ok() && s.error_code() != grpc::StatusCode::UNAVAILABLE) return ReportError(s);
    if (!s.ok()) sleep(1);  // the coordinator restarted: resume after the last event seen
  }
  fprintf(stderr, "qloractl: lost the coordinator while watching %s\n", id.c_str());
  return kUnavailable;
}

// The job file a.positional[0] with the KEY.PATH=VALUE overrides after it applied.
struct JobText {
  std::string yaml;
  std::string source_name;  // names the text in error messages
};

// `continued_yaml`: the job file when none is named (submit --resume-from JOB with overrides
// only: JOB's resolved file).
absl::StatusOr<JobText> JobTextOf(const ParsedArgs& a, const std::string& continued_yaml = "",
                                  const std::string& continued_name = "") {
  const bool file_named = continued_name.empty();
  absl::StatusOr<std::string> yaml = file_named ? ReadFile(a.positional[0]) : continued_yaml;
  if (!yaml.ok()) return yaml.status();
  const std::string source = file_named ? a.positional[0] : continued_name;
  std::vector<YamlOverride> overrides;
  if (!file_named) overrides.push_back({{"trainer", "resume_from_checkpoint"}, "\"\""});
  for (size_t i = file_named ? 1 : 0; i < a.positional.size(); ++i) {
    absl::StatusOr<YamlOverride> o = ParseOverride(a.positional[i]);
    if (!o.ok()) return o.status();
    overrides.push_back(*std::move(o));
  }
  if (overrides.empty()) return JobText{*std::move(yaml), source};
  absl::StatusOr<std::string> overridden = ApplyOverrides(*yaml, overrides);
  if (!overridden.ok()) return overridden.status();
  // Line numbers in errors are those of the rewritten text, not of the file.
  return JobText{*std::move(overridden), absl::StrCat(source, " with overrides")};
}

// The submission of the job file a.positional[0] (and its overrides). Relative paths, on the
// command line and in the file, are the user's, not the coordinator's.
absl::StatusOr<v1::SubmitJobRequest> SubmissionOf(const ParsedArgs& a, const std::string& continued_yaml = "",
                                                  const std::string& continued_name = "") {
  v1::SubmitJobRequest req;
  req.set_resume_from(a.Get("--resume-from"));
  // submit --resume-from JOB alone: the coordinator runs JOB's resolved file.
  if (!a.positional.empty() || !continued_name.empty()) {
    absl::StatusOr<JobText> job = JobTextOf(a, continued_yaml, continued_name);
    if (!job.ok()) return job.status();
    req.set_job_yaml(job->yaml);
    req.set_source_name(job->source_name);
  }
  char cwd_buffer[4096];
  const std::string cwd = getcwd(cwd_buffer, sizeof(cwd_buffer)) ? cwd_buffer : "";
  req.set_base_dir(cwd);
  auto absolute = [&](const std::string& p) {
    return p.empty() || p[0] == '/' || cwd.empty() ? p : absl::StrCat(cwd, "/", p);
  };
  req.set_dataset(absolute(a.Get("--dataset")));
  req.set_validation_dataset(absolute(a.Get("--validation-dataset")));
  req.set_name(a.Get("--name"));
  return req;
}

int Submit(Client& client, const ParsedArgs& a, bool json) {
  const std::string continued = a.Get("--resume-from");
  if (a.positional.empty() && continued.empty()) {
    fprintf(stderr, "qloractl submit: expected a job file (qloractl submit --help)\n");
    return kUsage;
  }
  // Overrides without a job file apply to the continued job's resolved file.
  std::string continued_yaml, continued_name;
  if (!continued.empty() && !a.positional.empty() && IsOverrideArgument(a.positional[0])) {
    v1::GetJobRequest get;
    get.set_id(continued);
    v1::Job job;
    grpc::ClientContext ctx;
    client.Prepare(&ctx);
    if (grpc::Status s = client.stub()->GetJob(&ctx, get, &job); !s.ok()) return ReportError(s);
    continued_yaml = job.resolved_config_yaml();
    continued_name = absl::StrCat(continued, "'s resolved job file");
  }
  absl::StatusOr<v1::SubmitJobRequest> submission = SubmissionOf(a, continued_yaml, continued_name);
  if (!submission.ok()) {
    fprintf(stderr, "qloractl: %s\n", std::string(submission.status().message()).c_str());
    return kInvalid;
  }
  const v1::SubmitJobRequest& req = *submission;
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  grpc::Status s = client.stub()->SubmitJob(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {  // a dataset or model path, not a job
    fprintf(stderr, "qloractl: %s\n", s.error_message().c_str());
    return kInvalid;
  }
  if (!s.ok()) return ReportError(s);
  if (json) printf("%s\n", ToJson(resp.job()).c_str()); else printf("%s\n", resp.job().id().c_str());
  fflush(stdout);
  if (!continued.empty() && !json) fprintf(stderr, "%s\n", resp.job().state_message().c_str());
  return a.Has("--follow") ? Watch(client, resp.job().id(), json) : kOk;
}

// The data as a worker would read it, for validate's text: the first records built with the
// base model's tokenizer (data_preview.h); a record that would fail the job is the error.
absl::StatusOr<std::string> DataPreviewLines(const JobConfig& config) {
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tokenizer = data::LoadTokenizer(config.base_model_path);
  if (!tokenizer.ok()) {
    return absl::StrCat("# data: not read (the base model's tokenizer: ", tokenizer.status().message(), ")\n");
  }
  absl::StatusOr<data::DataPreview> preview = data::PreviewJobData(config, **tokenizer);
  if (!preview.ok()) return preview.status();
  return data::DataPreviewText(*preview);
}

// validate --remote: the coordinator resolves the job as it would at submit (its datasets, its
// workers, its Ray cluster) and says where it would run.
int ValidateRemote(Client& client, const ParsedArgs& a, bool json) {
  absl::StatusOr<v1::SubmitJobRequest> submission = SubmissionOf(a);
  if (!submission.ok()) {
    fprintf(stderr, "qloractl: %s\n", std::string(submission.status().message()).c_str());
    return kInvalid;
  }
  v1::ValidateJobResponse resp;
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  grpc::Status s = client.stub()->ValidateJob(&ctx, *submission, &resp);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND || s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
      s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    fprintf(stderr, "qloractl: %s\n", s.error_message().c_str());
    return kInvalid;
  }
  if (!s.ok()) return ReportError(s);
  if (json) {
    printf("%s\n", ToJson(resp).c_str());
    return kOk;
  }
  // The coordinator checked the first records' format and columns; with the job's files here
  // too, the token-level sample (cut, target-less, one example) is added.
  std::string data_text;
  if (!a.Has("--no-data")) {
    ParseOptions options;
    options.source_name = submission->source_name();
    options.dataset_override = submission->dataset();
    options.validation_dataset_override = submission->validation_dataset();
    options.base_dir = submission->base_dir();
    absl::StatusOr<JobConfig> local = ParseJobConfig(submission->job_yaml(), options);
    absl::StatusOr<std::string> preview =
        local.ok() ? DataPreviewLines(*local)
                   : absl::StatusOr<std::string>(
                         "# data: the coordinator checked the first records; the job's files are not "
                         "all on this machine, so the token-level sample is left out\n");
    if (!preview.ok()) {
      fprintf(stderr, "qloractl: %s\n", std::string(preview.status().message()).c_str());
      return kInvalid;
    }
    data_text = *preview;
  }
  printf("%s: valid\n%s%s", a.positional[0].c_str(), data_text.c_str(), resp.resolved_config_yaml().c_str());
  return kOk;
}

int Validate(const ParsedArgs& a, bool json) {
  absl::StatusOr<JobText> job = JobTextOf(a);
  if (!job.ok()) {
    fprintf(stderr, "qloractl: %s\n", std::string(job.status().message()).c_str());
    return kInvalid;
  }
  ParseOptions options;
  options.source_name = job->source_name;
  options.dataset_override = a.Get("--dataset");
  options.validation_dataset_override = a.Get("--validation-dataset");
  absl::StatusOr<JobConfig> config = ParseJobConfig(job->yaml, options);
  if (!config.ok()) {
    fprintf(stderr, "qloractl: %s\n", std::string(config.status().message()).c_str());
    return config.status().code() == absl::StatusCode::kNotFound ||
                   config.status().code() == absl::StatusCode::kInvalidArgument ||
                   config.status().code() == absl::StatusCode::kFailedPrecondition
               ? kInvalid
               : kOther;
  }
  const std::string resolved = EmitResolvedJobYaml(*config);
  absl::StatusOr<std::string> data_text = a.Has("--no-data") ? std::string() : DataPreviewLines(*config);
  if (!data_text.ok()) {
    fprintf(stderr, "qloractl: %s\n", std::string(data_text.status().message()).c_str());
    return kInvalid;
  }
  if (json) {
    v1::ValidateJobResponse r;
    r.set_resolved_config_yaml(resolved);
    printf("%s\n", ToJson(r).c_str());
  } else {
    printf("%s: valid\n# runs on: %s (--remote asks the coordinator)\n%s%s", a.positional[0].c_str(),
           config->backend.type == BackendType::kRay ? "the coordinator's Ray cluster (backend.type: ray)"
                                                     : "the coordinator's host (backend.type: local)",
           data_text->c_str(), resolved.c_str());
  }
  return kOk;
}

int Logs(Client& client, const ParsedArgs& a) {
  if (a.positional.size() != 1) {
    fprintf(stderr, "qloractl logs: expected a job id\n");
    return kUsage;
  }
  v1::StreamLogsRequest req;
  req.set_id(a.positional[0]);
  req.set_rank(a.values.count("--rank") ? std::atoi(a.Get("--rank").c_str()) : -1);
  req.set_follow(a.Has("--follow"));
  grpc::ClientContext ctx;
  client.Prepare(&ctx, /*with_deadline=*/!req.follow());
  auto reader = client.stub()->StreamLogs(&ctx, req);
  v1::LogChunk chunk;
  const bool prefix = req.rank() < 0;
  while (reader->Read(&chunk)) {
    if (!prefix) {
      fwrite(chunk.data().data(), 1, chunk.data().size(), stdout);
    } else {
      for (absl::string_view line : absl::StrSplit(chunk.data(), '\n', absl::SkipEmpty())) {
        printf("rank %d | %.*s\n", chunk.rank(), static_cast<int>(line.size()), line.data());
      }
    }
    fflush(stdout);
  }
  grpc::Status s = reader->Finish();
  return s.ok() ? kOk : ReportError(s);
}

// Reads a token from stdin and prints its hash, or with --user the whole tokens-file line
// (the coordinator's --auth-tokens): "sha256:<hex> USER ROLE".
int HashToken(const ParsedArgs& a) {
  std::string token;
  std::getline(std::cin, token);
  token = std::string(absl::StripAsciiWhitespace(token));
  if (token.size() < 16) {
    fprintf(stderr, "qloractl hash-token: give a token of at least 16 characters on stdin, e.g.\n"
                    "  head -c 32 /dev/urandom | base64 | tee alice.token | qloractl hash-token --user alice\n");
    return kUsage;
  }
  const std::string role = a.Get("--role", "user");
  if (role != "user" && role != "admin") {
    fprintf(stderr, "qloractl hash-token: --role is user or admin\n");
    return kUsage;
  }
  if (a.values.count("--user")) {
    printf("%s %s %s\n", TokenHash(token).c_str(), a.Get("--user").c_str(), role.c_str());
  } else {
    printf("%s\n", TokenHash(token).c_str());
  }
  return kOk;
}

// Prints the job-file reference: one key (or the top level) as text, or all of it as Markdown.
int Explain(const ParsedArgs& a) {
  if (a.Has("--markdown")) {
    printf("%s", JobFileReferenceMarkdown().c_str());
    return kOk;
  }
  if (a.positional.size() > 1) {
    fprintf(stderr, "qloractl explain: give at most one KEY (qloractl explain --help)\n");
    return kUsage;
  }
  absl::StatusOr<std::string> text = ExplainJobFileKey(a.positional.empty() ? "" : a.positional[0]);
  if (!text.ok()) {
    fprintf(stderr, "qloractl explain: %s\n", std::string(text.status().message()).c_str());
    return kNotFound;
  }
  printf("%s", text->c_str());
  return kOk;
}

// " (did you mean 'get'?)" for a typo of a command or a peer's name for one; "" when none is close.
std::string DidYouMean(const std::string& typed) {
  // What users of other tools type for these commands (kubectl, ray job, docker).
  static const std::pair<const char*, const char*> kHabits[] = {
      {"status", "get"}, {"describe", "get"}, {"show", "get"},  {"ls", "list"},
      {"ps", "list"},    {"stop", "cancel"},  {"kill", "cancel"}, {"delete", "cancel"},
      {"rm", "cancel"},  {"run", "submit"},   {"train", "submit"}, {"log", "logs"},
      {"tail", "logs"},  {"follow", "watch"}, {"check", "validate"}, {"lint", "validate"}};
  for (const auto& [habit, command] : kHabits) {
    if (absl::AsciiStrToLower(typed) == habit) return absl::StrCat(" (did you mean '", command, "'?)");
  }
  std::vector<std::string> names;
  for (const CommandSpec& c : Commands()) names.emplace_back(c.name);
  const config_internal::NearestName nearest = config_internal::Nearest(typed, names);
  return nearest.typo ? absl::StrCat(" (did you mean '", nearest.name, "'?)") : "";
}

int RunWithClient(Client& client, const std::string& command, const ParsedArgs& a, bool json);

int Run(const std::vector<std::string>& argv) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(argv, AllValueFlags(), AllSwitchFlags(), AllAliases());
  if (!parsed.ok()) {
    fprintf(stderr, "qloractl: %s (qloractl --help)\n", std::string(parsed.status().message()).c_str());
    return kUsage;
  }
  ParsedArgs a = *parsed;
  if (a.Has("--version")) {
    printf("qloractl %s\n", ProjectVersion());
    return kOk;
  }
  if (a.positional.empty()) {
    printf("%s", OverviewHelp().c_str());
    return a.Has("--help") ? kOk : kUsage;
  }
  const std::string command = a.positional[0];
  a.positional.erase(a.positional.begin());
  const CommandSpec* spec = FindCommand(command == "help" && !a.positional.empty() ? a.positional[0] : command);
  if (command == "help") {
    if (a.positional.empty()) return printf("%s", OverviewHelp().c_str()), kOk;
    if (spec == nullptr) {
      return fprintf(stderr, "qloractl: no command '%s'%s\n", a.positional[0].c_str(),
                     DidYouMean(a.positional[0]).c_str()),
             kUsage;
    }
    return printf("%s", CommandHelp(*spec).c_str()), kOk;
  }
  if (spec == nullptr) {
    fprintf(stderr, "qloractl: unknown command '%s'%s\n\n%s", command.c_str(),
            DidYouMean(command).c_str(), OverviewHelp().c_str());
    return kUsage;
  }
  if (a.Has("--help")) {
    printf("%s", CommandHelp(*spec).c_str());
    return kOk;
  }
  if (absl::Status flags = CheckFlagsFor(*spec, a); !flags.ok()) {
    fprintf(stderr, "%s\n", std::string(flags.message()).c_str());
    return kUsage;
  }
  const std::string output = a.Get("--output", "text");
  if (output != "text" && output != "json") {
    fprintf(stderr, "qloractl: -o must be text or json\n");
    return kUsage;
  }
  const bool json = output == "json";
  if (command == "validate" && a.positional.empty()) {
    return fprintf(stderr, "qloractl validate: expected a job file (qloractl validate --help)\n"), kUsage;
  }
  if (command == "validate" && !a.Has("--remote")) return Validate(a, json);
  if (command == "hash-token") return HashToken(a);
  if (command == "explain") return Explain(a);

  absl::StatusOr<std::unique_ptr<Client>> connected = Client::FromArgs(a);
  if (!connected.ok()) {
    fprintf(stderr, "qloractl: %s\n", std::string(connected.status().message()).c_str());
    return kUsage;
  }
  Client& client = **connected;
  const int code = RunWithClient(client, command, a, json);
  if (code == kUnavailable) {
    fprintf(stderr,
            "qloractl: nothing answered at %s: is qlora-coordinator running there? Point --address "
            "(or QLORA_ADDRESS) at the address it listens on\n",
            client.address().c_str());
  }
  return code;
}

int RunWithClient(Client& client, const std::string& command, const ParsedArgs& a, bool json) {
  if (command == "submit") return Submit(client, a, json);
  if (command == "validate") return ValidateRemote(client, a, json);
  if (command == "watch") {
    if (a.positional.size() != 1) return fprintf(stderr, "qloractl watch: expected a job id\n"), kUsage;
    return Watch(client, a.positional[0], json);
  }
  if (command == "logs") return Logs(client, a);
  if (command == "generate") return RunGenerate(client, a, json, ReportError);
  if (command == "get" || command == "cancel") {
    if (a.positional.size() != 1) return fprintf(stderr, "qloractl %s: expected a job id\n", command.c_str()), kUsage;
    grpc::ClientContext ctx;
    client.Prepare(&ctx);
    v1::Job job;
    grpc::Status s;
    if (command == "get") {
      v1::GetJobRequest req;
      req.set_id(a.positional[0]);
      s = client.stub()->GetJob(&ctx, req, &job);
    } else {
      v1::CancelJobRequest req;
      req.set_id(a.positional[0]);
      s = client.stub()->CancelJob(&ctx, req, &job);
    }
    if (!s.ok()) return ReportError(s);
    PrintJob(job, json);
    return kOk;
  }
  if (command == "list") {
    v1::ListJobsRequest req;
    for (absl::string_view st : absl::StrSplit(a.Get("--state"), ',', absl::SkipEmpty())) {
      v1::JobState state;
      if (!v1::JobState_Parse(absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(st)), &state)) {
        fprintf(stderr, "qloractl list: unknown state '%.*s'\n", static_cast<int>(st.size()), st.data());
        return kUsage;
      }
      req.add_states(state);
    }
    // Every page, each with its own deadline.
    v1::ListJobsResponse resp;
    req.set_page_size(500);
    do {
      grpc::ClientContext ctx;
      client.Prepare(&ctx);
      v1::ListJobsResponse page;
      grpc::Status s = client.stub()->ListJobs(&ctx, req, &page);
      if (!s.ok()) return ReportError(s);
      for (v1::Job& j : *page.mutable_jobs()) resp.add_jobs()->Swap(&j);
      req.set_page_token(page.next_page_token());
    } while (!req.page_token().empty());
    if (json) {
      printf("%s\n", ToJson(resp).c_str());
    } else {
      printf("%-12s %-10s %-12s %-24s %s\n", "ID", "STATE", "OWNER", "REASON", "NAME");
      for (const v1::Job& j : resp.jobs()) {
        printf("%-12s %-10s %-12s %-24s %s\n", j.id().c_str(), StateName(j.state()), j.owner().c_str(),
               j.state_reason_code().c_str(), j.name().c_str());
      }
    }
    return kOk;
  }
  fprintf(stderr, "qloractl: unknown command '%s'\n", command.c_str());
  return kUsage;
}

}  // namespace
}  // namespace qlora::cli

int main(int argc, char** argv) {
  return qlora::cli::Run(std::vector<std::string>(argv + 1, argv + argc));
}
