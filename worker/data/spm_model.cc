// Loads libqlora_spm with dlopen and forwards to its C interface (see spm_model.h).
#include "worker/data/spm_model.h"

#include <dlfcn.h>
#include <unistd.h>


#include "absl/strings/str_cat.h"
#include "worker/data/spm_module_api.h"

namespace qlora::data {

struct SpmModel::Api {
  decltype(&qlora_spm_load) load;
  decltype(&qlora_spm_unload) unload;
  decltype(&qlora_spm_encode) encode;
  decltype(&qlora_spm_decode) decode;
  decltype(&qlora_spm_piece_to_id) piece_to_id;
  decltype(&qlora_spm_field) field;
  decltype(&qlora_spm_free_string) free_string;
  std::string path;  // where the module was loaded from
};

namespace {

std::vector<std::string> ModuleCandidates() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("QLORA_SPM_MODULE"); env != nullptr && *env != '\0')
    candidates.push_back(env);
  // readlink, not std::filesystem: the worker loads libtorch.so, which exports an incompatible
  // copy of std::filesystem.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    candidates.push_back(dir + "/libqlora_spm.so");
    // An installed tree: PREFIX/bin/qlora-worker and PREFIX/lib/libqlora_spm.so.
    candidates.push_back(dir.substr(0, dir.rfind('/')) + "/lib/libqlora_spm.so");
  }
#ifdef QLORA_SPM_MODULE_BUILD_PATH
  candidates.push_back(QLORA_SPM_MODULE_BUILD_PATH);
#endif
  return candidates;
}

// RTLD_DEEPBIND keeps the module's embedded protobuf-lite apart from a libprotobuf in the same
// process (spm_model.h). AddressSanitizer refuses to dlopen with it (google/sanitizers#611), so
// a sanitizer build loads without it: safe in a process without libprotobuf (the data tests and
// fuzz targets); spm_isolation_test, which links libprotobuf on purpose, is not run there.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kDeepBind = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

template <typename T>
bool Bind(void* handle, const char* name, T* out) {
  *out = reinterpret_cast<T>(dlsym(handle, name));
  return *out != nullptr;
}

absl::StatusOr<const SpmModel::Api*> LoadApiOnce() {
  std::string tried;
  for (const std::string& path : ModuleCandidates()) {
    if (access(path.c_str(), F_OK) != 0) {
      absl::StrAppend(&tried, " ", path, " (missing)");
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
    if (handle == nullptr) {
      absl::StrAppend(&tried, " ", path, " (", dlerror(), ")");
      continue;
    }
    auto* api = new SpmModel::Api();
    if (Bind(handle, "qlora_spm_load", &api->load) &&
        Bind(handle, "qlora_spm_unload", &api->unload) &&
        Bind(handle, "qlora_spm_encode", &api->encode) &&
        Bind(handle, "qlora_spm_decode", &api->decode) &&
        Bind(handle, "qlora_spm_piece_to_id", &api->piece_to_id) &&
        Bind(handle, "qlora_spm_field", &api->field) &&
        Bind(handle, "qlora_spm_free_string", &api->free_string)) {
      api->path = path;
      return api;
    }
    delete api;
    absl::StrAppend(&tried, " ", path, " (missing symbols)");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot load libqlora_spm (SentencePiece support); set QLORA_SPM_MODULE. Tried:", tried));
}

// The module's entry points, resolved once per process. The library stays loaded: unloading
// sentencepiece's embedded protobuf is not safe.
absl::StatusOr<const SpmModel::Api*> LoadApi() {
  static const absl::StatusOr<const SpmModel::Api*>* api =
      new absl::StatusOr<const SpmModel::Api*>(LoadApiOnce());  // immutable once loaded
  return *api;
}

absl::Status TakeError(const SpmModel::Api* api, char* error, absl::string_view what) {
  if (error == nullptr) return absl::OkStatus();
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(what, ": ", error));
  api->free_string(error);
  return status;
}

}  // namespace

absl::StatusOr<std::string> SpmModel::ModulePath() {
  absl::StatusOr<const Api*> api = LoadApi();
  if (!api.ok()) return api.status();
  return (*api)->path;
}

absl::StatusOr<std::unique_ptr<SpmModel>> SpmModel::Load(const std::string& path) {
  absl::StatusOr<const Api*> api = LoadApi();
  if (!api.ok()) return api.status();
  char* error = nullptr;
  void* model = (*api)->load(path.c_str(), &error);
  if (model == nullptr) return TakeError(*api, error, path);
  return std::unique_ptr<SpmModel>(new SpmModel(*api, model));
}

SpmModel::~SpmModel() { api_->unload(model_); }

absl::Status SpmModel::Encode(absl::string_view text, std::vector<int32_t>* ids) const {
  auto sink = [](void* context, const int* data, size_t count) {
    auto* out = static_cast<std::vector<int32_t>*>(context);
    out->insert(out->end(), data, data + count);
  };
  return TakeError(api_, api_->encode(model_, text.data(), text.size(), sink, ids),
                   "sentencepiece encode");
}

absl::StatusOr<std::string> SpmModel::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  auto sink = [](void* context, const char* data, size_t count) {
    static_cast<std::string*>(context)->assign(data, count);
  };
  std::vector<int> plain(ids.begin(), ids.end());
  absl::Status status = TakeError(
      api_, api_->decode(model_, plain.data(), plain.size(), sink, &text), "sentencepiece decode");
  if (!status.ok()) return status;
  return text;
}

int SpmModel::PieceToId(absl::string_view piece) const {
  return api_->piece_to_id(model_, piece.data(), piece.size());
}
int SpmModel::piece_size() const { return api_->field(model_, QLORA_SPM_PIECE_SIZE); }
int SpmModel::bos_id() const { return api_->field(model_, QLORA_SPM_BOS); }
int SpmModel::eos_id() const { return api_->field(model_, QLORA_SPM_EOS); }
int SpmModel::pad_id() const { return api_->field(model_, QLORA_SPM_PAD); }

}  // namespace qlora::data
