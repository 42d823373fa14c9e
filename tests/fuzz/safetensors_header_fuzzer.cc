// Fuzz target: safetensors files. Feeds the bytes to ParseHeader; every tensor it accepts must
// lie inside the file and hold exactly numel x bits / 8 bytes (computed here without overflow),
// since readers trust the shape. Then opens the bytes as a file (SafetensorsFile::Open: mmap +
// the same parse) and reads the first and last byte of every tensor view.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/safetensors/reader.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace st = qlora::safetensors;
  absl::StatusOr<st::Header> header =
      st::ParseHeader(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!header.ok()) return 0;
  for (const auto& [name, info] : header->tensors) {
    if (info.end < info.begin || header->data_start + info.end > size) std::abort();
    if (info.numel() < 0) std::abort();  // what readers call; UBSan checks its arithmetic
    unsigned __int128 bits = st::DtypeBits(info.dtype);
    for (int64_t d : info.shape) bits *= static_cast<uint64_t>(d);
    if (bits != static_cast<unsigned __int128>(info.end - info.begin) * 8) {
      std::fprintf(stderr, "tensor \"%s\": %llu bytes do not hold its shape\n", name.c_str(),
                   static_cast<unsigned long long>(info.end - info.begin));
      std::abort();
    }
  }

  qlora::fuzz::FuzzFile file(data, size);
  absl::StatusOr<std::unique_ptr<st::SafetensorsFile>> opened =
      st::SafetensorsFile::Open(file.path());
  if (!opened.ok()) std::abort();  // the bytes parsed above
  volatile uint8_t sink = 0;
  for (const auto& [name, info] : (*opened)->tensors()) {
    absl::StatusOr<st::TensorView> view = (*opened)->Get(name);
    if (!view.ok()) std::abort();
    if (view->nbytes > 0) sink = sink ^ view->data[0] ^ view->data[view->nbytes - 1];
  }
  return 0;
}
