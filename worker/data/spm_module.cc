// libqlora_spm: sentencepiece behind the C interface of spm_module_api.h. Includes no Abseil
// (Debian's sentencepiece header declares its own absl::string_view).
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/data/spm_module_api.h"

namespace {

char* CopyError(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

sentencepiece::SentencePieceProcessor* Processor(void* model) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* qlora_spm_load(const char* path, char** error) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  auto status = processor->Load(path);
  if (!status.ok()) {
    *error = CopyError(status.ToString());
    delete processor;
    return nullptr;
  }
  return processor;
}

__attribute__((visibility("default"))) void qlora_spm_unload(void* model) {
  delete Processor(model);
}

__attribute__((visibility("default"))) char* qlora_spm_encode(void* model, const char* text,
                                                              size_t length,
                                                              qlora_spm_int_sink sink,
                                                              void* context) {
  std::vector<int> ids;
  auto status = Processor(model)->Encode(std::string_view(text, length), &ids);
  if (!status.ok()) return CopyError(status.ToString());
  sink(context, ids.data(), ids.size());
  return nullptr;
}

__attribute__((visibility("default"))) char* qlora_spm_decode(void* model, const int* ids,
                                                              size_t count,
                                                              qlora_spm_byte_sink sink,
                                                              void* context) {
  std::string text;
  auto status = Processor(model)->Decode(std::vector<int>(ids, ids + count), &text);
  if (!status.ok()) return CopyError(status.ToString());
  sink(context, text.data(), text.size());
  return nullptr;
}

__attribute__((visibility("default"))) int qlora_spm_piece_to_id(void* model, const char* piece,
                                                                 size_t length) {
  auto* processor = Processor(model);
  std::string_view view(piece, length);
  int id = processor->PieceToId(view);
  // Unknown pieces map to unk; only the unk piece itself may legitimately do so.
  if (id == processor->unk_id() && processor->IdToPiece(id) != view) return -1;
  return id;
}

__attribute__((visibility("default"))) int qlora_spm_field(void* model, int field) {
  auto* processor = Processor(model);
  switch (field) {
    case QLORA_SPM_PIECE_SIZE: return processor->GetPieceSize();
    case QLORA_SPM_BOS: return processor->bos_id();
    case QLORA_SPM_EOS: return processor->eos_id();
    case QLORA_SPM_PAD: return processor->pad_id();
  }
  return -1;
}

__attribute__((visibility("default"))) void qlora_spm_free_string(char* text) { std::free(text); }

}  // extern "C"
