// Fuzz target: encoding text. Loads two fixed tokenizers once: the example byte-level BPE
// tokenizer.json (examples/tokenizer) and the SentencePiece fixture
// (tests/assets/spm_bpe). The first byte picks one; the rest is the text to encode. The
// ids must decode, and for the byte-level tokenizer back to exactly the text (it covers every
// byte, so encoding loses nothing).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/data/tokenizer.h"

namespace {

const qlora::data::Tokenizer& Load(const char* dir) {
  absl::StatusOr<std::unique_ptr<qlora::data::Tokenizer>> tokenizer =
      qlora::data::LoadTokenizer(dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "cannot load the fixed tokenizer %s: %s\n", dir,
                 tokenizer.status().ToString().c_str());
    std::abort();
  }
  return *tokenizer->release();  // lives as long as the process, like the worker's
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const qlora::data::Tokenizer& bpe = Load(QLORA_FUZZ_SOURCE_DIR "/examples/tokenizer");
  static const qlora::data::Tokenizer& spm =
      Load(QLORA_FUZZ_SOURCE_DIR "/tests/assets/spm_bpe");
  const bool use_bpe = (data[0] & 1) == 0;
  const qlora::data::Tokenizer& tokenizer = use_bpe ? bpe : spm;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text);
  if (!ids.ok()) return 0;
  for (int32_t id : *ids)
    if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
  absl::StatusOr<std::string> decoded = tokenizer.Decode(*ids);
  if (!decoded.ok()) std::abort();
  if (use_bpe && *decoded != text) {
    std::fprintf(stderr, "byte-level round trip lost text: %zu bytes in, %zu out\n", text.size(),
                 decoded->size());
    std::abort();
  }
  return 0;
}
