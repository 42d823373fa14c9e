// Fuzz target: loading tokenizer.json. Feeds the bytes to LoadHfBpeTokenizer as a tokenizer.json
// (a memfd; no tokenizer_config.json), then encodes a fixed text that mixes words, digits,
// whitespace, invalid UTF-8 and LLaMA-3 special-token strings, decodes the ids, and looks up a
// few tokens: a model folder is user input, and the worker does exactly this with it. Every id
// the tokenizer hands out (encoded text, BOS/EOS/pad) must lie inside its vocabulary, since the
// engine indexes its embedding with them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_file.h"
#include "worker/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qlora::fuzz::FuzzFile file(data, size);
  absl::StatusOr<std::unique_ptr<qlora::data::Tokenizer>> tokenizer =
      qlora::data::LoadHfBpeTokenizer(file.path(), "/nonexistent/tokenizer_config.json");
  if (!tokenizer.ok()) return 0;
  static const std::string kText =
      "<|begin_of_text|>Hello, world! It's 2024:  \t12345 ünïcödé \xff\xfe\xc3 "
      "<|start_header_id|>user<|end_header_id|>\n\n  x<|eot_id|>";
  const int32_t vocab_size = (*tokenizer)->vocab_size();
  const qlora::data::SpecialTokens& special = (*tokenizer)->special();
  for (int32_t id : {special.bos_id, special.eos_id, special.pad_id})
    if (id < -1 || id >= vocab_size) std::abort();
  absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode(kText);
  if (ids.ok()) {
    for (int32_t id : *ids)
      if (id < 0 || id >= vocab_size) std::abort();
    if (!(*tokenizer)->Decode(*ids).ok()) std::abort();
  }
  (void)(*tokenizer)->Decode({0, 1, (*tokenizer)->vocab_size() - 1, -1});
  for (const char* token : {"<|begin_of_text|>", "Hello", "\xc4\xa0", ""})
    (void)(*tokenizer)->TokenToId(token);
  return 0;
}
