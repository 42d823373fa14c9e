// Device and host memory figures (see device_memory.h).
#include "worker/memory/device_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include <ATen/ATen.h>

#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace qlora::memory {
#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
namespace {

// The caching allocator sets up a device on its first allocation there; its statistics and its
// memory fraction refuse a device it has not set up ("Allocator not initialized").
void InitializeAllocator(const c10::Device& device) {
  if (device.is_cuda()) (void)at::empty({1}, at::dtype(at::kByte).device(device));
}

}  // namespace
#endif

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
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    memory->host_peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
  }
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

int64_t CapDeviceMemory(const c10::Device& device, int64_t bytes) {
#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
  if (device.is_cuda() && bytes > 0) {
    InitializeAllocator(device);
    const size_t total = c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(device.index()).second;
    if (total == 0 || static_cast<size_t>(bytes) >= total) return 0;
    c10::cuda::CUDACachingAllocator::setMemoryFraction(
        static_cast<double>(bytes) / static_cast<double>(total), device.index());
    return bytes;
  }
#else
  (void)device;
  (void)bytes;
#endif
  return 0;
}

int64_t DeviceAvailableBytes(const c10::Device& device) {
#ifdef QLORA_HAVE_CUDA_ALLOCATOR_STATS
  if (device.is_cuda()) {
    InitializeAllocator(device);
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

}  // namespace qlora::memory
