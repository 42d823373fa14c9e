// GgufWriter (see gguf_file.h).
#include "worker/export/gguf_file.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace qlora::gguf {
namespace {

// gguf_type (ggml's gguf.h): the metadata value types.
enum ValueType : uint32_t {
  kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7, kString = 8, kArray = 9,
};

uint64_t AlignUp(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

}  // namespace

int64_t RowBytes(TensorType type, int64_t columns) {
  switch (type) {
    case TensorType::kF32: return columns * 4;
    case TensorType::kF16:
    case TensorType::kBF16: return columns * 2;
    case TensorType::kQ8_0: return columns / 32 * 34;
  }
  return 0;
}

template <typename T>
void GgufWriter::Put(std::string* out, T value) const {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

void GgufWriter::String(std::string* out, const std::string& s) const {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

void GgufWriter::Key(const std::string& key, uint32_t value_type) {
  String(&metadata_, key);
  Put<uint32_t>(&metadata_, value_type);
  ++metadata_count_;
}

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  Key(key, kString);
  String(&metadata_, value);
}
void GgufWriter::AddUint32(const std::string& key, uint32_t value) {
  Key(key, kUint32);
  Put(&metadata_, value);
}
void GgufWriter::AddInt32(const std::string& key, int32_t value) {
  Key(key, kInt32);
  Put(&metadata_, value);
}
void GgufWriter::AddFloat32(const std::string& key, float value) {
  Key(key, kFloat32);
  Put(&metadata_, value);
}
void GgufWriter::AddBool(const std::string& key, bool value) {
  Key(key, kBool);
  Put<uint8_t>(&metadata_, value ? 1 : 0);
}
void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& values) {
  Key(key, kArray);
  Put<uint32_t>(&metadata_, kString);
  Put<uint64_t>(&metadata_, values.size());
  for (const std::string& v : values) String(&metadata_, v);
}
void GgufWriter::AddFloat32Array(const std::string& key, const std::vector<float>& values) {
  Key(key, kArray);
  Put<uint32_t>(&metadata_, kFloat32);
  Put<uint64_t>(&metadata_, values.size());
  for (float v : values) Put(&metadata_, v);
}
void GgufWriter::AddInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  Key(key, kArray);
  Put<uint32_t>(&metadata_, kInt32);
  Put<uint64_t>(&metadata_, values.size());
  for (int32_t v : values) Put(&metadata_, v);
}

void GgufWriter::DeclareTensor(const std::string& name, const std::vector<int64_t>& shape,
                               TensorType type) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  const int64_t bytes = rows * RowBytes(type, shape.empty() ? 1 : shape.back());
  const uint64_t offset = tensors_.empty()
                              ? 0
                              : AlignUp(tensors_.back().offset + tensors_.back().bytes, alignment_);
  tensors_.push_back({name, shape, type, bytes, offset});
}

absl::Status GgufWriter::Begin(const std::string& path) {
  path_ = path;
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  std::string head;
  head.append("GGUF", 4);
  Put<uint32_t>(&head, 3);
  Put<uint64_t>(&head, tensors_.size());
  Put<uint64_t>(&head, metadata_count_);
  head.append(metadata_);
  for (const Tensor& t : tensors_) {
    String(&head, t.name);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.shape.size()));
    for (auto dim = t.shape.rbegin(); dim != t.shape.rend(); ++dim) Put<uint64_t>(&head, *dim);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&head, t.offset);
  }
  if (std::fwrite(head.data(), 1, head.size(), file_) != head.size()) {
    return absl::DataLossError(absl::StrCat("cannot write ", path));
  }
  written_ = head.size();
  return Pad();
}

absl::Status GgufWriter::Pad() {
  static const char kZeros[64] = {};
  const uint64_t target = AlignUp(written_, alignment_);
  if (target > written_ && std::fwrite(kZeros, 1, target - written_, file_) != target - written_) {
    return absl::DataLossError(absl::StrCat("cannot write ", path_));
  }
  written_ = target;
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteTensor(const void* data, int64_t bytes) {
  if (next_ >= tensors_.size()) return absl::InternalError("more tensors written than declared");
  const Tensor& t = tensors_[next_++];
  if (bytes != t.bytes) {
    return absl::InternalError(absl::StrCat(t.name, ": ", bytes, " bytes given, ", t.bytes, " declared"));
  }
  if (std::fwrite(data, 1, bytes, file_) != static_cast<size_t>(bytes)) {
    return absl::DataLossError(absl::StrCat("cannot write ", path_));
  }
  written_ += bytes;
  return Pad();
}

absl::Status GgufWriter::Finish() {
  if (next_ != tensors_.size()) {
    return absl::InternalError(absl::StrCat(next_, " of ", tensors_.size(), " tensors written"));
  }
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  return closed ? absl::OkStatus() : absl::DataLossError(absl::StrCat("cannot write ", path_));
}

GgufWriter::~GgufWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

}  // namespace qlora::gguf
