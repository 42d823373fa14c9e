// Dataset format names and detection by file extension.
#include "common/dataset/record.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include <optional>

namespace qlora::data {

absl::StatusOr<DataFormat> ResolveFormat(absl::string_view format, absl::string_view path) {
  std::optional<DatasetFormat> known = ParseEnumName<DatasetFormat>(format.empty() ? "auto" : format);
  if (!known)
    return absl::InvalidArgumentError(
        absl::StrCat("data.format: unknown format '", format, "' (jsonl, csv, text, parquet, arrow or auto)"));
  return ResolveFormat(*known, path);
}

absl::StatusOr<DataFormat> ResolveFormat(DatasetFormat format, absl::string_view path) {
  switch (format) {
    case DatasetFormat::kJsonl: return DataFormat::kJsonl;
    case DatasetFormat::kCsv: return DataFormat::kCsv;
    case DatasetFormat::kText: return DataFormat::kText;
    case DatasetFormat::kParquet: return DataFormat::kParquet;
    case DatasetFormat::kArrow: return DataFormat::kArrow;
    case DatasetFormat::kAuto: break;
  }
  std::string lower = absl::AsciiStrToLower(path);
  for (const char* ext : {".jsonl", ".ndjson", ".json"})
    if (absl::EndsWith(lower, ext)) return DataFormat::kJsonl;
  if (absl::EndsWith(lower, ".csv")) return DataFormat::kCsv;
  if (absl::EndsWith(lower, ".txt") || absl::EndsWith(lower, ".text")) return DataFormat::kText;
  if (absl::EndsWith(lower, ".parquet")) return DataFormat::kParquet;
  if (absl::EndsWith(lower, ".arrow")) return DataFormat::kArrow;
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot tell the format of ", path, " from its name; set data.format (jsonl, csv, text, parquet, arrow)"));
}

absl::string_view FormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kJsonl: return "jsonl";
    case DataFormat::kCsv: return "csv";
    case DataFormat::kText: return "text";
    case DataFormat::kParquet: return "parquet";
    case DataFormat::kArrow: return "arrow";
  }
  return "?";
}

}  // namespace qlora::data
