// Reads one .safetensors file: memory-maps it, parses and validates the JSON header the way
// huggingface/safetensors does (Metadata::validate), and hands out zero-copy tensor views.
//
// Validation: the header length fits the file and is at most 100 MB, the header is a JSON object
// starting with '{' (trailing spaces allowed) without duplicate keys, `__metadata__` maps strings
// to strings, each tensor has a known dtype, a non-negative shape and [begin, end) offsets whose
// size equals numel x bits / 8, and the tensors tile the byte buffer exactly (no holes, no
// overlaps, no trailing bytes). Any violation is an InvalidArgument/DataLoss status naming the
// file and the tensor.
//
// Thread-safety: a SafetensorsFile is immutable after Open; concurrent Get calls are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors/dtype.h"

namespace qlora::safetensors {

// Where one tensor lives inside the byte buffer.
struct TensorInfo {
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to the byte buffer
  uint64_t end = 0;    // exclusive
  int64_t numel() const;
};

// A parsed header: tensors by name plus the string metadata.
struct Header {
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length: file offset of the byte buffer
};

// Parses and validates a whole file's bytes (header and buffer). `file_name` is only used in
// error messages.
absl::StatusOr<Header> ParseHeader(absl::string_view file_bytes, absl::string_view file_name);

// A read-only view into a mapped file; valid while its SafetensorsFile lives.
struct TensorView {
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::map<std::string, TensorInfo>& tensors() const { return header_.tensors; }
  bool Contains(const std::string& name) const { return header_.tensors.count(name) > 0; }

  // NotFound when the file has no such tensor.
  absl::StatusOr<TensorView> Get(const std::string& name) const;

  // Tells the kernel the pages behind `view` are no longer needed, so a streaming reader's
  // resident memory stays near one tensor (madvise MADV_DONTNEED; the data stays readable and is
  // paged in again from the file if touched).
  void Evict(const TensorView& view) const;

 private:
  SafetensorsFile(std::string path, const uint8_t* base, size_t size, Header header)
      : path_(std::move(path)), base_(base), size_(size), header_(std::move(header)) {}

  std::string path_;
  const uint8_t* base_;
  size_t size_;
  Header header_;
};

}  // namespace qlora::safetensors
