// Landlock confinement of the worker's file accesses (file_confinement.h).
#include "worker/service/file_confinement.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"

namespace qlora::worker {
namespace {

constexpr uint64_t kReadRights = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
constexpr uint64_t kWriteRightsV1 =
    LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
    LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
    LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
    LANDLOCK_ACCESS_FS_MAKE_SYM;
constexpr uint64_t kRefer = 1ULL << 13;     // ABI 2
constexpr uint64_t kTruncate = 1ULL << 14;  // ABI 3
// What a rule on a file (not a folder) may allow.
constexpr uint64_t kFileRights =
    LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE | kTruncate;

// The few /etc files a worker reads after it starts: name resolution, time zone, TLS roots.
constexpr const char* kEtcFiles[] = {"/etc/hosts",         "/etc/resolv.conf", "/etc/nsswitch.conf",
                                     "/etc/host.conf",     "/etc/gai.conf",    "/etc/localtime",
                                     "/etc/ld.so.cache",   "/etc/ssl",         "/etc/ca-certificates",
                                     "/etc/pki",           "/etc/services",    "/etc/protocols"};
constexpr const char* kSystemFolders[] = {"/usr", "/lib", "/lib64", "/lib32", "/bin",
                                          "/opt", "/proc", "/sys"};

class Ruleset {
 public:
  explicit Ruleset(int fd) : fd_(fd) {}
  ~Ruleset() { close(fd_); }
  int fd() const { return fd_; }

  // Allows `rights` (masked to what is handled, and to file rights for a file) beneath `path`.
  // A path that does not exist is skipped when `optional`.
  absl::Status Allow(const std::string& path, uint64_t rights, uint64_t handled, bool optional) {
    const int parent = open(path.c_str(), O_PATH | O_CLOEXEC);
    if (parent < 0) {
      if (optional && (errno == ENOENT || errno == ENOTDIR || errno == EACCES)) {
        return absl::OkStatus();
      }
      return absl::FailedPreconditionError(
          absl::StrCat("file confinement: cannot open ", path, ": ", std::strerror(errno)));
    }
    struct stat st {};
    fstat(parent, &st);
    landlock_path_beneath_attr rule{};
    rule.allowed_access = rights & handled & (S_ISDIR(st.st_mode) ? ~0ULL : kFileRights);
    rule.parent_fd = parent;
    const long added = rule.allowed_access == 0
                           ? 0
                           : syscall(SYS_landlock_add_rule, fd_, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    const int error = errno;
    close(parent);
    if (added != 0) {
      return absl::InternalError(absl::StrCat("file confinement: a rule for ", path, ": ",
                                              std::strerror(error)));
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
};

// The folders of every file this process has mapped (its libraries, LibTorch's among them):
// libraries opened later (CUDA's, cuDNN's) live in the same folders or under /usr.
std::set<std::string> MappedFolders() {
  std::set<std::string> folders;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (const size_t deleted = path.find(" (deleted)"); deleted != std::string::npos) {
      path.resize(deleted);
    }
    const size_t last = path.find_last_of('/');
    if (last != std::string::npos && last > 0) folders.insert(path.substr(0, last));
  }
  return folders;
}

}  // namespace

absl::Status ConfineFiles(const FileConfinement& confinement) {
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) {
    return absl::UnimplementedError(
        absl::StrCat("file confinement: this kernel has no Landlock (", std::strerror(errno), ")"));
  }
  uint64_t write = kWriteRightsV1;
  if (abi >= 2) write |= kRefer;
  if (abi >= 3) write |= kTruncate;
  const bool confine_reads = !confinement.read_beneath.empty();
  const uint64_t handled = write | (confine_reads ? kReadRights : 0);
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = handled;
  const long fd = syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("file confinement: cannot make a ruleset: ", std::strerror(errno)));
  }
  Ruleset rules(static_cast<int>(fd));
  for (const std::string& path : confinement.read_beneath) {
    if (absl::Status s = rules.Allow(path, kReadRights, handled, false); !s.ok()) return s;
  }
  for (const std::string& path : confinement.write_beneath) {
    if (absl::Status s = rules.Allow(path, kReadRights | write, handled, false); !s.ok()) return s;
  }
  if (absl::Status s = rules.Allow("/dev", kReadRights | write, handled, true); !s.ok()) return s;
  // The process's own threads' files: the CUDA driver names its threads through
  // /proc/self/task/<tid>/comm (opened for writing with O_TRUNC, as fopen "w" does), and cuInit
  // fails (error 304) when it cannot. Resolved now, so beneath this process's /proc/<pid>/task.
  if (absl::Status s = rules.Allow("/proc/self/task", kReadRights | LANDLOCK_ACCESS_FS_WRITE_FILE | kTruncate,
                                   handled, true);
      !s.ok()) {
    return s;
  }
  if (confine_reads) {
    for (const char* path : kSystemFolders) {
      if (absl::Status s = rules.Allow(path, kReadRights, handled, true); !s.ok()) return s;
    }
    for (const char* path : kEtcFiles) {
      if (absl::Status s = rules.Allow(path, kReadRights, handled, true); !s.ok()) return s;
    }
    for (const std::string& folder : MappedFolders()) {
      if (absl::Status s = rules.Allow(folder, kReadRights, handled, true); !s.ok()) return s;
    }
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return absl::InternalError(
        absl::StrCat("file confinement: no_new_privs: ", std::strerror(errno)));
  }
  if (syscall(SYS_landlock_restrict_self, rules.fd(), 0) != 0) {
    return absl::InternalError(
        absl::StrCat("file confinement: cannot restrict the process: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace qlora::worker
