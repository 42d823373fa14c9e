// The Parquet footer reader and record reader (see parquet_reader.h): the only file of the data
// path that includes Arrow. Compiled as C++20 (Arrow's headers need it; common/dataset/
// CMakeLists.txt); what it exports is Arrow-free.
#include "common/dataset/parquet_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "arrow/api.h"
#include "arrow/io/file.h"
#include "common/dataset/arrow_values.h"
#include "common/dataset/byte_range_file.h"
#include "common/status_macros.h"
#include "parquet/arrow/reader.h"
#include "parquet/arrow/schema.h"
#include "parquet/exception.h"
#include "parquet/file_reader.h"
#include "parquet/metadata.h"
#include "parquet/properties.h"

namespace qlora::data {
namespace {

// Rows per decoded batch: bounds memory (one batch of the selected columns) and costs little.
constexpr int64_t kBatchRows = 256;

// Opens as ByteRangeFile does (OpenRegularFile: O_NONBLOCK, then the type checked), so that a
// FIFO or a device in a dataset's place cannot block the coordinator's planner.
absl::StatusOr<std::shared_ptr<arrow::io::ReadableFile>> OpenFile(const std::string& path) {
  int64_t size = 0;
  QLORA_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &size));
  arrow::Result<std::shared_ptr<arrow::io::ReadableFile>> file = arrow::io::ReadableFile::Open(fd);
  if (!file.ok())  // the ReadableFile owned fd and closed it
    return absl::InvalidArgumentError(absl::StrCat("cannot open ", path, ": ", file.status().message()));
  return std::move(file).ValueUnsafe();
}

// The leaf (Parquet column) indices under a top-level field, in schema order.
void Leaves(const parquet::arrow::SchemaField& field, std::vector<int>* out) {
  if (field.is_leaf()) out->push_back(field.column_index);
  for (const parquet::arrow::SchemaField& child : field.children) Leaves(child, out);
}

class ParquetReader : public RecordReader {
 public:
  ParquetReader(const ShardSpec& shard, const ReaderOptions& options)
      : RecordReader(shard, options, nullptr) {
    shard_.first_line = shard_.begin + 1;
  }

  absl::Status Init() {
    QLORA_ASSIGN_OR_RETURN(std::shared_ptr<arrow::io::ReadableFile> file, OpenFile(shard_.path));
    parquet::ReaderProperties properties = parquet::default_reader_properties();
    properties.enable_buffered_stream();  // pages as they are decoded, not whole column chunks
    parquet::ArrowReaderProperties arrow_properties;
    arrow_properties.set_batch_size(kBatchRows);
    arrow_properties.set_use_threads(false);
    arrow_properties.set_pre_buffer(false);
    parquet::arrow::FileReaderBuilder builder;
    QLORA_RETURN_IF_ERROR(FromArrow(builder.Open(file, properties), shard_.path,
                                    "not a readable Parquet file"));
    arrow::Result<std::unique_ptr<parquet::arrow::FileReader>> reader =
        builder.properties(arrow_properties)->Build();
    QLORA_RETURN_IF_ERROR(FromArrow(reader.status(), shard_.path, "not a readable Parquet file"));
    reader_ = std::move(reader).ValueUnsafe();

    // The columns: the job's, in file order; a missing one is a file-level error.
    const auto& fields = reader_->manifest().schema_fields;
    std::vector<int> leaves;
    std::vector<std::string> names;
    for (const parquet::arrow::SchemaField& field : fields) names.push_back(field.field->name());
    for (const std::string& column : options_.columns)
      if (std::find(names.begin(), names.end(), column) == names.end())
        return absl::InvalidArgumentError(absl::StrCat(
            shard_.path, ": no column '", column, "' (the file has: ", absl::StrJoin(names, ", "),
            ")"));
    const std::vector<std::string>& want = options_.columns;
    const std::vector<std::string>& maybe = options_.optional_columns;
    const bool all = want.empty() && maybe.empty();
    for (const parquet::arrow::SchemaField& field : fields) {
      const std::string& name = field.field->name();
      if (all || std::find(want.begin(), want.end(), name) != want.end() ||
          std::find(maybe.begin(), maybe.end(), name) != maybe.end())
        Leaves(field, &leaves);
    }

    // The row groups that overlap [begin, end).
    const std::shared_ptr<parquet::FileMetaData> metadata = reader_->parquet_reader()->metadata();
    std::vector<int> groups;
    int64_t first = 0;
    for (int g = 0; g < metadata->num_row_groups(); ++g) {
      const int64_t rows = metadata->RowGroup(g)->num_rows();
      if (first + rows > shard_.begin && first < shard_.end) {
        if (groups.empty()) row_ = first;
        groups.push_back(g);
      }
      first += rows;
    }
    if (shard_.end > first)
      return absl::InvalidArgumentError(absl::StrCat("shard rows [", shard_.begin, ", ", shard_.end,
                                                     ") are outside ", shard_.path, " (", first,
                                                     " rows)"));
    if (groups.empty() || leaves.empty()) return absl::OkStatus();
    arrow::Result<std::unique_ptr<arrow::RecordBatchReader>> batches =
        reader_->GetRecordBatchReader(groups, leaves);
    QLORA_RETURN_IF_ERROR(FromArrow(batches.status(), shard_.path, "cannot read Parquet rows"));
    batches_ = std::move(batches).ValueUnsafe();
    return absl::OkStatus();
  }

 protected:
  // The next row of the shard: its row number is the offset (the line is that + 1).
  absl::StatusOr<bool> ReadRaw(int64_t* offset, int64_t* lines_before) override {
    try {
      if (current_) {  // step past the row read last
        ++batch_row_;
        ++row_;
        current_ = false;
      }
      while (true) {
        if (!batches_ || row_ >= shard_.end) return false;
        if (!batch_ || batch_row_ >= batch_->num_rows()) {
          QLORA_RETURN_IF_ERROR(FromArrow(batches_->ReadNext(&batch_), shard_.path,
                                          absl::StrCat("cannot read Parquet rows after row ", row_)));
          batch_row_ = 0;
          if (!batch_) return false;
          continue;
        }
        if (row_ < shard_.begin) {  // rows of the first row group before the shard
          const int64_t skip = std::min(batch_->num_rows() - batch_row_, shard_.begin - row_);
          batch_row_ += skip;
          row_ += skip;
          continue;
        }
        break;
      }
    } catch (const std::exception& e) {  // Parquet's decoders throw on corrupt pages
      return DataFileError(shard_.path, absl::StrCat("cannot read Parquet row ", row_ + 1), e.what());
    }
    current_ = true;
    *offset = row_;
    *lines_before = row_ - shard_.begin;
    return true;
  }

  // The columns of the row ReadRaw stopped at, as text.
  void Parse(Record* record, std::string* reason) override {
    ArrowRowFields(*batch_, batch_row_, {}, options_.max_record_bytes, &record->fields, reason);
  }

 private:
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  std::unique_ptr<arrow::RecordBatchReader> batches_;  // reads from reader_, so declared after
  std::shared_ptr<arrow::RecordBatch> batch_;
  int64_t batch_row_ = 0;  // the next row of batch_
  int64_t row_ = 0;        // its row in the file
  bool current_ = false;   // ReadRaw stopped at row_ (the next call steps past it)
};

}  // namespace

absl::StatusOr<ParquetLayout> ReadParquetLayout(const std::string& path) {
  QLORA_ASSIGN_OR_RETURN(std::shared_ptr<arrow::io::ReadableFile> file, OpenFile(path));
  ParquetLayout layout;
  try {
    std::shared_ptr<parquet::FileMetaData> metadata = parquet::ReadMetaData(file);
    for (int g = 0; g < metadata->num_row_groups(); ++g) {
      layout.row_group_rows.push_back(metadata->RowGroup(g)->num_rows());
      layout.rows += layout.row_group_rows.back();
    }
  } catch (const std::exception& e) {
    return DataFileError(path, "not a readable Parquet file", e.what());
  }
  return layout;
}

absl::StatusOr<std::unique_ptr<RecordReader>> OpenParquetReader(const ShardSpec& shard,
                                                                const ReaderOptions& options) {
  if (shard.begin < 0 || shard.end < shard.begin)
    return absl::InvalidArgumentError(
        absl::StrCat("bad Parquet shard rows [", shard.begin, ", ", shard.end, ") of ", shard.path));
  auto reader = std::make_unique<ParquetReader>(shard, options);
  try {
    QLORA_RETURN_IF_ERROR(reader->Init());
  } catch (const std::exception& e) {
    return DataFileError(shard.path, "not a readable Parquet file", e.what());
  }
  return std::unique_ptr<RecordReader>(std::move(reader));
}

}  // namespace qlora::data
