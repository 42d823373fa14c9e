// Safetensors layout: u64 little-endian header size, JSON header (padded with spaces to 8 bytes),
// then the raw little-endian data at the header's data_offsets.
#include "worker/strategy/partition_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace qlora::strategy {

absl::Status MakeDirectories(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("creating ", prefix, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status WritePartitionFile(const std::string& path,
                                const std::map<std::string, std::string>& metadata,
                                const std::vector<NamedFloats>& tensors) {
  nlohmann::json header;
  header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const NamedFloats& t : tensors) {
    const int64_t bytes = t.numel * static_cast<int64_t>(sizeof(float));
    header[t.name] = {{"dtype", "F32"}, {"shape", {t.numel}}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const uint64_t size = text.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(size >> (8 * i));
    out.write(reinterpret_cast<const char*>(le), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const NamedFloats& t : tensors) {
      out.write(reinterpret_cast<const char*>(t.data),
                static_cast<std::streamsize>(t.numel * sizeof(float)));
    }
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("writing ", tmp, " failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("renaming ", tmp, " to ", path, " failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PartitionFileReader> PartitionFileReader::Open(const std::string& path) {
  PartitionFileReader reader;
  reader.path_ = path;
  reader.in_.open(path, std::ios::binary);
  if (!reader.in_) return absl::NotFoundError(absl::StrCat("checkpoint partition ", path, " is missing"));
  unsigned char le[8];
  reader.in_.read(reinterpret_cast<char*>(le), 8);
  uint64_t size = 0;
  for (int i = 0; i < 8; ++i) size |= static_cast<uint64_t>(le[i]) << (8 * i);
  if (!reader.in_ || size > (64u << 20)) {
    return absl::DataLossError(absl::StrCat(path, ": not a safetensors file"));
  }
  std::string text(size, '\0');
  reader.in_.read(text.data(), static_cast<std::streamsize>(size));
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!reader.in_ || !header.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": unreadable safetensors header"));
  }
  const int64_t data_start = 8 + static_cast<int64_t>(size);
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, v] : value.items()) {
        if (v.is_string()) reader.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || value.value("dtype", "") != "F32" || !value.contains("data_offsets")) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "' is not F32"));
    }
    const int64_t begin = value["data_offsets"][0].get<int64_t>();
    const int64_t end = value["data_offsets"][1].get<int64_t>();
    reader.entries_[name] = Entry{data_start + begin, (end - begin) / 4};
  }
  return reader;
}

absl::StatusOr<int64_t> PartitionFileReader::Numel(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  return it->second.numel;
}

absl::Status PartitionFileReader::Read(const std::string& name, int64_t offset, int64_t count,
                                       float* out) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  if (offset < 0 || count < 0 || offset + count > it->second.numel) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": '", name, "' has ", it->second.numel,
                                              " elements, asked for [", offset, ", ",
                                              offset + count, ")"));
  }
  in_.clear();
  in_.seekg(it->second.begin + offset * 4);
  in_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(count * 4));
  if (!in_) return absl::DataLossError(absl::StrCat(path_, ": truncated tensor '", name, "'"));
  return absl::OkStatus();
}

}  // namespace qlora::strategy
