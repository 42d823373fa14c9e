// MemAvailable and the memory cgroups' limits (see host_memory.h).
#include "worker/memory/host_memory.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

namespace qlora::memory {
namespace {

// The first number in a one-line file; nullopt when absent or not a number ("max").
std::optional<int64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  long long value = 0;
  if (!(in >> value)) return std::nullopt;
  return static_cast<int64_t>(value);
}

// The value after `key` in a "key value" per line file (/proc/meminfo, memory.stat).
std::optional<int64_t> ReadKey(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name;
    long long value = 0;
    if (fields >> name >> value && name == key) return static_cast<int64_t>(value);
  }
  return std::nullopt;
}

// A cgroup hierarchy's layout: its folder under the root, its files' names.
struct Hierarchy {
  std::string folder;  // the process's cgroup, e.g. /sys/fs/cgroup/kubepods/pod1
  std::string top;     // where walking up stops (the hierarchy's root)
  const char* limit;
  const char* usage;
  const char* inactive_file;  // the key in memory.stat
};

// From /proc/self/cgroup: the v2 hierarchy ("0::/path"), else v1's memory controller.
std::optional<Hierarchy> FindHierarchy(const HostMemoryFiles& files) {
  std::ifstream in(files.self_cgroup);
  std::string line;
  std::optional<Hierarchy> v1;
  while (std::getline(in, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    if (path == "/") path.clear();
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      return Hierarchy{files.cgroup_root + path, files.cgroup_root, "memory.max", "memory.current",
                       "inactive_file"};
    }
    std::istringstream names(controllers);
    std::string name;
    while (std::getline(names, name, ',')) {
      if (name == "memory") {
        const std::string root = files.cgroup_root + "/memory";
        v1 = Hierarchy{root + path, root, "memory.limit_in_bytes", "memory.usage_in_bytes",
                       "total_inactive_file"};
      }
    }
  }
  return v1;
}

}  // namespace

int64_t HostAvailableBytes(const HostMemoryFiles& files) {
  std::optional<int64_t> available;
  if (const std::optional<int64_t> kib = ReadKey(files.meminfo, "MemAvailable:")) {
    available = *kib * 1024;
  }
  if (const std::optional<Hierarchy> h = FindHierarchy(files)) {
    // Every cgroup from the process's up to the hierarchy's root: the tightest limit counts.
    for (std::string folder = h->folder;; folder = folder.substr(0, folder.rfind('/'))) {
      const std::optional<int64_t> limit = ReadNumber(folder + "/" + h->limit);
      const std::optional<int64_t> usage = ReadNumber(folder + "/" + h->usage);
      // v1 says "no limit" with a huge number, v2 with "max".
      if (limit && usage && *limit < (int64_t{1} << 60)) {
        const int64_t inactive = ReadKey(folder + "/memory.stat", h->inactive_file).value_or(0);
        const int64_t left = std::max<int64_t>(*limit - std::max<int64_t>(*usage - inactive, 0), 0);
        available = available ? std::min(*available, left) : left;
      }
      if (folder.size() <= h->top.size() || folder.rfind('/') == std::string::npos) break;
    }
  }
  return std::max<int64_t>(available.value_or(0), 0);
}

}  // namespace qlora::memory
