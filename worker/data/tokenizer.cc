// LoadTokenizer: picks tokenizer.json or tokenizer.model in a model folder.
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {
namespace {

// stat(), not std::filesystem: the worker loads libtorch.so, which exports an incompatible copy.
bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::string json = model_dir + "/tokenizer.json";
  const std::string spm = model_dir + "/tokenizer.model";
  const std::string config = model_dir + "/tokenizer_config.json";
  const bool have_json = Exists(json);
  const bool have_spm = Exists(spm);
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
