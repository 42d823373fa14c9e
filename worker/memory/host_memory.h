// What host memory this process may still take, for offload_activation_layers: auto's pinned
// copies: the kernel's MemAvailable, lowered to what each memory cgroup above the process leaves
// (a Kubernetes pod's or a Slurm job's limit; cgroup v2, else v1). A cgroup's usage counts its
// page cache, which the kernel gives back under pressure, so its inactive file pages are not
// counted as used (as the kubelet counts a pod's working set). Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace qlora::memory {

// Where the figures are read (tests point them at a folder of their own).
struct HostMemoryFiles {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
};

// Bytes; 0 when nothing could be read.
int64_t HostAvailableBytes(const HostMemoryFiles& files = {});

}  // namespace qlora::memory
