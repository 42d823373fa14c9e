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

// $QLORA_PYTHON when it names an existing file, else "".
inline std::string ReferencePython() {
  const char* python = std::getenv("QLORA_PYTHON");
  if (python == nullptr || *python == '\0' || !std::filesystem::exists(python)) return "";
  return python;
}

}  // namespace qlora::data
