// SentencePiece through libqlora_spm, loaded at run time (see spm_module_api.h for why the
// worker must not link libsentencepiece). The module is looked up as $QLORA_SPM_MODULE, then
// libqlora_spm.so beside the running executable, then in ../lib from it (an installed tree:
// bin/qlora-worker, lib/libqlora_spm.so), then the build tree's copy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::data {

class SpmModel {
 public:
  static absl::StatusOr<std::unique_ptr<SpmModel>> Load(const std::string& path);
  // The path of the module this process uses, loading it if it is not loaded yet
  // (`qlora-worker --check_spm_module`).
  static absl::StatusOr<std::string> ModulePath();
  ~SpmModel();
  SpmModel(const SpmModel&) = delete;
  SpmModel& operator=(const SpmModel&) = delete;

  absl::Status Encode(absl::string_view text, std::vector<int32_t>* ids) const;
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;
  int PieceToId(absl::string_view piece) const;  // -1 when unknown
  int piece_size() const;
  int bos_id() const;
  int eos_id() const;
  int pad_id() const;

  struct Api;  // the module's entry points (spm_model.cc)

 private:
  SpmModel(const Api* api, void* model) : api_(api), model_(model) {}
  const Api* api_;
  void* model_;
};

}  // namespace qlora::data
