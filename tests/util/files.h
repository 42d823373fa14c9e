// File helpers shared by every suite: read a whole file, write or append one (creating its
// folder), make a folder with its parents, whether a path exists, list a folder, a file's size.
// POSIX (mkdir, opendir, stat, access), not std::filesystem: libtorch.so exports an incompatible
// copy of std::filesystem that crashes when called (see temp_dir.h).
#pragma once

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace qlora::testing {

// Makes the folder `path` and any missing parents (mkdir -p, mode 0755 less the umask); true
// when `path` is a folder afterwards.
inline bool MakeDirs(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
    if (slash == std::string::npos) break;
  }
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Whether `path` names anything (a file, a folder, a symbolic link that resolves).
inline bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// The folder part of `path` ("" when it has none).
inline std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The whole file, byte for byte; "" when it cannot be read (missing, a folder, no permission).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Writes `bytes` to `path` (replacing what was there), making its missing parent folders first.
// Returns `path`, so that a test can name the file where it makes it.
inline std::string WriteFile(const std::string& path, const std::string& bytes) {
  const std::string parent = ParentDir(path);
  if (!parent.empty()) MakeDirs(parent);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Appends `bytes` to `path` (made, with its parent folders, when missing). Returns `path`.
inline std::string AppendFile(const std::string& path, const std::string& bytes) {
  const std::string parent = ParentDir(path);
  if (!parent.empty()) MakeDirs(parent);
  std::ofstream(path, std::ios::binary | std::ios::app) << bytes;
  return path;
}

// Names in a folder (no "." or ".."), in readdir's order; none when it cannot be opened.
inline std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
  }
  return names;
}

// The size of a file in bytes (symbolic links followed), or -1 when it cannot be stat'ed.
inline int64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

}  // namespace qlora::testing
