// A GGUF file (version 3, the format llama.cpp and Ollama load; ggml's docs/gguf.md) written in
// one pass: the metadata and every tensor's name, shape and type are declared first, then the
// tensors' bytes are written in declaration order, each padded to the file's alignment.
//
//   "GGUF" | version 3 | tensor count u64 | metadata count u64 | metadata (key, type, value)...
//   | tensor infos (name, n_dims, dims innermost first, ggml type, offset)... | pad | data...
//
// Torch-free, little-endian hosts only (as GGUF itself).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace qlora::gguf {

// ggml's tensor types used here (ggml.h's enum ggml_type).
enum class TensorType : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30 };

// Bytes of a row of `columns` values of `type` (Q8_0: blocks of 32, 34 bytes each).
int64_t RowBytes(TensorType type, int64_t columns);

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32) : alignment_(alignment) {}

  // Metadata, in the order given.
  void AddString(const std::string& key, const std::string& value);
  void AddUint32(const std::string& key, uint32_t value);
  void AddInt32(const std::string& key, int32_t value);
  void AddFloat32(const std::string& key, float value);
  void AddBool(const std::string& key, bool value);
  void AddStringArray(const std::string& key, const std::vector<std::string>& values);
  void AddFloat32Array(const std::string& key, const std::vector<float>& values);
  void AddInt32Array(const std::string& key, const std::vector<int32_t>& values);

  // A tensor of `shape` (PyTorch order, outermost first) and `type`, whose bytes WriteTensor
  // gives later, in the same order.
  void DeclareTensor(const std::string& name, const std::vector<int64_t>& shape, TensorType type);

  // Writes the header, metadata and tensor infos to `path` (created 0644 less the umask).
  absl::Status Begin(const std::string& path);
  // The next declared tensor's bytes (exactly its size).
  absl::Status WriteTensor(const void* data, int64_t bytes);
  // Checks every declared tensor was written and closes the file.
  absl::Status Finish();
  ~GgufWriter();

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    TensorType type;
    int64_t bytes;
    uint64_t offset;
  };
  void Key(const std::string& key, uint32_t value_type);
  void String(std::string* out, const std::string& s) const;
  template <typename T>
  void Put(std::string* out, T value) const;
  absl::Status Pad();

  uint32_t alignment_;
  std::string metadata_;
  uint64_t metadata_count_ = 0;
  std::vector<Tensor> tensors_;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
  std::string path_;
  uint64_t written_ = 0;
};

}  // namespace qlora::gguf
