// The malformed-record policy shared by every reader, and the JSON Lines and text readers.
#include "common/dataset/record_reader.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/dataset/json_array.h"
#include "common/dataset/arrow_ipc_reader.h"
#include "common/dataset/parquet_reader.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace qlora::data {
namespace {

// Strips one trailing "\n" or "\r\n".
void StripLineEnd(std::string* line) {
  if (!line->empty() && line->back() == '\n') line->pop_back();
  if (!line->empty() && line->back() == '\r') line->pop_back();
}

// How deep a JSON Lines value may nest. A non-string value is kept as its JSON text, and
// nlohmann's dump() recurses once per level: a 1 MB record of nested brackets overflowed the
// stack (found with tests/fuzz/record_reader_fuzzer).
constexpr int kMaxJsonDepth = 128;

// Whether `value` nests arrays and objects more than `limit` levels deep; walks it without
// recursion.
bool NestedDeeperThan(const nlohmann::ordered_json& value, int limit) {
  std::vector<std::pair<const nlohmann::ordered_json*, int>> stack = {{&value, 1}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    if (depth > limit) return true;
    for (const nlohmann::ordered_json& child : *node) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

// Reads physical lines; shared by the JSON Lines and text readers.
class LineReader : public RecordReader {
 public:
  using RecordReader::RecordReader;

 protected:
  // The next non-blank line (without its line end); false at the end.
  bool NextLine(int64_t* offset, int64_t* lines_before, bool* too_long) {
    while (true) {
      line_.clear();
      *offset = file_->position();
      *lines_before = lines_;
      if (!file_->ReadLine(&line_, static_cast<size_t>(options_.max_record_bytes) + 2, too_long))
        return false;
      // A truncated line still consumed its '\n' unless it ran into the shard's end.
      if (*too_long ? file_->position() < shard_.end : (!line_.empty() && line_.back() == '\n'))
        ++lines_;
      StripLineEnd(&line_);
      if (*too_long || !absl::StripAsciiWhitespace(line_).empty()) return true;
    }
  }

  absl::StatusOr<bool> ReadRaw(int64_t* offset, int64_t* lines_before) final {
    if (!NextLine(offset, lines_before, &too_long_)) {
      QLORA_RETURN_IF_ERROR(file_->status());
      return false;
    }
    return true;
  }

  // One line, one record: reports an over-long line and leaves a complete one to ParseLine.
  void Parse(Record* record, std::string* reason) final {
    if (too_long_) {
      *reason = absl::StrCat(Kind(), " longer than max_record_bytes (", options_.max_record_bytes, ")");
      return;
    }
    ParseLine(record, reason);
  }

  // Fills record->fields from line_, or sets *reason when the line is malformed.
  virtual void ParseLine(Record* record, std::string* reason) = 0;
  // What an over-long line is called in its message ("record", "line").
  virtual const char* Kind() const = 0;

  std::string line_;
  bool too_long_ = false;  // of line_
  int64_t lines_ = 0;
};

// Fills record->fields from one JSON object's text (`what` names it in the message when it is
// not one), or sets *reason.
void ParseJsonObject(const std::string& text, const char* what, Record* record, std::string* reason) {
  nlohmann::ordered_json value;
  try {
    value = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range
    *reason = absl::StrCat("invalid JSON: ", e.what());
    return;
  }
  if (!value.is_object()) {
    *reason = absl::StrCat(what, " must be an object, got ", value.type_name());
    return;
  }
  for (auto& [key, item] : value.items()) {
    if (item.is_structured() && NestedDeeperThan(item, kMaxJsonDepth - 1)) {
      record->fields.clear();
      *reason = absl::StrCat("JSON nested more than ", kMaxJsonDepth, " levels deep");
      return;
    }
    if (item.is_string()) {
      record->fields.emplace_back(key, item.get_ref<const std::string&>());
    } else if (item.is_null()) {
      record->fields.emplace_back(key, std::string());
    } else {
      record->fields.emplace_back(key, item.dump());
    }
  }
}

class JsonlReader : public LineReader {
 public:
  using LineReader::LineReader;

 protected:
  const char* Kind() const override { return "record"; }
  void ParseLine(Record* record, std::string* reason) override {
    ParseJsonObject(line_, "a JSON Lines record", record, reason);
  }
};

// The elements of a JSON array file (json_array.h), one record each.
class JsonArrayReader : public RecordReader {
 public:
  JsonArrayReader(const ShardSpec& shard, const ReaderOptions& options,
                  std::unique_ptr<ByteRangeFile> file, int64_t open)
      : RecordReader(shard, options, std::move(file)), scanner_(file_.get()) {
    // A range from the file's start (the planner's begin at an element): past the '['.
    if (shard_.begin <= open) file_->Seek(std::min(open + 1, shard_.end), shard_.end);
  }

 protected:
  absl::StatusOr<bool> ReadRaw(int64_t* offset, int64_t* lines_before) final {
    JsonArrayScanner::Element element;
    if (!scanner_.Next(&element, &text_, static_cast<size_t>(options_.max_record_bytes) + 1)) {
      QLORA_RETURN_IF_ERROR(file_->status());
      return false;
    }
    *offset = element.offset;
    *lines_before = element.lines_before;
    too_long_ = element.too_long;
    return true;
  }

  void Parse(Record* record, std::string* reason) final {
    if (too_long_) {
      *reason = absl::StrCat("element longer than max_record_bytes (", options_.max_record_bytes, ")");
      return;
    }
    ParseJsonObject(text_, "a JSON array element", record, reason);
  }

 private:
  JsonArrayScanner scanner_;
  std::string text_;
  bool too_long_ = false;
};

class TextReader : public LineReader {
 public:
  using LineReader::LineReader;

 protected:
  const char* Kind() const override { return "line"; }
  void ParseLine(Record* record, std::string* /*reason*/) override {
    if (record->offset == 0 && line_.rfind("\xEF\xBB\xBF", 0) == 0) line_.erase(0, 3);  // BOM
    record->fields.emplace_back("text", std::move(line_));
  }
};

}  // namespace

RecordReader::RecordReader(const ShardSpec& shard, const ReaderOptions& options,
                           std::unique_ptr<ByteRangeFile> file)
    : shard_(shard), options_(options), file_(std::move(file)), next_index_(options.first_index) {
  if (file_) file_->Seek(shard_.begin, shard_.end);
}

int64_t MaxRecordBytesForRows(int64_t max_sequence_length) {
  constexpr int64_t kLeast = int64_t{1} << 20;
  constexpr int64_t kBytesPerToken = 16;
  return std::max(kLeast, kBytesPerToken * std::max<int64_t>(max_sequence_length, 0));
}

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const ShardSpec& shard,
                                                                 const ReaderOptions& options) {
  if (options.format == DataFormat::kParquet) return OpenParquetReader(shard, options);
  if (options.format == DataFormat::kArrow) return OpenArrowReader(shard, options);
  QLORA_ASSIGN_OR_RETURN(auto file, ByteRangeFile::Open(shard.path));
  if (shard.begin < 0 || shard.end < shard.begin || shard.end > file->size())
    return absl::InvalidArgumentError(
        absl::StrCat("shard [", shard.begin, ", ", shard.end, ") is outside ", shard.path,
                     " (", file->size(), " bytes)"));
  if (shard.stride < 1 || shard.phase < 0 || shard.phase >= shard.stride)
    return absl::InvalidArgumentError(absl::StrCat("shard of ", shard.path, ": phase ", shard.phase,
                                                   " is not in [0, stride ", shard.stride, ")"));
  switch (options.format) {
    case DataFormat::kJsonl:
      if (const int64_t open = JsonArrayOpen(*file); open >= 0) {
        return std::unique_ptr<RecordReader>(
            new JsonArrayReader(shard, options, std::move(file), open));
      }
      return std::unique_ptr<RecordReader>(new JsonlReader(shard, options, std::move(file)));
    case DataFormat::kText:
      return std::unique_ptr<RecordReader>(new TextReader(shard, options, std::move(file)));
    case DataFormat::kCsv:
      return OpenCsvReader(shard, options, std::move(file));
    case DataFormat::kParquet:
    case DataFormat::kArrow:
      break;  // opened above
  }
  return absl::InvalidArgumentError("unknown data format");
}

absl::StatusOr<int64_t> RecordReader::FileLine(int64_t lines_before) {
  if (shard_.first_line >= 1) return shard_.first_line + lines_before;
  if (lines_before_shard_ < 0) {
    // Only on the error path: count line ends before the shard once, on a second handle so
    // the reading cursor stays where it is.
    QLORA_ASSIGN_OR_RETURN(auto counter, ByteRangeFile::Open(shard_.path));
    QLORA_ASSIGN_OR_RETURN(lines_before_shard_, CountNewlines(*counter, 0, shard_.begin));
  }
  return lines_before_shard_ + 1 + lines_before;
}

absl::StatusOr<bool> RecordReader::Next(Record* record) {
  while (true) {
    int64_t offset = 0, lines_before = 0;
    QLORA_ASSIGN_OR_RETURN(bool more, ReadRaw(&offset, &lines_before));
    if (!more) return false;
    if (options_.select && !options_.select(offset)) continue;
    if (next_index_++ % shard_.stride != shard_.phase) continue;  // another rank's record
    record->fields.clear();
    record->offset = offset;
    std::string reason;
    Parse(record, &reason);
    record->path = shard_.path;
    record->line = shard_.first_line >= 1 ? shard_.first_line + lines_before : -1;
    if (reason.empty()) return true;
    QLORA_ASSIGN_OR_RETURN(int64_t line, FileLine(lines_before));
    std::string message = absl::StrCat(shard_.path, ":", line, ": malformed ",
                                       FormatName(options_.format), " record: ", reason);
    if (!options_.skip_malformed)
      return absl::InvalidArgumentError(
          absl::StrCat(message, " (data.malformed_records: fail; set it to skip to count and "
                                "skip such records)"));
    ++malformed_count_;
    if (malformed_messages_.size() < options_.kept_messages)
      malformed_messages_.push_back(std::move(message));
  }
}

}  // namespace qlora::data
