// qloractl's subcommand table and help texts (see commands.h).
#include "cli/commands.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace qlora::cli {
namespace {

// Flags every command takes.
const std::vector<FlagSpec>& CommonFlags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"--output", "-o", "text|json", "output format (default text)"},
      {"--help", "-h", "", "this help"},
  };
  return *flags;
}

// Flags of the commands that talk to the coordinator.
const std::vector<FlagSpec>& ConnectionFlags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"--address", "", "HOST:PORT", "the coordinator (default: $QLORA_ADDRESS, else 127.0.0.1:50051)"},
      {"--token-file", "", "FILE", "bearer token (default: $QLORA_TOKEN_FILE, else $QLORA_TOKEN)"},
      {"--tls", "", "", "TLS with the system's CA roots"},
      {"--tls-ca", "", "FILE", "TLS, checking the coordinator against this CA ($QLORA_TLS_CA)"},
      {"--tls-cert", "", "FILE", "client certificate for mTLS ($QLORA_TLS_CERT)"},
      {"--tls-key", "", "FILE", "its private key ($QLORA_TLS_KEY)"},
      {"--tls-server-name", "", "NAME", "the name the certificate must carry ($QLORA_TLS_SERVER_NAME)"},
      {"--timeout", "", "SECONDS", "deadline of each call (default 30; followed streams have none)"},
  };
  return *flags;
}

const FlagSpec kDataset{"--dataset", "", "PATH", "training data; replaces the file's dataset:"};
const FlagSpec kValidationDataset{"--validation-dataset", "", "PATH",
                                  "validation data; replaces the file's validation_dataset:"};

constexpr const char* kOverridesText =
    "KEY.PATH=VALUE arguments after the job file override its fields before it is checked or "
    "sent: dot-separated keys from the top of the file, the value read as YAML "
    "(trainer.learning_rate=1e-4, adapter.target_modules=[q_proj,v_proj], quantization=null). "
    "A missing map on the path is created; an unknown key is refused with the closest valid name.";

std::vector<CommandSpec>* MakeCommands() {
  return new std::vector<CommandSpec>{
      {"submit", "JOB.yaml [KEY.PATH=VALUE ...]", "send a job file to the coordinator; prints the job id",
       absl::StrCat(kOverridesText,
                    "\n\n--resume-from JOB continues a cancelled or failed job from its newest "
                    "checkpoint: its adapters, optimizer state, step and data position. Without a "
                    "job file it runs JOB's resolved file (with the overrides given); with one, "
                    "the base model and the adapter's shape must be JOB's, and the coordinator "
                    "says what else changed."),
       {kDataset, kValidationDataset, {"--name", "", "NAME", "the job's name (replaces the file's name:)"},
        {"--resume-from", "", "JOB_ID", "continue that cancelled or failed job from its newest checkpoint"},
        {"--follow", "-f", "", "then show its progress until it ends (exit 1 if it fails)"}},
       true,
       {"qloractl submit examples/qlora-tiny.yaml --follow",
        "qloractl submit job.yaml --dataset data/train.jsonl --name lr-sweep-1",
        "qloractl submit job.yaml trainer.learning_rate=1e-4 adapter.r=16 data.max_sequence_length=1024",
        "qloractl submit --resume-from job-000003 trainer.epochs=5"}},
      {"get", "JOB_ID", "show a job: state, workers, output folder, progress", "", {}, true,
       {"qloractl get job-000001", "qloractl get job-000001 -o json"}},
      {"list", "", "list jobs", "", {{"--state", "", "STATES", "only these states, comma-separated "
                                                             "(queued,starting,running,succeeded,failed,cancelled)"}},
       true, {"qloractl list", "qloractl list --state queued,running"}},
      {"watch", "JOB_ID", "follow a job's progress: step/total, loss, tokens/s, ETA",
       "On a terminal one line is redrawn; piped, one line is printed per optimizer step. Exit status "
       "0 when the job succeeds, 1 when it fails or is cancelled.",
       {}, true, {"qloractl watch job-000001", "qloractl watch job-000001 -o json | jq 'select(.type == \"step\") | .loss'"}},
      {"logs", "JOB_ID", "print a job's worker logs",
       "Every rank's lines, prefixed `rank N |`, or one rank's as written.",
       {{"--follow", "-f", "", "keep printing until the job ends"},
        {"--rank", "", "N", "only this rank"}},
       true, {"qloractl logs job-000001 -f", "qloractl logs job-000001 --rank 1 > rank1.log"}},
      {"generate", "JOB_ID", "generate text with a trained job's adapter",
       "Runs on a worker the coordinator starts on a free GPU (or CPU slot): the job's base model "
       "in 4-bit with its adapter, each prompt laid out as the job laid out its training records "
       "(its template or chat template). The text prints as it is generated. Settings not given "
       "come from the job file's generation: section, then the base model's "
       "generation_config.json, then greedy decoding with max_new_tokens 256. A prompt is text, "
       "or a JSON object with the template's columns or a conversation (messages).",
       {{"--prompt", "-p", "TEXT", "the prompt"},
        {"--prompts-file", "", "FILE", "one prompt a line"},
        {"--checkpoint", "", "step-N", "a checkpoint's adapter instead of the final one"},
        {"--max-new-tokens", "", "N", "at most this many new tokens"},
        {"--min-new-tokens", "", "N", "no end of sequence before this many"},
        {"--sample", "", "", "sample (temperature, top-k, top-p) instead of greedy decoding"},
        {"--greedy", "", "", "greedy decoding even where the job or model says to sample"},
        {"--temperature", "", "T", "sampling temperature"},
        {"--top-k", "", "K", "sample among the K likeliest tokens (0: all)"},
        {"--top-p", "", "P", "sample among the likeliest tokens holding P of the mass"},
        {"--repetition-penalty", "", "R", "HF's repetition penalty (1: none)"},
        {"--seed", "", "N", "sampling seed: the same seed gives the same text"},
        {"--stop", "", "TEXT", "end the output before this text"}},
       true,
       {"qloractl generate job-000001 --prompt \"Write a haiku about GPUs\"",
        "qloractl generate job-000001 --prompts-file prompts.txt -o json",
        "qloractl generate job-000001 -p \"Hello\" --sample --temperature 0.7 --seed 1"}},
      {"cancel", "JOB_ID", "cancel a queued or running job", "", {}, true, {"qloractl cancel job-000001"}},
      {"validate", "JOB.yaml [KEY.PATH=VALUE ...]", "check a job file and print it with every default resolved",
       absl::StrCat("Offline by default (the file, its datasets and its base model as this machine sees "
                    "them); with --remote the coordinator resolves it as it would at submit, with where it "
                    "would run (and checks the first 100 records' format and columns). Where the job's "
                    "files are on this machine, the first 200 training records are also built as a worker builds "
                    "them (the job's format, columns, template and the base model's tokenizer): a record "
                    "that would fail the job fails validation naming its line and column, and the counts "
                    "of records cut, left without a target or malformed are printed with one example and "
                    "the tokens that train. ",
                    kOverridesText),
       {kDataset, kValidationDataset,
        {"--no-data", "", "", "check the file only, without reading the data"},
        {"--remote", "", "", "ask the coordinator (takes the connection flags)"}},
       true,
       {"qloractl validate examples/qlora-tiny.yaml",
        "qloractl validate job.yaml trainer.epochs=3 adapter.r=32",
        "qloractl validate job.yaml --dataset /srv/data/train.jsonl --remote"}},
      {"explain", "[KEY]", "describe the job file's keys: type, default, meaning",
       "Without KEY, the top-level keys; with a dotted KEY (trainer.batch_size), that key and its "
       "sub-keys. --markdown prints the whole reference (docs/job-file.md is this output).",
       {{"--markdown", "", "", "the whole reference as Markdown"}},
       false,
       {"qloractl explain", "qloractl explain trainer", "qloractl explain adapter.target_modules"}},
      {"hash-token", "", "hash a token read from stdin, for the coordinator's --auth-tokens file",
       "Prints the token's hash, or with --user the whole tokens-file line \"sha256:HEX USER ROLE\".",
       {{"--user", "", "NAME", "print the tokens-file line for this user"},
        {"--role", "", "user|admin", "the user's role (default user)"}},
       false,
       {"head -c 32 /dev/urandom | base64 | tee alice.token | qloractl hash-token --user alice"}},
  };
}

std::string FlagLine(const FlagSpec& f) {
  std::string left = f.alias.empty() ? f.name : absl::StrCat(f.alias, ", ", f.name);
  if (!f.value_name.empty()) absl::StrAppend(&left, " ", f.value_name);
  return left.size() < 28 ? absl::StrFormat("  %-28s %s\n", left, f.help)
                          : absl::StrFormat("  %s\n  %-28s %s\n", left, "", f.help);
}

// `text` wrapped at 96 columns.
std::string Wrap(const std::string& text) {
  std::string out, line;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && line.size() + 1 + word.size() > 96) {
      absl::StrAppend(&out, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
    start = end + 1;
  }
  if (!line.empty()) absl::StrAppend(&out, line, "\n");
  return out;
}

template <typename Visit>
void ForEachFlag(Visit visit) {
  for (const FlagSpec& f : CommonFlags()) visit(f);
  for (const FlagSpec& f : ConnectionFlags()) visit(f);
  for (const CommandSpec& c : Commands()) {
    for (const FlagSpec& f : c.flags) visit(f);
  }
}

}  // namespace

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec>* commands = MakeCommands();
  return *commands;
}

const CommandSpec* FindCommand(const std::string& name) {
  for (const CommandSpec& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string OverviewHelp() {
  std::string out = "qloractl: submit and follow QLoRA fine-tuning jobs.\n\nUsage:\n";
  absl::StrAppend(&out, "  qloractl COMMAND [ARGS] [FLAGS]\n  qloractl COMMAND --help     that command's flags "
                        "and examples\n  qloractl --version\n\nCommands:\n");
  for (const CommandSpec& c : Commands()) absl::StrAppendFormat(&out, "  %-12s %s\n", c.name, c.summary);
  absl::StrAppend(&out, "\nFlags for every command that talks to the coordinator:\n");
  for (const FlagSpec& f : ConnectionFlags()) absl::StrAppend(&out, FlagLine(f));
  for (const FlagSpec& f : CommonFlags()) absl::StrAppend(&out, FlagLine(f));
  absl::StrAppend(&out, "\nExamples:\n  qloractl submit examples/qlora-tiny.yaml --follow\n"
                        "  qloractl submit job.yaml trainer.learning_rate=1e-4 adapter.r=16\n"
                        "  qloractl list --state running\n");
  absl::StrAppend(&out, "\nExit status: 0 ok, 1 job failed or cancelled, 2 usage, 3 invalid job, 4 no such job,\n"
                        "5 coordinator unavailable, 6 other error, 7 not authenticated or not allowed.\n");
  return out;
}

std::string CommandHelp(const CommandSpec& command) {
  std::string out = absl::StrCat("qloractl ", command.name, ": ", command.summary, "\n\nUsage:\n  qloractl ",
                                 command.name, command.usage.empty() ? "" : " ", command.usage, " [FLAGS]\n");
  if (!command.description.empty()) absl::StrAppend(&out, "\n", Wrap(command.description));
  absl::StrAppend(&out, "\nFlags:\n");
  for (const FlagSpec& f : command.flags) absl::StrAppend(&out, FlagLine(f));
  for (const FlagSpec& f : CommonFlags()) absl::StrAppend(&out, FlagLine(f));
  if (command.connects) {
    absl::StrAppend(&out, "\nConnection flags:\n");
    for (const FlagSpec& f : ConnectionFlags()) absl::StrAppend(&out, FlagLine(f));
  }
  absl::StrAppend(&out, "\nExamples:\n");
  for (const std::string& e : command.examples) absl::StrAppend(&out, "  ", e, "\n");
  return out;
}

std::set<std::string> AllValueFlags() {
  std::set<std::string> out;
  ForEachFlag([&](const FlagSpec& f) {
    if (!f.value_name.empty()) out.insert(f.name);
  });
  return out;
}

std::set<std::string> AllSwitchFlags() {
  std::set<std::string> out = {"--version"};
  ForEachFlag([&](const FlagSpec& f) {
    if (f.value_name.empty()) out.insert(f.name);
  });
  return out;
}

std::map<std::string, std::string> AllAliases() {
  std::map<std::string, std::string> out;
  ForEachFlag([&](const FlagSpec& f) {
    if (!f.alias.empty()) out[f.alias] = f.name;
  });
  return out;
}

absl::Status CheckFlagsFor(const CommandSpec& command, const ParsedArgs& args) {
  // The connection flags are taken (and ignored) by every command, so that a shell alias with
  // --address and --tls-ca works for hash-token and offline validate too.
  std::set<std::string> allowed;
  for (const FlagSpec& f : CommonFlags()) allowed.insert(f.name);
  for (const FlagSpec& f : ConnectionFlags()) allowed.insert(f.name);
  for (const FlagSpec& f : command.flags) allowed.insert(f.name);
  std::vector<std::string> used(args.switches.begin(), args.switches.end());
  for (const auto& [name, value] : args.values) used.push_back(name);
  for (const std::string& name : used) {
    if (!allowed.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("qloractl ", command.name, " takes no ", name, " (qloractl ", command.name, " --help)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace qlora::cli
