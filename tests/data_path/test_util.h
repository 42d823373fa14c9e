// Small helpers for the data-path tests: a temporary folder, file I/O, the reference Python.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace qlora::data {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "qlora_data_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// $QLORA_PYTHON, else the QLORA_PYTHON the build was configured with (tests/data/CMakeLists.txt
// compiles it in because the shared test helper's ENVIRONMENT property currently passes only
// its first variable); "" when neither names an existing file.
inline std::string ReferencePython() {
  const char* python = std::getenv("QLORA_PYTHON");
#ifdef QLORA_CONFIGURED_PYTHON
  if (python == nullptr || *python == '\0') python = QLORA_CONFIGURED_PYTHON;
#endif
  if (python == nullptr || *python == '\0' || !std::filesystem::exists(python)) return "";
  return python;
}

}  // namespace qlora::data
