// Test helper shared by every suite: a fresh folder under $TMPDIR (or /tmp), removed with its
// contents on destruction. POSIX (nftw), not std::filesystem: libtorch.so exports an incompatible
// copy of std::filesystem that crashes when called (seen: remove_all).
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
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/qlora-test-XXXXXX";
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    if (path_.empty()) return;
    ::nftw(path_.c_str(),
           [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
           FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // The path of `name` inside (not created).
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }
  std::string operator/(const std::string& name) const { return Sub(name); }

 private:
  std::string path_;
};

}  // namespace qlora::testing
