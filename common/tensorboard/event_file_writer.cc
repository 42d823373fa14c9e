// TFRecord framing and hand-encoded tensorflow.Event / Summary messages (see the header).
#include "common/tensorboard/event_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/posix_files.h"
#include "common/tensorboard/crc32c.h"
#include "common/tensorboard/wire_format.h"

namespace qlora::tensorboard {
namespace {

using wire::kFixed32;
using wire::kFixed64;
using wire::kVarint;
using wire::PutBytes;
using wire::PutKey;
using wire::PutLittleEndian;
using wire::PutVarint;

// tensorflow.Event with wall_time and step set; `rest` is its remaining fields, encoded.
std::string Event(double wall_time, int64_t step, const std::string& rest) {
  std::string event;
  PutKey(1, kFixed64, &event);
  PutLittleEndian(wall_time, &event);
  PutKey(2, kVarint, &event);
  PutVarint(static_cast<uint64_t>(step), &event);
  event += rest;
  return event;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::Status(errno == ENOSPC || errno == EDQUOT ? absl::StatusCode::kResourceExhausted
                                                         : absl::StatusCode::kInternal,
                      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Open(
    const std::string& dir, const EventFileOptions& options) {
  if (absl::Status made = MakeDirs(dir); !made.ok()) return made;
  for (int n = 0;; ++n) {
    const std::string path =
        JoinPath(dir, absl::StrFormat("events.out.tfevents.%d.%s.%d.%d",
                                      static_cast<int64_t>(options.wall_time), options.host,
                                      options.pid, n));
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno == EEXIST && n < 1000) continue;
    if (fd < 0) return Errno("cannot create", path);
    std::FILE* file = fdopen(fd, "wb");
    if (file == nullptr) {
      close(fd);
      return Errno("cannot open", path);
    }
    std::unique_ptr<EventFileWriter> writer(new EventFileWriter(path, file));
    std::string version;
    PutBytes(3, "brain.Event:2", &version);
    if (absl::Status s = writer->WriteRecord(Event(options.wall_time, 0, version)); !s.ok()) {
      return s;
    }
    return writer;
  }
}

EventFileWriter::~EventFileWriter() { std::fclose(file_); }

absl::Status EventFileWriter::AddScalars(
    int64_t step, double wall_time, const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    PutBytes(1, tag, &v);
    PutKey(2, kFixed32, &v);
    PutLittleEndian(value, &v);
    PutBytes(1, v, &summary);
  }
  std::string rest;
  PutBytes(5, summary, &rest);
  return WriteRecord(Event(wall_time, step, rest));
}

absl::Status EventFileWriter::AddSummary(int64_t step, double wall_time, const std::string& summary) {
  std::string rest;
  PutBytes(5, summary, &rest);
  return WriteRecord(Event(wall_time, step, rest));
}

absl::Status EventFileWriter::WriteRecord(const std::string& event) {
  std::string record;
  std::string length;
  PutLittleEndian(static_cast<uint64_t>(event.size()), &length);
  record += length;
  PutLittleEndian(MaskedCrc32c(length), &record);
  record += event;
  PutLittleEndian(MaskedCrc32c(event), &record);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return Errno("cannot write", path_);
  }
  return absl::OkStatus();
}

}  // namespace qlora::tensorboard
