// JSON array files: sniffing, the element scanner and the planner's cut (see json_array.h).
#include "common/dataset/json_array.h"

#include "common/status_macros.h"

namespace qlora::data {
namespace {

bool IsJsonSpace(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

int64_t JsonArrayOpen(ByteRangeFile& file) {
  file.Seek(0, file.size());
  int c = file.Get();
  if (c == 0xEF && file.Get() == 0xBB && file.Get() == 0xBF) c = file.Get();  // UTF-8 BOM
  while (IsJsonSpace(c)) c = file.Get();
  return c == '[' ? file.position() - 1 : -1;
}

bool JsonArrayScanner::Next(Element* element, std::string* text, size_t max_bytes) {
  text->clear();
  int c = pending_ >= 0 ? pending_ : file_->Get();
  pending_ = -1;
  while (IsJsonSpace(c) || c == ',') {
    if (c == '\n') ++lines_;
    c = file_->Get();
  }
  if (c < 0 || c == ']') return false;
  element->offset = file_->position() - 1;
  element->lines_before = lines_;
  element->too_long = false;
  int depth = 0;
  bool in_string = false, escaped = false;
  while (c >= 0) {
    if (!in_string && depth == 0 && (c == ',' || c == ']' || IsJsonSpace(c)) &&
        file_->position() - 1 > element->offset) {
      pending_ = c;  // a scalar's end: the next call reads its terminator
      return true;
    }
    if (text->size() < max_bytes) {
      text->push_back(static_cast<char>(c));
    } else {
      element->too_long = true;
    }
    if (c == '\n') ++lines_;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        if (depth == 0) return true;  // a string element
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth <= 0) return true;
    }
    c = file_->Get();
  }
  return true;  // cut off by the range's end: the parser names what is missing
}

absl::StatusOr<std::vector<ShardSpec>> SplitJsonArrayFile(const std::string& path,
                                                          ByteRangeFile& file, int64_t open,
                                                          int num_shards) {
  // Lines before the '[' (the scanner counts from it).
  int64_t lines_before_open = 0;
  file.Seek(0, open);
  for (int c = file.Get(); c >= 0; c = file.Get()) lines_before_open += c == '\n';
  file.Seek(open + 1, file.size());
  JsonArrayScanner scanner(&file);
  std::vector<ShardSpec> shards;
  const int64_t size = file.size();
  JsonArrayScanner::Element element;
  std::string unused;
  while (scanner.Next(&element, &unused, 0)) {
    const int64_t first_line = 1 + lines_before_open + element.lines_before;
    // A new shard where this element starts past the previous shard's share of the bytes.
    const int64_t share = open + 1 + static_cast<int64_t>(static_cast<long double>(size - open - 1) *
                                                          shards.size() / num_shards);
    if (shards.empty() || (static_cast<int>(shards.size()) < num_shards && element.offset >= share)) {
      if (!shards.empty()) shards.back().end = element.offset;
      shards.push_back({path, element.offset, size, first_line});
    }
  }
  QLORA_RETURN_IF_ERROR(file.status());
  return shards;
}

}  // namespace qlora::data
