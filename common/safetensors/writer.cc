// The safetensors writer: header layout, alignment order and atomic file replacement.
#include "common/safetensors/writer.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace qlora::safetensors {
namespace {

uint64_t ByteSize(const TensorSpec& spec) {
  uint64_t numel = 1;
  for (int64_t d : spec.shape) numel *= static_cast<uint64_t>(d);
  return numel * DtypeBits(spec.dtype) / 8;
}

std::string Quoted(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

absl::Status WriteSafetensors(const std::string& path, std::vector<TensorSpec> specs,
                              const TensorProducer& produce, const Metadata& metadata) {
  std::set<std::string> names;
  for (const TensorSpec& spec : specs) {
    if (spec.name == "__metadata__" || !names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer: duplicate or reserved tensor name \"", spec.name, "\""));
    }
    for (int64_t d : spec.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors writer: negative dimension in \"", spec.name, "\""));
      }
    }
    uint64_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<uint64_t>(d);
    if (numel * DtypeBits(spec.dtype) % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer: \"", spec.name, "\" is not a whole number of bytes"));
    }
  }
  std::stable_sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
    const int abits = DtypeBits(a.dtype), bbits = DtypeBits(b.dtype);
    return abits != bbits ? abits > bbits : a.name < b.name;
  });

  std::string header = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [key, value] : metadata) {
    absl::StrAppend(&header, first ? "" : ",", Quoted(key), ":", Quoted(value));
    first = false;
  }
  header += "}";
  uint64_t offset = 0;
  for (const TensorSpec& spec : specs) {
    const uint64_t size = ByteSize(spec);
    absl::StrAppend(&header, ",", Quoted(spec.name), ":{\"dtype\":\"", DtypeName(spec.dtype),
                    "\",\"shape\":[");
    for (size_t i = 0; i < spec.shape.size(); ++i) {
      absl::StrAppend(&header, i ? "," : "", spec.shape[i]);
    }
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", offset + size, "]}");
    offset += size;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  // Readers see the old file or the whole new one; a failure leaves no temporary file.
  AtomicFileWriter out(path);
  char length[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.Append(absl::string_view(length, 8));
  out.Append(header);
  std::string bytes;
  for (const TensorSpec& spec : specs) {
    if (!out.status().ok()) break;
    bytes.clear();
    QLORA_RETURN_IF_ERROR(produce(spec, &bytes));
    if (bytes.size() != ByteSize(spec)) {
      return absl::InternalError(absl::StrCat("safetensors writer: producer gave ", bytes.size(),
                                              " bytes for \"", spec.name, "\", expected ", ByteSize(spec)));
    }
    out.Append(bytes);
  }
  return out.Commit();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                              const Metadata& metadata) {
  std::vector<TensorSpec> specs;
  std::map<std::string, const TensorBytes*> by_name;
  for (const TensorBytes& t : tensors) {
    specs.push_back(t.spec);
    by_name[t.spec.name] = &t;
  }
  return WriteSafetensors(
      path, std::move(specs),
      [&](const TensorSpec& spec, std::string* bytes) {
        const TensorBytes& t = *by_name.at(spec.name);
        bytes->assign(static_cast<const char*>(t.data), t.nbytes);
        return absl::OkStatus();
      },
      metadata);
}

}  // namespace qlora::safetensors
