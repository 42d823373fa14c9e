// BPE merging by rank (see bpe_model.h).
#include "worker/data/bpe_model.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"

namespace qlora::data {

absl::StatusOr<BpeModel> BpeModel::Build(
    absl::flat_hash_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
    int32_t unk_id) {
  BpeModel model;
  model.vocab_ = std::move(vocab);
  model.ignore_merges_ = ignore_merges;
  model.unk_id_ = unk_id;
  for (int b = 0; b < 256; ++b) model.byte_ids_[b] = model.Find(std::string(1, static_cast<char>(b)));
  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    int32_t a = model.Find(left), b = model.Find(right), merged = model.Find(left + right);
    if (a < 0 || b < 0 || merged < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "merge ", rank, " ('", absl::CHexEscape(left), "', '", absl::CHexEscape(right),
          "') names a token the vocabulary lacks"));
    model.merges_.try_emplace(Key(a, b), Merge{static_cast<int32_t>(rank), merged});
  }
  return model;
}

int32_t BpeModel::Find(absl::string_view raw) const {
  auto it = vocab_.find(raw);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::Encode(absl::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    int32_t whole = Find(piece);
    if (whole >= 0) {
      ids->push_back(whole);
      return;
    }
  }
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  // symbols[i] and the rank/result of merging symbols[i] with symbols[i + 1].
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) {
    int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) {
      symbols.push_back(id);
    } else if (unk_id_ >= 0) {
      symbols.push_back(unk_id_);
    }
  }
  std::vector<Merge> pairs(symbols.size(), Merge{kNone, -1});
  auto rank_of = [&](size_t i) {
    if (i + 1 >= symbols.size()) return Merge{kNone, -1};
    auto it = merges_.find(Key(symbols[i], symbols[i + 1]));
    return it == merges_.end() ? Merge{kNone, -1} : it->second;
  };
  for (size_t i = 0; i < symbols.size(); ++i) pairs[i] = rank_of(i);
  while (symbols.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < symbols.size(); ++i)
      if (pairs[i].rank < pairs[best].rank) best = i;
    if (pairs[best].rank == kNone) break;
    symbols[best] = pairs[best].merged;
    symbols.erase(symbols.begin() + best + 1);
    pairs.erase(pairs.begin() + best + 1);
    pairs[best] = rank_of(best);
    if (best > 0) pairs[best - 1] = rank_of(best - 1);
  }
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

}  // namespace qlora::data
