// Fuzz-target helper: the input bytes as a file that path-taking readers can open, without
// touching the disk (an anonymous memfd; its path is /proc/self/fd/N, a regular file).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace qlora::fuzz {

class FuzzFile {
 public:
  FuzzFile(const uint8_t* data, size_t size) : fd_(::memfd_create("qlora-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();  // the harness itself is broken; not a finding
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
  }
  ~FuzzFile() { ::close(fd_); }
  FuzzFile(const FuzzFile&) = delete;
  FuzzFile& operator=(const FuzzFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace qlora::fuzz
