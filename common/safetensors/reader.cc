// safetensors header parsing/validation and the mmap-backed file.
#include "common/safetensors/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace qlora::safetensors {
namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // safetensors MAX_HEADER_SIZE

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file ", file, ": ", what));
}

// Parses JSON text, rejecting duplicate keys in any object (nlohmann would keep the last one).
absl::StatusOr<Json> ParseJsonNoDuplicates(absl::string_view text, absl::string_view file) {
  std::vector<std::set<std::string>> keys_per_object;
  std::string duplicate;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys_per_object.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        keys_per_object.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys_per_object.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json json = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Invalid(file, "header is not valid JSON");
  if (!duplicate.empty()) return Invalid(file, absl::StrCat("duplicate key \"", duplicate, "\""));
  return json;
}

absl::StatusOr<uint64_t> ReadUint(const Json& value, absl::string_view file, absl::string_view what) {
  if (!value.is_number_unsigned()) {
    return Invalid(file, absl::StrCat(what, " must be a non-negative integer"));
  }
  return value.get<uint64_t>();
}

absl::StatusOr<TensorInfo> ParseTensorInfo(const std::string& name, const Json& entry,
                                           absl::string_view file) {
  const std::string where = absl::StrCat("tensor \"", name, "\"");
  if (!entry.is_object()) return Invalid(file, absl::StrCat(where, " is not an object"));
  for (const auto& [key, unused] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Invalid(file, absl::StrCat(where, " has unknown field \"", key, "\""));
    }
  }
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) {
    return Invalid(file, absl::StrCat(where, " has no dtype string"));
  }
  TensorInfo info;
  auto dtype = ParseDtype(entry["dtype"].get<std::string>());
  if (!dtype.ok()) return Invalid(file, absl::StrCat(where, ": ", dtype.status().message()));
  info.dtype = *dtype;

  if (!entry.contains("shape") || !entry["shape"].is_array()) {
    return Invalid(file, absl::StrCat(where, " has no shape array"));
  }
  // numel x bits must fit in 64 bits: a product that wrapped around could match a short byte
  // range, and readers trust the shape.
  const uint64_t dtype_bits = static_cast<uint64_t>(DtypeBits(info.dtype));
  uint64_t numel = 1;
  for (const Json& dim : entry["shape"]) {
    QLORA_ASSIGN_OR_RETURN(uint64_t d, ReadUint(dim, file, absl::StrCat(where, " shape entry")));
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (d != 0 && numel > std::numeric_limits<uint64_t>::max() / dtype_bits / d)) {
      return Invalid(file, absl::StrCat(where, " shape overflows"));
    }
    numel *= d;
    info.shape.push_back(static_cast<int64_t>(d));
  }

  const Json* offsets = entry.contains("data_offsets") ? &entry["data_offsets"] : nullptr;
  if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2) {
    return Invalid(file, absl::StrCat(where, " needs data_offsets [begin, end]"));
  }
  QLORA_ASSIGN_OR_RETURN(info.begin, ReadUint((*offsets)[0], file, where + " begin offset"));
  QLORA_ASSIGN_OR_RETURN(info.end, ReadUint((*offsets)[1], file, where + " end offset"));
  if (info.end < info.begin) return Invalid(file, absl::StrCat(where, " ends before it begins"));

  const uint64_t bits = numel * dtype_bits;
  if (bits % 8 != 0) {
    return Invalid(file, absl::StrCat(where, " is not a whole number of bytes"));
  }
  if (info.end - info.begin != bits / 8) {
    return Invalid(file, absl::StrCat(where, " spans ", info.end - info.begin,
                                      " bytes but its dtype and shape need ", bits / 8));
  }
  return info;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<Header> ParseHeader(absl::string_view bytes, absl::string_view file) {
  if (bytes.size() < 8) return Invalid(file, "shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);  // little-endian
  if (n > kMaxHeaderSize) {
    return Invalid(file, absl::StrCat("header length ", n, " exceeds the 100 MB limit"));
  }
  if (n > bytes.size() - 8) {
    return Invalid(file, absl::StrCat("header length ", n, " runs past the end of the file (",
                                      bytes.size(), " bytes): truncated?"));
  }
  const absl::string_view text = bytes.substr(8, n);
  if (text.empty() || text.front() != '{') return Invalid(file, "header does not start with '{'");
  QLORA_ASSIGN_OR_RETURN(Json json, ParseJsonNoDuplicates(text, file));
  if (!json.is_object()) return Invalid(file, "header is not a JSON object");

  Header header;
  header.data_start = 8 + n;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Invalid(file, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return Invalid(file, absl::StrCat("__metadata__ value of \"", key, "\" is not a string"));
        }
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    QLORA_ASSIGN_OR_RETURN(TensorInfo info, ParseTensorInfo(name, entry, file));
    header.tensors.emplace(name, std::move(info));
  }

  // The tensors must tile [0, buffer size) in offset order.
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  for (const auto& [name, info] : header.tensors) by_offset.emplace_back(&name, &info);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->begin, a.second->end) <
           std::make_pair(b.second->begin, b.second->end);
  });
  uint64_t cursor = 0;
  for (const auto& [name, info] : by_offset) {
    if (info->begin != cursor) {
      return Invalid(file, absl::StrCat("tensor \"", *name, "\" starts at ", info->begin,
                                        " but the previous tensor ends at ", cursor,
                                        " (hole or overlap)"));
    }
    cursor = info->end;
  }
  const uint64_t buffer_size = bytes.size() - header.data_start;
  if (cursor != buffer_size) {
    return absl::DataLossError(absl::StrCat(
        "safetensors file ", file, ": tensors cover ", cursor, " bytes but the data buffer has ",
        buffer_size, cursor > buffer_size ? " (truncated file)" : " (trailing bytes)"));
  }
  return header;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Invalid(path, "shorter than the 8-byte header length");
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot mmap ", path));
  const auto* bytes = static_cast<const uint8_t*>(base);
  auto header = ParseHeader(absl::string_view(reinterpret_cast<const char*>(bytes), size), path);
  if (!header.ok()) {
    ::munmap(base, size);
    return header.status();
  }
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(path, bytes, size, *std::move(header)));
}

SafetensorsFile::~SafetensorsFile() { ::munmap(const_cast<uint8_t*>(base_), size_); }

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) {
    return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" not in ", path_));
  }
  const TensorInfo& info = it->second;
  TensorView view;
  view.dtype = info.dtype;
  view.shape = info.shape;
  view.data = base_ + header_.data_start + info.begin;
  view.nbytes = info.end - info.begin;
  return view;
}

void SafetensorsFile::Evict(const TensorView& view) const {
  if (view.nbytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(view.data) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(view.data) + view.nbytes;
  // Advice only: failure leaves the pages resident, which is harmless.
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace qlora::safetensors
