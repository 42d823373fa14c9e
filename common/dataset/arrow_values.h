// What the Arrow-based readers (Parquet files, Arrow IPC files) share: a cell as record text, and
// Arrow's errors as the data path's. Includes Arrow, whose headers need C++20: only the readers'
// .cc files (built as C++20, common/dataset/CMakeLists.txt) include it.
//
// Values as text, as the JSON Lines reader keeps them: strings (and binary) as they are; null
// as ""; integers, floats and bools as their JSON text ("7", "0.5", "true"); lists, structs and
// maps as compact JSON (a list<struct<role, content>> `messages` column reads as the JSONL
// `messages` array; a map is a list of {"key", "value"} objects; a dictionary column as its
// values); any other type (dates, timestamps, decimals) as Arrow's text of the value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "arrow/api.h"

namespace qlora::data {

// a[i] as record text; *reason when it is malformed (nested deeper than JSON Lines allows).
std::string ArrowValueText(const arrow::Array& a, int64_t i, std::string* reason);

// Row `row` of `batch` as the record's fields: the columns at `columns` (every column when
// empty), each as ArrowValueText; *reason, and no fields, when a value is malformed or the
// values add up to more than `max_record_bytes`.
void ArrowRowFields(const arrow::RecordBatch& batch, int64_t row, const std::vector<int>& columns,
                    int64_t max_record_bytes, std::vector<std::pair<std::string, std::string>>* fields,
                    std::string* reason);

// INVALID_ARGUMENT "<path>: <what>: <why>": a file at fault, never worth a retry.
absl::Status DataFileError(const std::string& path, absl::string_view what, absl::string_view why);
absl::Status FromArrow(const arrow::Status& status, const std::string& path, absl::string_view what);

}  // namespace qlora::data
