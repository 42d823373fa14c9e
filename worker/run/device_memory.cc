// Device and host memory figures (see device_memory.h).
#include "worker/run/device_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace qlora::worker {

void FillDeviceMemory(const c10::Device& device, MemorySnapshot* memory) {
#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto& all = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    memory->device_allocated_bytes = all.current;
    memory->device_peak_bytes = all.peak;
    const auto& reserved = stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    memory->device_reserved_peak_bytes = reserved.peak;
  }
#else
  (void)device;
#endif
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  memory->host_rss_bytes = static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

int64_t PeakMemoryBytes(const c10::Device& device) {
  if (device.is_cuda()) {
    MemorySnapshot memory;
    FillDeviceMemory(device, &memory);
    return memory.device_peak_bytes;
  }
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t DeviceAllocatedBytes(const c10::Device& device) {
  if (!device.is_cuda()) return 0;
  MemorySnapshot memory;
  FillDeviceMemory(device, &memory);
  return memory.device_allocated_bytes;
}

int64_t DeviceAvailableBytes(const c10::Device& device) {
#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
  if (device.is_cuda()) {
    const size_t free = c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(device.index()).first;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto& reserved =
        stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return static_cast<int64_t>(free) + reserved.current;
  }
#else
  (void)device;
#endif
  return 0;
}

namespace {

// The first number in a one-line file (a cgroup's limit or usage); -1 when absent or "max".
int64_t ReadNumberFile(const char* path) {
  long long value = -1;
  if (FILE* f = fopen(path, "r")) {
    if (fscanf(f, "%lld", &value) != 1) value = -1;
    fclose(f);
  }
  return value;
}

// /proc/meminfo's MemAvailable in bytes; -1 when absent.
int64_t MemAvailable() {
  FILE* f = fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  char line[256];
  long long kib = -1;
  while (fgets(line, sizeof line, f) != nullptr) {
    if (strncmp(line, "MemAvailable:", 13) == 0 && sscanf(line + 13, "%lld", &kib) == 1) break;
  }
  fclose(f);
  return kib < 0 ? -1 : static_cast<int64_t>(kib) * 1024;
}

}  // namespace

int64_t HostAvailableBytes() {
  int64_t available = MemAvailable();
  struct Cgroup {
    const char* limit;
    const char* usage;
  };
  for (const Cgroup& c : {Cgroup{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                          Cgroup{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                 "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const int64_t limit = ReadNumberFile(c.limit), usage = ReadNumberFile(c.usage);
    // v1 reports "no limit" as a huge number; either way MemAvailable then decides.
    if (limit <= 0 || usage < 0 || limit >= (int64_t{1} << 60)) continue;
    const int64_t left = std::max<int64_t>(limit - usage, 0);
    available = available < 0 ? left : std::min(available, left);
    break;
  }
  return std::max<int64_t>(available, 0);
}

}  // namespace qlora::worker
