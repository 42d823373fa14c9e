// Arrow cells as record text, and Arrow errors (see arrow_values.h). C++20, like its includers.
#include "common/dataset/arrow_values.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace qlora::data {
namespace {

using Json = nlohmann::ordered_json;

// As the JSON Lines reader: deeper values are malformed (nothing real nests this deep).
constexpr int kMaxJsonDepth = 128;

// The JSON value of a[i]; *too_deep when it nests more than kMaxJsonDepth levels.
Json ToJson(const arrow::Array& a, int64_t i, int depth, bool* too_deep) {
  if (a.IsNull(i)) return nullptr;
  if (depth > kMaxJsonDepth) {
    *too_deep = true;
    return nullptr;
  }
  auto list = [&](const arrow::Array& values, int64_t offset, int64_t length) {
    Json out = Json::array();
    for (int64_t k = 0; k < length; ++k) out.push_back(ToJson(values, offset + k, depth + 1, too_deep));
    return out;
  };
  switch (a.type_id()) {
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(a).Value(i);
    case arrow::Type::INT8: return static_cast<const arrow::Int8Array&>(a).Value(i);
    case arrow::Type::INT16: return static_cast<const arrow::Int16Array&>(a).Value(i);
    case arrow::Type::INT32: return static_cast<const arrow::Int32Array&>(a).Value(i);
    case arrow::Type::INT64: return static_cast<const arrow::Int64Array&>(a).Value(i);
    case arrow::Type::UINT8: return static_cast<const arrow::UInt8Array&>(a).Value(i);
    case arrow::Type::UINT16: return static_cast<const arrow::UInt16Array&>(a).Value(i);
    case arrow::Type::UINT32: return static_cast<const arrow::UInt32Array&>(a).Value(i);
    case arrow::Type::UINT64: return static_cast<const arrow::UInt64Array&>(a).Value(i);
    case arrow::Type::FLOAT: return static_cast<const arrow::FloatArray&>(a).Value(i);
    case arrow::Type::DOUBLE: return static_cast<const arrow::DoubleArray&>(a).Value(i);
    case arrow::Type::STRING:
    case arrow::Type::BINARY:
      return std::string(static_cast<const arrow::BinaryArray&>(a).GetView(i));
    case arrow::Type::LARGE_STRING:
    case arrow::Type::LARGE_BINARY:
      return std::string(static_cast<const arrow::LargeBinaryArray&>(a).GetView(i));
    case arrow::Type::STRING_VIEW:
    case arrow::Type::BINARY_VIEW:
      return std::string(static_cast<const arrow::BinaryViewArray&>(a).GetView(i));
    case arrow::Type::FIXED_SIZE_BINARY:
      return std::string(static_cast<const arrow::FixedSizeBinaryArray&>(a).GetView(i));
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return ToJson(*d.dictionary(), d.GetValueIndex(i), depth, too_deep);
    }
    case arrow::Type::LIST:
    case arrow::Type::MAP: {  // a map's values are struct<key, value>
      const auto& l = static_cast<const arrow::ListArray&>(a);
      return list(*l.values(), l.value_offset(i), l.value_length(i));
    }
    case arrow::Type::LARGE_LIST: {
      const auto& l = static_cast<const arrow::LargeListArray&>(a);
      return list(*l.values(), l.value_offset(i), l.value_length(i));
    }
    case arrow::Type::FIXED_SIZE_LIST: {
      const auto& l = static_cast<const arrow::FixedSizeListArray&>(a);
      return list(*l.values(), l.value_offset(i), l.value_length(i));
    }
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      Json out = Json::object();
      for (int k = 0; k < s.num_fields(); ++k)
        out[s.type()->field(k)->name()] = ToJson(*s.field(k), i, depth + 1, too_deep);
      return out;
    }
    default: {
      arrow::Result<std::shared_ptr<arrow::Scalar>> scalar = a.GetScalar(i);
      return scalar.ok() ? (*scalar)->ToString() : std::string();
    }
  }
}

}  // namespace

std::string ArrowValueText(const arrow::Array& a, int64_t i, std::string* reason) {
  if (a.IsNull(i)) return std::string();
  bool too_deep = false;
  Json value = ToJson(a, i, 1, &too_deep);
  if (too_deep) {
    *reason = absl::StrCat("value nested more than ", kMaxJsonDepth, " levels deep");
    return std::string();
  }
  if (value.is_string()) return value.get_ref<const std::string&>();
  // Binary inside a list or struct may not be UTF-8: replaced (U+FFFD), never thrown.
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void ArrowRowFields(const arrow::RecordBatch& batch, int64_t row, const std::vector<int>& columns,
                    int64_t max_record_bytes, std::vector<std::pair<std::string, std::string>>* fields,
                    std::string* reason) {
  int64_t bytes = 0;
  const int count = columns.empty() ? batch.num_columns() : static_cast<int>(columns.size());
  try {
    for (int k = 0; k < count && reason->empty(); ++k) {
      const int c = columns.empty() ? k : columns[k];
      std::string value = ArrowValueText(*batch.column(c), row, reason);
      bytes += static_cast<int64_t>(value.size());
      fields->emplace_back(batch.schema()->field(c)->name(), std::move(value));
    }
  } catch (const std::exception& e) {
    *reason = absl::StrCat("cannot decode the row: ", e.what());
  }
  if (reason->empty() && bytes > max_record_bytes)
    *reason = absl::StrCat("record longer than max_record_bytes (", max_record_bytes, ")");
  if (!reason->empty()) fields->clear();
}

absl::Status DataFileError(const std::string& path, absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, ": ", why));
}

absl::Status FromArrow(const arrow::Status& status, const std::string& path, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  // Arrow reports a corrupt page (a bad Thrift header) as an IOError too: the file is at fault,
  // not the moment, so nothing here is worth a retry.
  return DataFileError(path, what, status.ToString());
}

}  // namespace qlora::data
