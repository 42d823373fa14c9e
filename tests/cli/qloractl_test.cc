// qloractl end to end without torch: per-subcommand help, --version, offline validation with
// KEY.PATH=VALUE overrides and its exit statuses, the example catalog, an unreachable
// coordinator, and submit/get/list/logs/cancel against a real coordinator whose workers are
// /bin/false (every job fails at once with rank 0's exit status). Both processes must end
// cleanly: under the sanitizer build (scripts/fuzz_and_sanitize.sh sets abort_on_error) a
// report in either turns its exit status into a signal, which these checks catch.
#include <sys/wait.h>

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/service/service_harness.h"
#include "tests/util/files.h"

namespace qlora::testing {
namespace {

namespace fs = std::filesystem;

// A folder with a base model that passes validation (config.json only), a dataset, a job file.
struct JobFiles {
  std::string dir;
  std::string job;
  std::string dataset;
};

JobFiles MakeJobFiles() {
  JobFiles f;
  f.dir = MakeTempDir("qlora-cli-test-");
  WriteFile(f.dir + "/model/config.json", "{}\n");
  f.dataset = WriteFile(f.dir + "/train.jsonl", R"({"instruction": "say hi", "output": "hi"})" "\n");
  f.job = WriteFile(f.dir + "/job.yaml", absl::StrCat("base_model: ", f.dir, "/model\n",
                                                      "adapter: {type: lora}\n",
                                                      "trainer: {batch_size: 1, epochs: 1}\n"));
  return f;
}

std::string Ctl() { return BinaryDir() + "/cli/qloractl"; }

// validate reads the data as a worker would, with the base model's tokenizer (the examples'):
// a misspelled column fails (exit 3) naming the record's line, the column and the nearest one;
// a good file prints the sample's counts and one example with its trained tokens; --no-data and
// a model without a tokenizer check the file alone.
TEST(CliTest, ValidateReadsTheDataWithTheModelsTokenizer) {
  JobFiles f = MakeJobFiles();
  CommandResult untokenized = RunCommand(absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dataset));
  EXPECT_EQ(untokenized.exit_code, 0) << untokenized.output;
  EXPECT_NE(untokenized.output.find("# data: not read (the base model's tokenizer"), std::string::npos)
      << untokenized.output;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(SourceDir() + "/examples/tokenizer/" + file, f.dir + "/model/" + file);
  }
  CommandResult ok = RunCommand(absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dataset));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("# sample: 1 record(s) read: 1 example(s), 0 cut"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("say hi"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("[[hi"), std::string::npos) << ok.output;  // the target trains

  const std::string typo = absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dataset,
                                        " 'input_features=[{name: instrucion, type: text}]'");
  CommandResult refused = RunCommand(typo);
  EXPECT_EQ(refused.exit_code, 3) << refused.output;
  EXPECT_NE(refused.output.find(f.dataset + ":1: missing column 'instrucion'; did you mean 'instruction'?"),
            std::string::npos) << refused.output;
  EXPECT_EQ(RunCommand(typo + " --no-data").exit_code, 0);
}

TEST(CliTest, ValidateExitStatuses) {
  const JobFiles f = MakeJobFiles();
  CommandResult ok = RunCommand(absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dataset));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("zero_stage"), std::string::npos) << ok.output;

  CommandResult no_data =
      RunCommand(absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dir, "/none.jsonl"));
  EXPECT_EQ(no_data.exit_code, 3) << no_data.output;

  const std::string bad = SourceDir() + "/tests/assets/jobs/bad/batch_size_zero.yaml";
  CommandResult invalid =
      RunCommand(absl::StrCat(Ctl(), " validate ", bad, " --dataset ", f.dataset));
  EXPECT_EQ(invalid.exit_code, 3) << invalid.output;

  EXPECT_EQ(RunCommand(absl::StrCat(Ctl(), " frobnicate")).exit_code, 2);
  EXPECT_EQ(RunCommand(absl::StrCat(Ctl(), " validate")).exit_code, 2);
  EXPECT_EQ(RunCommand(absl::StrCat(Ctl(), " --help")).exit_code, 0);
  fs::remove_all(f.dir);
}

TEST(CliTest, EverySubcommandHasItsOwnHelp) {
  const std::map<std::string, std::string> own_flag = {
      {"submit", "--follow"}, {"get", "JOB_ID"},        {"list", "--state"},
      {"watch", "optimizer step"}, {"logs", "--rank"}, {"cancel", "JOB_ID"},
      {"validate", "--remote"}, {"hash-token", "--role"}};
  for (const auto& [command, flag] : own_flag) {
    CommandResult help = RunCommand(absl::StrCat(Ctl(), " ", command, " --help"));
    EXPECT_EQ(help.exit_code, 0) << command << ": " << help.output;
    EXPECT_NE(help.output.find(absl::StrCat("qloractl ", command, ": ")), std::string::npos) << help.output;
    EXPECT_NE(help.output.find(flag), std::string::npos) << command << ": " << help.output;
    EXPECT_NE(help.output.find("Examples:"), std::string::npos) << help.output;
    EXPECT_EQ(RunCommand(absl::StrCat(Ctl(), " help ", command)).output, help.output);
  }
  CommandResult submit = RunCommand(absl::StrCat(Ctl(), " submit -h"));
  EXPECT_NE(submit.output.find("KEY.PATH=VALUE"), std::string::npos) << submit.output;
  EXPECT_EQ(submit.output.find("--rank"), std::string::npos) << submit.output;  // logs' flag
  // A flag of another command is a usage error that points at the command's help.
  CommandResult wrong = RunCommand(absl::StrCat(Ctl(), " get job-000001 --rank 1"));
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_NE(wrong.output.find("qloractl get --help"), std::string::npos) << wrong.output;
}

TEST(CliTest, VersionIsTheProjectVersion) {
  for (const std::string program : {"/cli/qloractl", "/coordinator/qlora-coordinator"}) {
    CommandResult version = RunCommand(absl::StrCat(BinaryDir(), program, " --version"));
    EXPECT_EQ(version.exit_code, 0) << program << ": " << version.output;
    EXPECT_NE(version.output.find(QLORA_EXPECTED_VERSION), std::string::npos) << version.output;
  }
  CommandResult help = RunCommand(absl::StrCat(BinaryDir(), "/coordinator/qlora-coordinator --help"));
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--state-dir"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--worker-binary"), std::string::npos) << help.output;
}

TEST(CliTest, ValidateAppliesKeyPathOverrides) {
  const JobFiles f = MakeJobFiles();
  const std::string validate = absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dataset, " ");
  CommandResult ok = RunCommand(
      validate + "trainer.learning_rate=1e-4 adapter.r=16 data.max_sequence_length=1024");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("learning_rate: 0.0001"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("r: 16"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("max_sequence_length: 1024"), std::string::npos) << ok.output;

  CommandResult typo = RunCommand(validate + "trainer.learning_rat=1e-4");
  EXPECT_EQ(typo.exit_code, 3) << typo.output;
  EXPECT_NE(typo.output.find("learning_rate"), std::string::npos) << typo.output;  // did you mean
  CommandResult through = RunCommand(validate + "trainer.batch_size.x=1");
  EXPECT_EQ(through.exit_code, 3) << through.output;
  EXPECT_NE(through.output.find("trainer.batch_size is a scalar"), std::string::npos) << through.output;
  CommandResult not_override = RunCommand(validate + "stray-argument");
  EXPECT_EQ(not_override.exit_code, 3) << not_override.output;
  EXPECT_NE(not_override.output.find("KEY.PATH=VALUE"), std::string::npos) << not_override.output;
  fs::remove_all(f.dir);
}

// Every job file of the example catalog validates offline, run from the source folder (their
// dataset paths are relative to it) with a base model folder given as an override.
TEST(CliTest, ExampleCatalogValidates) {
  const JobFiles f = MakeJobFiles();
  for (const char* example : {"instruction-alpaca.yaml", "chat-messages.yaml", "completion-text.yaml",
                              "preference-dpo.yaml"}) {
    CommandResult r = RunCommand(absl::StrCat("cd ", SourceDir(), " && ", Ctl(), " validate examples/", example,
                                              " base_model=", f.dir, "/model"));
    EXPECT_EQ(r.exit_code, 0) << example << ": " << r.output;
    EXPECT_NE(r.output.find("valid"), std::string::npos) << r.output;
  }
  fs::remove_all(f.dir);
}

// Ludwig's prompt / preprocessing / generation keys: validate prints what they became, and a
// conflict is refused (exit status 3) naming both keys.
TEST(CliTest, ValidateShowsLudwigKeysMappedAndRefusesConflicts) {
  const JobFiles f = MakeJobFiles();
  AppendFile(f.job, "prompt: {template: \"Q: {instruction}\"}\n"
                    "preprocessing:\n  global_max_sequence_length: 96\n"
                    "  split: {type: random, probabilities: [0.9, 0.05, 0.05]}\n"
                    "generation: {temperature: 0.5, max_new_tokens: 16}\n");
  CommandResult ok = RunCommand(absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dataset));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  for (const char* shown : {"prompt_template: \"Q: {instruction}\"  # Ludwig: prompt.template",
                            "max_sequence_length: 96  # Ludwig: preprocessing.global_max_sequence_length",
                            "validation_fraction: 0.05  # Ludwig: preprocessing.split.probabilities[1]",
                            "test_fraction: 0.05", "generation:", "temperature: 0.5", "max_new_tokens: 16"}) {
    EXPECT_NE(ok.output.find(shown), std::string::npos) << shown << " not in\n" << ok.output;
  }
  AppendFile(f.job, "data: {max_sequence_length: 128}\n");
  CommandResult conflict = RunCommand(absl::StrCat(Ctl(), " validate ", f.job, " --dataset ", f.dataset));
  EXPECT_EQ(conflict.exit_code, 3) << conflict.output;
  EXPECT_NE(conflict.output.find("preprocessing.global_max_sequence_length: is 96 but data.max_sequence_length"),
            std::string::npos) << conflict.output;
  fs::remove_all(f.dir);
}

TEST(CliTest, UnreachableCoordinatorIsExitStatus5) {
  // Port 1 on loopback: nothing listens there.
  CommandResult r = RunCommand(absl::StrCat(Ctl(), " --address 127.0.0.1:1 get job-000001"));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("nothing answered at 127.0.0.1:1: is qlora-coordinator running there?"),
            std::string::npos)
      << r.output;
}

// A mistyped command, or another tool's name for one, gets the command it meant.
TEST(CliTest, AMistypedCommandGetsADidYouMean) {
  for (const auto& [typed, meant] : std::vector<std::pair<std::string, std::string>>{
           {"sumbit", "submit"}, {"lsit", "list"}, {"status", "get"}, {"stop", "cancel"},
           {"log", "logs"}, {"vaildate", "validate"}}) {
    CommandResult r = RunCommand(absl::StrCat(Ctl(), " ", typed, " job-000001"));
    EXPECT_EQ(r.exit_code, 2) << typed << ": " << r.output;
    EXPECT_NE(r.output.find(absl::StrCat("unknown command '", typed, "' (did you mean '", meant, "'?)")),
              std::string::npos)
        << r.output;
  }
  CommandResult far = RunCommand(absl::StrCat(Ctl(), " frobnicate"));
  EXPECT_EQ(far.output.find("did you mean"), std::string::npos) << far.output;
}

TEST(CliTest, SubmitGetListLogsCancelAgainstACoordinator) {
  const JobFiles f = MakeJobFiles();
  const std::string state = f.dir + "/state";
  int status = 0;
  {
    CoordinatorProcess coordinator(state, 1, "--gpus none --worker-binary /bin/false");
    ASSERT_TRUE(coordinator.started()) << "see " << state << "/coordinator.log";

    CommandResult submit = coordinator.Ctl(absl::StrCat("submit ", f.job, " --dataset ", f.dataset,
                                                        " --name cli-test"));
    ASSERT_EQ(submit.exit_code, 0) << submit.output;
    EXPECT_EQ(submit.output, "job-000001\n");
    // The worker is /bin/false: the job fails, and following it says so (exit status 1).
    CommandResult watch = coordinator.Ctl("watch job-000001");
    EXPECT_EQ(watch.exit_code, 1) << watch.output;
    EXPECT_NE(watch.output.find("FAILED"), std::string::npos) << watch.output;

    CommandResult get = coordinator.Ctl("get job-000001 -o json");
    EXPECT_EQ(get.exit_code, 0) << get.output;
    EXPECT_NE(get.output.find("cli-test"), std::string::npos) << get.output;
    CommandResult list = coordinator.Ctl("list --state failed");
    EXPECT_EQ(list.exit_code, 0) << list.output;
    EXPECT_NE(list.output.find("job-000001"), std::string::npos) << list.output;
    EXPECT_EQ(coordinator.Ctl("logs job-000001").exit_code, 0);
    EXPECT_EQ(coordinator.Ctl("get job-000999").exit_code, 4);
    EXPECT_EQ(coordinator.Ctl("cancel job-000999").exit_code, 4);
    CommandResult remote = coordinator.Ctl(absl::StrCat("validate --remote ", f.job, " --dataset ", f.dataset,
                                                        " adapter.r=24"));
    EXPECT_EQ(remote.exit_code, 0) << remote.output;
    EXPECT_NE(remote.output.find("r: 24"), std::string::npos) << remote.output;
    CommandResult bad = coordinator.Ctl(absl::StrCat(
        "submit ", SourceDir(), "/tests/assets/jobs/bad/lora_r_zero.yaml --dataset ", f.dataset));
    EXPECT_EQ(bad.exit_code, 3) << bad.output;
    status = coordinator.Stop(SIGTERM);
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "coordinator wait status " << status << "; see " << state << "/coordinator.log";
  if (!HasFailure()) fs::remove_all(f.dir);
}

}  // namespace
}  // namespace qlora::testing
