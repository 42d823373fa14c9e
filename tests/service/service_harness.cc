// Service test harness (see service_harness.h).
#include "tests/service/service_harness.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "qlora/v1/job.pb.h"
#include "tests/util/files.h"

namespace qlora::testing {
namespace fs = std::filesystem;

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string BinaryDir() {
  const char* d = getenv("QLORA_BINARY_DIR");
  return d ? d : ".";
}

std::string SourceDir() {
  const char* d = getenv("QLORA_SOURCE_DIR");
  return d ? d : ".";
}

std::string MakeTempDir(const std::string& prefix) {
  std::string pattern = (fs::temp_directory_path() / (prefix + "XXXXXX")).string();
  char* made = mkdtemp(pattern.data());
  return made ? std::string(made) : "";
}

std::string TinyModelDir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    dir = MakeTempDir("qlora-tiny-model-");
    // The example tokenizer has 512 tokens.
    const std::string cmd = absl::StrCat(BinaryDir(), "/worker/engine/qlora-make-tiny-model ", dir,
                                         " --vocab 512 && cp ", SourceDir(), "/examples/tokenizer/* ", dir);
    CommandResult r = RunCommand(cmd);
    if (r.exit_code != 0) {
      fprintf(stderr, "tiny model maker failed: %s\n", r.output.c_str());
      dir.clear();
    }
  });
  return dir;
}

std::string OriginalJobYaml(bool on_ray) {
  std::string yaml = ReadFile(SourceDir() + "/tests/assets/jobs/good/ludwig_original.yaml");
  const std::string from = "base_model: meta-llama/Llama-2-7b-hf";
  const size_t at = yaml.find(from);
  if (at == std::string::npos) return "";
  yaml.replace(at, from.size(), "base_model: " + TinyModelDir());
  const std::string ray = "backend:\n  type: ray\n";
  if (const size_t type = yaml.find(ray); !on_ray && type != std::string::npos) {
    yaml.replace(type, ray.size(), "backend:\n  type: local\n");
  }
  return yaml;
}

std::string TinyJobYaml(const std::string& extra) {
  std::string yaml = OriginalJobYaml();
  const size_t trainer = yaml.find("\ntrainer:");  // the last section: `extra` sets its own
  if (trainer == std::string::npos) return "";
  return absl::StrCat(yaml.substr(0, trainer + 1), extra);
}

CoordinatorProcess::CoordinatorProcess(const std::string& state_dir, int cpu_workers,
                                       const std::string& extra_flags) {
  const std::string port_file = state_dir + "/port";
  fs::create_directories(state_dir);
  fs::remove(port_file);
  const std::string log = state_dir + "/coordinator.log";
  pid_ = fork();
  if (pid_ == 0) {
    const std::string bin = BinaryDir() + "/coordinator/qlora-coordinator";
    const std::string cmd = absl::StrCat("exec ", bin, " --address 127.0.0.1:0 --state-dir ", state_dir,
                                         " --cpu-workers ", cpu_workers, " --port-file ", port_file, " ",
                                         extra_flags, " >>", log, " 2>&1");
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 300 && port_ == 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> port_)) {
      port_ = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (port_ > 0) {
    channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
    stub_ = v1::JobService::NewStub(channel_);
  }
}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ > 0) Stop(SIGTERM);
}

std::string CoordinatorProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

int CoordinatorProcess::Stop(int signal) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

CommandResult CoordinatorProcess::Ctl(const std::string& args) const {
  return RunCommand(absl::StrCat(BinaryDir(), "/cli/qloractl --address ", address(), " ", args));
}

v1::Job CoordinatorProcess::GetJob(const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetJobRequest req;
  req.set_id(id);
  v1::Job job;
  stub_->GetJob(&ctx, req, &job);
  return job;
}

v1::Job CoordinatorProcess::WaitForState(const std::string& id, const std::vector<v1::JobState>& states,
                                         double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  v1::Job job;
  while (true) {
    job = GetJob(id);
    for (v1::JobState s : states) {
      if (job.state() == s) return job;
    }
    if (std::chrono::steady_clock::now() > end) return job;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string TrainData() { return SourceDir() + "/examples/data/train.jsonl"; }

v1::Job SubmitJob(CoordinatorProcess& c, const std::string& yaml, grpc::Status* status, const std::string& dataset) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::SubmitJobRequest req;
  req.set_job_yaml(yaml);
  req.set_dataset(dataset.empty() ? TrainData() : dataset);
  v1::SubmitJobResponse resp;
  grpc::Status s = c.jobs()->SubmitJob(&ctx, req, &resp);
  if (status) *status = s;
  return resp.job();
}

std::string StoredEvents(const std::string& state_dir, const std::string& job_id) {
  // The store keeps each event as its qlora.v1.JobEvent message: read the bytes as hex with the
  // sqlite3 program, as an operator would, and decode them with the public proto.
  const std::string hex = RunCommand(absl::StrCat(
      "sqlite3 ", state_dir, "/jobs.sqlite \"select hex(event) from events where job_id='",
      job_id, "' order by seq\"")).output;
  std::string out;
  for (absl::string_view line : absl::StrSplit(hex, '\n', absl::SkipWhitespace())) {
    v1::JobEvent event;
    if (!event.ParseFromString(absl::HexStringToBytes(absl::StripAsciiWhitespace(line)))) {
      absl::StrAppend(&out, "<unparsable event>\n");
      continue;
    }
    absl::StrAppend(&out, event.reason_code(), ": ", event.message(), " @");
    if (event.has_progress()) {
      absl::StrAppend(&out, event.progress().step(), " ", event.progress().loss());
    } else {
      absl::StrAppend(&out, " ");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

bool WaitUntil(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

bool CheckpointWritten(const std::string& output_dir, int step) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir + "/checkpoints", ec)) {
    if (fs::exists(e.path() / absl::StrCat("step-", step) / "manifest.json")) return true;
  }
  return false;
}

std::vector<pid_t> WorkerPids(const std::string& coordinator_address, const std::string& job_id) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = ReadFile(entry.path() / "cmdline");
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    if (cmdline.find("qlora-worker") == std::string::npos) continue;
    if (cmdline.find(absl::StrCat("--job ", job_id, " ")) == std::string::npos) continue;
    if (cmdline.find(absl::StrCat("--coordinator ", coordinator_address, " ")) == std::string::npos) continue;
    // A zombie has an empty cmdline, so anything that matched is alive (or about to be reaped).
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z') continue;
    pids.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return pids;
}

}  // namespace qlora::testing
