// Helpers shared by the engine tests: running the reference Python scripts in tests/engine/ with
// $QLORA_PYTHON (tests skip when it is absent); temporary folders and file helpers come from
// tests/util/.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/util/files.h"  // ReadFile, WriteFile, ListDir, FileSize
#include "tests/util/temp_dir.h"

namespace qlora::testing {

// The reference interpreter, or "" when QLORA_PYTHON is unset or not executable.
inline std::string ReferencePython() {
  const char* python = std::getenv("QLORA_PYTHON");
#ifdef QLORA_DEFAULT_PYTHON
  if (python == nullptr) python = QLORA_DEFAULT_PYTHON;
#endif
  if (python == nullptr || *python == '\0') return "";
  const std::string name = python;
  if (name.find('/') != std::string::npos) return ::access(python, X_OK) == 0 ? name : "";
  // A bare name ("python3"): look it up on PATH.
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t start = 0; start <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

inline std::string ScriptPath(const std::string& script) {
  const char* src = std::getenv("QLORA_SOURCE_DIR");
#ifdef QLORA_DEFAULT_SOURCE_DIR
  if (src == nullptr) src = QLORA_DEFAULT_SOURCE_DIR;
#endif
  return std::string(src ? src : ".") + "/tests/engine/" + script;
}

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
