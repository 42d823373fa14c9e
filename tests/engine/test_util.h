// Helpers shared by the engine tests: temp folders and running the reference Python scripts in
// tests/engine/ with $QLORA_PYTHON (tests skip when it is absent).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

namespace qlora::testing {

// The reference interpreter, or "" when QLORA_PYTHON is unset or not executable.
inline std::string ReferencePython() {
  const char* python = std::getenv("QLORA_PYTHON");
#ifdef QLORA_DEFAULT_PYTHON
  if (python == nullptr) python = QLORA_DEFAULT_PYTHON;
#endif
  if (python == nullptr || *python == '\0' || ::access(python, X_OK) != 0) return "";
  return python;
}

inline std::string ScriptPath(const std::string& script) {
  const char* src = std::getenv("QLORA_SOURCE_DIR");
#ifdef QLORA_DEFAULT_SOURCE_DIR
  if (src == nullptr) src = QLORA_DEFAULT_SOURCE_DIR;
#endif
  return std::string(src ? src : ".") + "/tests/engine/" + script;
}

// A fresh folder under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "qlora-engine-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs `python script args...`; returns the exit status (0 = success).
inline int RunScript(const std::string& python, const std::string& script,
                     const std::vector<std::string>& args) {
  std::string command = "'" + python + "' '" + ScriptPath(script) + "'";
  for (const std::string& arg : args) command += " '" + arg + "'";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace qlora::testing

#define QLORA_PYTHON_OR_SKIP(var)                                           \
  const std::string var = ::qlora::testing::ReferencePython();              \
  if (var.empty()) GTEST_SKIP() << "QLORA_PYTHON is not set: no reference check"
