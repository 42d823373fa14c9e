// NFC/NFD/NFKC/NFKD through ICU's C API: UTF-8 -> UTF-16 -> normalize -> UTF-8.
#include "worker/data/unicode_normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "absl/strings/str_cat.h"

namespace qlora::data {
namespace {

const UNormalizer2* Instance(UnicodeNormalizer::Form form, UErrorCode* error) {
  switch (form) {
    case UnicodeNormalizer::Form::kNfc: return unorm2_getNFCInstance(error);
    case UnicodeNormalizer::Form::kNfd: return unorm2_getNFDInstance(error);
    case UnicodeNormalizer::Form::kNfkc: return unorm2_getNFKCInstance(error);
    case UnicodeNormalizer::Form::kNfkd: return unorm2_getNFKDInstance(error);
  }
  return nullptr;
}

std::u16string ToUtf16(absl::string_view utf8) {
  std::u16string out(utf8.size() + 1, u'\0');  // UTF-16 never needs more units than UTF-8 bytes
  int32_t length = 0;
  UErrorCode error = U_ZERO_ERROR;
  u_strFromUTF8WithSub(out.data(), static_cast<int32_t>(out.size()), &length, utf8.data(),
                       static_cast<int32_t>(utf8.size()), 0xFFFD, nullptr, &error);
  out.resize(U_SUCCESS(error) ? length : 0);
  return out;
}

std::string ToUtf8(const std::u16string& utf16) {
  std::string out(utf16.size() * 3 + 1, '\0');  // at most 3 bytes per UTF-16 unit
  int32_t length = 0;
  UErrorCode error = U_ZERO_ERROR;
  u_strToUTF8WithSub(out.data(), static_cast<int32_t>(out.size()), &length, utf16.data(),
                     static_cast<int32_t>(utf16.size()), 0xFFFD, nullptr, &error);
  out.resize(U_SUCCESS(error) ? length : 0);
  return out;
}

}  // namespace

absl::StatusOr<UnicodeNormalizer::Form> UnicodeNormalizer::ParseForm(absl::string_view type) {
  if (type == "NFC") return Form::kNfc;
  if (type == "NFD") return Form::kNfd;
  if (type == "NFKC") return Form::kNfkc;
  if (type == "NFKD") return Form::kNfkd;
  return absl::UnimplementedError(absl::StrCat(
      "normalizer '", type, "' is not supported (NFC, NFD, NFKC, NFKD or a Sequence of them)"));
}

absl::StatusOr<UnicodeNormalizer> UnicodeNormalizer::Create(std::vector<Form> forms) {
  std::vector<const void*> normalizers;
  for (Form form : forms) {
    UErrorCode error = U_ZERO_ERROR;
    const UNormalizer2* n = Instance(form, &error);
    if (U_FAILURE(error) || n == nullptr) {
      return absl::InternalError(absl::StrCat("ICU normalizer: ", u_errorName(error)));
    }
    normalizers.push_back(n);
  }
  return UnicodeNormalizer(std::move(normalizers));
}

std::string UnicodeNormalizer::Normalize(absl::string_view utf8) const {
  bool ascii = true;  // every form leaves ASCII as it is
  for (char c : utf8) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii || normalizers_.empty()) return std::string(utf8);
  std::u16string text = ToUtf16(utf8);
  for (const void* handle : normalizers_) {
    const auto* n = static_cast<const UNormalizer2*>(handle);
    UErrorCode error = U_ZERO_ERROR;
    const int32_t done = unorm2_spanQuickCheckYes(n, text.data(), static_cast<int32_t>(text.size()),
                                                  &error);
    if (U_SUCCESS(error) && done == static_cast<int32_t>(text.size())) continue;  // already so
    error = U_ZERO_ERROR;
    const int32_t needed = unorm2_normalize(n, text.data(), static_cast<int32_t>(text.size()),
                                            nullptr, 0, &error);
    std::u16string out(needed, u'\0');
    error = U_ZERO_ERROR;
    unorm2_normalize(n, text.data(), static_cast<int32_t>(text.size()), out.data(), needed, &error);
    if (U_SUCCESS(error)) text = std::move(out);
  }
  return ToUtf8(text);
}

}  // namespace qlora::data
