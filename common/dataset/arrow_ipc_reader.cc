// Arrow IPC files, streaming or file format (see arrow_ipc_reader.h). C++20: includes Arrow.
#include "common/dataset/arrow_ipc_reader.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "arrow/io/memory.h"
#include "arrow/ipc/reader.h"
#include "common/dataset/arrow_values.h"
#include "common/dataset/byte_range_file.h"
#include "common/status_macros.h"

namespace qlora::data {
namespace {

// A read-only mapping of a whole file, unmapped with the last reference to it.
class MappedFile : public arrow::Buffer {
 public:
  MappedFile(const uint8_t* data, int64_t size) : arrow::Buffer(data, size) {}
  ~MappedFile() override { munmap(const_cast<uint8_t*>(data()), static_cast<size_t>(size())); }
};

absl::StatusOr<std::shared_ptr<arrow::Buffer>> MapFile(const std::string& path) {
  int64_t size = 0;
  QLORA_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &size));
  if (size == 0) {
    close(fd);
    return DataFileError(path, "not an Arrow IPC file", "it is empty");
  }
  void* data = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  close(fd);
  if (data == MAP_FAILED) return DataFileError(path, "cannot map it", strerror(mmap_errno));
  return std::make_shared<MappedFile>(static_cast<const uint8_t*>(data), size);
}

// The record batches of a mapped IPC file in order, whichever of the two formats it has.
class BatchSource {
 public:
  static absl::StatusOr<BatchSource> Open(const std::string& path) {
    BatchSource source;
    source.path_ = path;
    QLORA_ASSIGN_OR_RETURN(std::shared_ptr<arrow::Buffer> mapped, MapFile(path));
    auto input = std::make_shared<arrow::io::BufferReader>(mapped);
    constexpr char kFileMagic[] = "ARROW1";
    if (mapped->size() >= 6 && std::memcmp(mapped->data(), kFileMagic, 6) == 0) {
      auto file = arrow::ipc::RecordBatchFileReader::Open(input);
      QLORA_RETURN_IF_ERROR(FromArrow(file.status(), path, "not a readable Arrow file"));
      source.file_ = std::move(file).ValueUnsafe();
    } else {
      auto stream = arrow::ipc::RecordBatchStreamReader::Open(input);
      QLORA_RETURN_IF_ERROR(FromArrow(stream.status(), path, "not a readable Arrow IPC file"));
      source.stream_ = std::move(stream).ValueUnsafe();
    }
    return source;
  }

  std::shared_ptr<arrow::Schema> schema() const { return file_ ? file_->schema() : stream_->schema(); }

  // The next batch, or null at the end.
  absl::StatusOr<std::shared_ptr<arrow::RecordBatch>> Next() {
    std::shared_ptr<arrow::RecordBatch> batch;
    if (file_) {
      if (next_ >= file_->num_record_batches()) return batch;
      auto read = file_->ReadRecordBatch(next_++);
      QLORA_RETURN_IF_ERROR(FromArrow(read.status(), path_, "cannot read a record batch"));
      return std::move(read).ValueUnsafe();
    }
    QLORA_RETURN_IF_ERROR(FromArrow(stream_->ReadNext(&batch), path_, "cannot read a record batch"));
    return batch;
  }

 private:
  std::string path_;
  std::shared_ptr<arrow::ipc::RecordBatchFileReader> file_;
  std::shared_ptr<arrow::ipc::RecordBatchStreamReader> stream_;
  int next_ = 0;
};

class ArrowIpcReader : public RecordReader {
 public:
  ArrowIpcReader(const ShardSpec& shard, const ReaderOptions& options, BatchSource source)
      : RecordReader(shard, options, nullptr), source_(std::move(source)) {
    shard_.first_line = shard_.begin + 1;
  }

  // The job's columns, by index in the file's schema; a missing required one is a file error.
  absl::Status Init() {
    const std::shared_ptr<arrow::Schema> schema = source_.schema();
    std::vector<std::string> names;
    for (const auto& field : schema->fields()) names.push_back(field->name());
    for (const std::string& column : options_.columns) {
      if (std::find(names.begin(), names.end(), column) == names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            shard_.path, ": no column '", column, "' (the file has: ", absl::StrJoin(names, ", "), ")"));
      }
    }
    const std::vector<std::string>& want = options_.columns;
    const std::vector<std::string>& maybe = options_.optional_columns;
    const bool all = want.empty() && maybe.empty();
    for (int c = 0; c < static_cast<int>(names.size()); ++c) {
      if (all || std::find(want.begin(), want.end(), names[c]) != want.end() ||
          std::find(maybe.begin(), maybe.end(), names[c]) != maybe.end()) {
        columns_.push_back(c);
      }
    }
    return absl::OkStatus();
  }

 protected:
  absl::StatusOr<bool> ReadRaw(int64_t* offset, int64_t* lines_before) override {
    if (current_) {  // step past the row read last
      ++batch_row_;
      ++row_;
      current_ = false;
    }
    while (true) {
      if (row_ >= shard_.end) return false;
      if (!batch_ || batch_row_ >= batch_->num_rows()) {
        QLORA_ASSIGN_OR_RETURN(batch_, source_.Next());
        batch_row_ = 0;
        if (!batch_) {
          return absl::InvalidArgumentError(absl::StrCat("shard rows [", shard_.begin, ", ", shard_.end,
                                                         ") are outside ", shard_.path, " (", row_, " rows)"));
        }
        continue;
      }
      if (row_ < shard_.begin) {  // whole batches (zero-copy) and rows before the shard
        const int64_t skip = std::min(batch_->num_rows() - batch_row_, shard_.begin - row_);
        batch_row_ += skip;
        row_ += skip;
        continue;
      }
      break;
    }
    current_ = true;
    *offset = row_;
    *lines_before = row_ - shard_.begin;
    return true;
  }

  void Parse(Record* record, std::string* reason) override {
    ArrowRowFields(*batch_, batch_row_, columns_, options_.max_record_bytes, &record->fields, reason);
  }

 private:
  BatchSource source_;
  std::vector<int> columns_;
  std::shared_ptr<arrow::RecordBatch> batch_;
  int64_t batch_row_ = 0;  // the next row of batch_
  int64_t row_ = 0;        // its row in the file
  bool current_ = false;   // ReadRaw stopped at row_ (the next call steps past it)
};

}  // namespace

absl::StatusOr<ArrowLayout> ReadArrowLayout(const std::string& path) {
  try {
    QLORA_ASSIGN_OR_RETURN(BatchSource source, BatchSource::Open(path));
    ArrowLayout layout;
    while (true) {
      QLORA_ASSIGN_OR_RETURN(std::shared_ptr<arrow::RecordBatch> batch, source.Next());
      if (!batch) return layout;
      layout.batch_rows.push_back(batch->num_rows());
      layout.rows += batch->num_rows();
    }
  } catch (const std::exception& e) {
    return DataFileError(path, "not a readable Arrow IPC file", e.what());
  }
}

absl::StatusOr<std::unique_ptr<RecordReader>> OpenArrowReader(const ShardSpec& shard,
                                                              const ReaderOptions& options) {
  if (shard.begin < 0 || shard.end < shard.begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad Arrow shard rows [", shard.begin, ", ", shard.end, ") of ", shard.path));
  }
  try {
    QLORA_ASSIGN_OR_RETURN(BatchSource source, BatchSource::Open(shard.path));
    auto reader = std::make_unique<ArrowIpcReader>(shard, options, std::move(source));
    QLORA_RETURN_IF_ERROR(reader->Init());
    return std::unique_ptr<RecordReader>(std::move(reader));
  } catch (const std::exception& e) {
    return DataFileError(shard.path, "not a readable Arrow IPC file", e.what());
  }
}

}  // namespace qlora::data
