// Helpers of the trainer tests: the source folder, and a tiny random LLaMA folder that carries
// the example tokenizer (examples/tokenizer, 512 tokens), as a worker expects a model folder.
#pragma once

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "common/status_macros.h"
#include "worker/engine/tiny_model.h"

namespace qlora::testing {

inline std::string SourceDir() {
  const char* src = std::getenv("QLORA_SOURCE_DIR");
  return src ? src : QLORA_DEFAULT_SOURCE_DIR;
}

// `layers` > 0: that many decoder layers (else the tiny model's).
inline absl::Status MakeTinyModelWithExampleTokenizer(const std::string& dir, int layers = 0) {
  engine::TinyModelOptions model;
  model.config.vocab_size = 512;  // the example tokenizer's
  if (layers > 0) model.config.num_hidden_layers = layers;
  QLORA_RETURN_IF_ERROR(engine::MakeTinyModel(dir, model));
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    QLORA_ASSIGN_OR_RETURN(std::string bytes,
                           ::qlora::ReadFile(absl::StrCat(SourceDir(), "/examples/tokenizer/", name)));
    QLORA_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/", name), bytes));
  }
  return absl::OkStatus();
}

}  // namespace qlora::testing
