// The Tokenizer for SentencePiece tokenizer.model files (LLaMA-2 style).
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/spm_model.h"
#include "worker/data/tokenizer.h"
#include "worker/data/tokenizer_config.h"

namespace qlora::data {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<SpmModel> model) : model_(std::move(model)) {
    special_.bos_id = model_->bos_id();
    special_.eos_id = model_->eos_id();
    special_.pad_id = model_->pad_id();
    special_.add_bos = special_.bos_id >= 0;  // LLaMA-2's default (add_bos_token: true)
  }
  SpecialTokens* mutable_special() { return &special_; }

  absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const override {
    return model_->Encode(text, ids);
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return model_->Decode(ids);
  }
  int32_t TokenToId(absl::string_view token) const override { return model_->PieceToId(token); }
  int32_t vocab_size() const override { return model_->piece_size(); }
  std::string kind() const override { return "tokenizer.model (SentencePiece)"; }

 private:
  std::unique_ptr<SpmModel> model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& model_path, const std::string& config_path) {
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<SpmModel> model, SpmModel::Load(model_path));
  auto tokenizer = std::make_unique<SentencePieceTokenizer>(std::move(model));
  QLORA_ASSIGN_OR_RETURN(TokenizerConfig config, ReadTokenizerConfig(config_path));
  QLORA_RETURN_IF_ERROR(ApplyTokenizerConfig(config, tokenizer.get(), tokenizer->mutable_special()));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace qlora::data
