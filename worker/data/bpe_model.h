// Byte-level BPE on raw bytes (tokenizers models/bpe): the vocabulary's byte-level spellings
// are decoded to raw bytes once at load, so encoding never builds spelled strings. A pre-token
// that is itself a vocabulary entry maps straight to it when ignore_merges is set; otherwise
// adjacent symbols are merged, lowest merge rank first, leftmost on ties (word.rs merge_all).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::data {

class BpeModel {
 public:
  // `vocab`: raw bytes -> id. `merges`: raw (left, right) pairs in rank order.
  static absl::StatusOr<BpeModel> Build(absl::flat_hash_map<std::string, int32_t> vocab,
                                        const std::vector<std::pair<std::string, std::string>>& merges,
                                        bool ignore_merges, int32_t unk_id);

  // Appends the ids of one pre-token (raw bytes).
  void Encode(absl::string_view piece, std::vector<int32_t>* ids) const;
  int32_t Find(absl::string_view raw) const;  // id or -1

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
};

}  // namespace qlora::data
