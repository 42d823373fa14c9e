// Test helper: a temporary directory removed on destruction. POSIX only: libtorch.so exports an
// incompatible copy of std::filesystem that crashes when called (seen: remove_all).
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace qlora::testing {

class TempDir {
 public:
  TempDir() {
    char templ[] = "/tmp/zero-test-XXXXXX";
    path_ = ::mkdtemp(templ);
  }
  ~TempDir() {
    ::nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
           16, FTW_DEPTH | FTW_PHYS);
  }
  const std::string& path() const { return path_; }
  // A fresh subdirectory name (not created).
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace qlora::testing
