// LoadTokenizer: picks tokenizer.json or tokenizer.model in a model folder.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::string json = (dir / "tokenizer.json").string();
  const std::string spm = (dir / "tokenizer.model").string();
  const std::string config = (dir / "tokenizer_config.json").string();
  const bool have_json = std::filesystem::exists(json);
  const bool have_spm = std::filesystem::exists(spm);
  if (have_json) {
    auto tokenizer = LoadHfBpeTokenizer(json, config);
    // A tokenizer.json this loader cannot express (e.g. Metaspace) falls back to the
    // SentencePiece model that such folders also ship.
    if (tokenizer.ok() || !have_spm || tokenizer.status().code() != absl::StatusCode::kUnimplemented)
      return tokenizer;
  }
  if (have_spm) return LoadSentencePieceTokenizer(spm, config);
  return absl::NotFoundError(
      absl::StrCat(model_dir, " has neither tokenizer.json nor tokenizer.model"));
}

}  // namespace qlora::data
