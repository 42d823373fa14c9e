// fork/exec of worker processes (see process_launcher.h).
#include "coordinator/launch/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace qlora::coordinator {

absl::StatusOr<pid_t> PosixProcessLauncher::Launch(const LaunchSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("empty argv");
  // Everything the child needs is prepared before fork: only async-signal-safe calls after.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string key = entry.substr(0, entry.find('='));
    if (spec.env.count(key) == 0) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // Runs under the job manager's lock: a FIFO or a link in the log's place must not block it
  // (O_NONBLOCK), nor send the log elsewhere (O_NOFOLLOW); only a regular file is used.
  int log_fd = open(spec.log_path.c_str(),
                    O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open log ", spec.log_path, ": ", strerror(errno)));
  }
  struct stat log_stat;
  if (fstat(log_fd, &log_stat) != 0 || !S_ISREG(log_stat.st_mode) ||
      fcntl(log_fd, F_SETFL, O_APPEND) != 0) {  // blocking writes again
    close(log_fd);
    return absl::InternalError(absl::StrCat("cannot use log ", spec.log_path, ": not a regular file"));
  }
  sigset_t no_signals;  // the coordinator blocks SIGTERM/SIGINT in its threads; workers must not
  sigemptyset(&no_signals);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &no_signals, nullptr);  // SIGTERM stops a worker gracefully
    setpgid(0, 0);                                  // own process group: killed as a unit
    prctl(PR_SET_PDEATHSIG, SIGKILL);               // never outlive the coordinator
    if (getppid() != parent) _exit(127);            // the parent died before prctl
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(argv[0], argv.data(), envp.data());
    const char msg[] = "qlora-coordinator: exec of worker failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(pid, pid);                                // also from the parent: no race with Signal
  close(log_fd);
  return pid;
}

std::optional<ExitInfo> PosixProcessLauncher::Poll(pid_t pid) {
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  ExitInfo info;
  if (r < 0) {  // already reaped or not our child: report as gone
    info.code = -1;
    return info;
  }
  if (WIFSIGNALED(status)) {
    info.signaled = true;
    info.code = WTERMSIG(status);
  } else {
    info.code = WEXITSTATUS(status);
  }
  return info;
}

void PosixProcessLauncher::Signal(pid_t pid, int signal) {
  if (pid > 0) kill(-pid, signal);
}

}  // namespace qlora::coordinator
