// The CSV (RFC 4180) record reader: steps csv_syntax.h byte by byte, so its records end exactly
// where the shard planner cuts.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/dataset/csv_syntax.h"
#include "common/dataset/record_reader.h"

namespace qlora::data {
namespace {

// One parsed record: its fields, and what was wrong with it.
struct CsvRecord {
  std::vector<std::string> fields;
  int64_t newlines = 0;     // '\n' bytes consumed (inside quotes included)
  bool violation = false;   // stray or misplaced quote
  bool too_long = false;    // more than max bytes
  bool unterminated = false;
  bool blank = true;        // nothing but an optional '\r'
};

// Parses one record starting at the file's cursor; false when no byte was left.
bool ParseCsvRecord(ByteRangeFile& file, int64_t max_bytes, CsvRecord* out) {
  out->fields.clear();
  out->newlines = 0;
  out->violation = out->too_long = out->unterminated = false;
  out->blank = true;
  std::string field;
  int64_t bytes = 0;
  CsvState state = CsvState::kFieldStart;
  int c = file.Get();
  if (c < 0) return false;
  for (; c >= 0; c = file.Get()) {
    CsvStep step = StepCsv(state, static_cast<char>(c));
    if (c == '\n') ++out->newlines;
    if (c != '\r' && c != '\n') out->blank = false;
    out->violation |= step.violation;
    // Delimiters and quotes count toward max_bytes as well as content: a run of empty fields
    // (",,,,") grew the field list without bound before (found by review while fuzzing).
    if (step.append || c == ',' || c == '"') ++bytes;
    if (step.append && bytes <= max_bytes) field.push_back(static_cast<char>(c));
    if (step.field_end) {
      // A CRLF line end after an unquoted field leaves its '\r' in the field: drop it.
      if (step.record_end && state == CsvState::kUnquoted && !field.empty() &&
          field.back() == '\r')
        field.pop_back();
      if (bytes <= max_bytes) out->fields.push_back(std::move(field));
      field.clear();
    }
    state = step.next;
    if (step.record_end) break;
  }
  if (c < 0) {  // end of the shard without a line end
    out->unterminated = state == CsvState::kQuoted;
    if (state == CsvState::kUnquoted && !field.empty() && field.back() == '\r') field.pop_back();
    if (bytes <= max_bytes) out->fields.push_back(std::move(field));
  }
  out->too_long = bytes > max_bytes;
  if (out->blank && out->fields.size() == 1 && out->fields[0].empty()) out->fields.clear();
  return true;
}

class CsvReader : public RecordReader {
 public:
  CsvReader(const ShardSpec& shard, const ReaderOptions& options,
            std::unique_ptr<ByteRangeFile> file, std::vector<std::string> header,
            int64_t data_start, int64_t header_newlines)
      : RecordReader(shard, options, std::move(file)), header_(std::move(header)) {
    // The first shard of a file may start at 0: skip the header there.
    if (shard_.begin < data_start) {
      lines_ = header_newlines;
      file_->Seek(data_start, shard_.end);
    }
  }

 protected:
  absl::StatusOr<bool> ReadRaw(int64_t* offset, int64_t* lines_before) override {
    while (true) {
      *offset = file_->position();
      *lines_before = lines_;
      if (!ParseCsvRecord(*file_, options_.max_record_bytes, &parsed_)) {
        QLORA_RETURN_IF_ERROR(file_->status());
        return false;
      }
      lines_ += parsed_.newlines;
      // A blank line; not an over-long record, whose fields were not kept.
      if (parsed_.fields.empty() && !parsed_.violation && !parsed_.too_long) continue;
      return true;
    }
  }

  void Parse(Record* record, std::string* reason) override {
    if (parsed_.unterminated) {
      *reason = "unterminated quoted field (a '\"' opens a field that never closes)";
    } else if (parsed_.too_long) {
      *reason = absl::StrCat("record longer than max_record_bytes (", options_.max_record_bytes,
                             ")");
    } else if (parsed_.violation) {
      *reason = "misplaced '\"' (a quote inside an unquoted field, or text after a closing "
                "quote; RFC 4180 writes a quote inside a quoted field as \"\")";
    } else if (parsed_.fields.size() != header_.size()) {
      *reason = absl::StrCat("has ", parsed_.fields.size(), " fields, the header has ",
                             header_.size());
    } else {
      for (size_t i = 0; i < header_.size(); ++i)
        record->fields.emplace_back(header_[i], std::move(parsed_.fields[i]));
    }
  }

 private:
  std::vector<std::string> header_;
  CsvRecord parsed_;
  int64_t lines_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> OpenCsvReader(const ShardSpec& shard,
                                                            const ReaderOptions& options,
                                                            std::unique_ptr<ByteRangeFile> file) {
  file->Seek(0, file->size());
  CsvRecord header;
  if (!ParseCsvRecord(*file, options.max_record_bytes, &header) || header.fields.empty()) {
    QLORA_RETURN_IF_ERROR(file->status());
    return absl::InvalidArgumentError(absl::StrCat(shard.path, ":1: CSV file has no header"));
  }
  if (header.unterminated || header.violation || header.too_long)
    return absl::InvalidArgumentError(absl::StrCat(shard.path, ":1: malformed CSV header"));
  // Spreadsheet exports often start with a UTF-8 byte order mark: not part of the first name.
  if (header.fields[0].rfind("\xEF\xBB\xBF", 0) == 0) header.fields[0].erase(0, 3);
  int64_t data_start = file->position();
  return std::unique_ptr<RecordReader>(
      new CsvReader(shard, options, std::move(file), std::move(header.fields), data_start,
                    header.newlines));
}

}  // namespace qlora::data
