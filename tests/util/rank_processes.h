// Test-only helpers for multi-process tests: a rendezvous store on a directory (values are files
// named after their key; Get polls, fine for a test, never for the product: the product's store
// is the coordinator's), and a runner that re-executes the current test binary once per rank
// with a gtest filter and an environment, then waits for every child with a deadline.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/rendezvous_store.h"

extern char** environ;

namespace qlora::testing {

class DirectoryStore final : public comm::RendezvousStore {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& key, const std::string& bytes) override {
    const std::string path = Path(key);
    std::ofstream(path + ".tmp", std::ios::binary) << bytes;
    if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
      return absl::InternalError("rename failed");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      std::ifstream in(Path(key), std::ios::binary);
      if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
      }
      if (absl::Now() >= deadline) return absl::DeadlineExceededError(key);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  std::string Path(const std::string& key) const {
    return dir_ + "/" + absl::StrReplaceAll(key, {{"/", "%"}});
  }
  std::string dir_;
};

// Runs `world` copies of this binary, child r with `gtest_filter`, RANK_ENV=r and `env` added
// to the environment. Returns one line per child that failed or outlived `timeout` (killed);
// empty when all exited 0.
inline std::vector<std::string> RunRankProcesses(int world, const std::string& gtest_filter,
                                                 const std::string& rank_env,
                                                 const std::map<std::string, std::string>& env,
                                                 absl::Duration timeout) {
  std::vector<std::string> problems;
  std::vector<pid_t> children;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> env_strings = {absl::StrCat(rank_env, "=", rank)};
    for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + gtest_filter;
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid;
    if (::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) {
      problems.push_back(absl::StrCat("rank ", rank, ": posix_spawn failed"));
      continue;
    }
    children.push_back(pid);
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < children.size(); ++i) {
    int status = 0;
    while (::waitpid(children[i], &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        for (pid_t pid : children) ::kill(pid, SIGKILL);
        ::waitpid(children[i], &status, 0);
        problems.push_back(absl::StrCat("rank ", i, " did not finish in time"));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      problems.push_back(absl::StrCat("rank ", i, " ended with status ", status));
    }
  }
  return problems;
}

}  // namespace qlora::testing
