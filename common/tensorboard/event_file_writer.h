// Writes TensorBoard event files: scalars per step that TensorBoard (and tensorboard's
// EventAccumulator) read, without TensorFlow or a protobuf schema (torch-free).
//
// The file is a TFRecord stream (uint64 length, masked CRC-32C of the length, the bytes, masked
// CRC-32C of the bytes; little-endian) of `tensorflow.Event` messages, encoded by hand from
// their field numbers (event.proto: wall_time 1, step 2, file_version 3, summary 5;
// summary.proto: Summary.value 1, Value.tag 1, Value.simple_value 2). The first record is the
// "brain.Event:2" version event TensorBoard expects. The name is
// events.out.tfevents.<seconds>.<host>.<pid>.<n>, the form TensorBoard's loader globs for.
// Each AddScalars call is one event, written and flushed to the kernel at once (a crash loses
// nothing written before it); not synced to disk per step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace qlora::tensorboard {

struct EventFileOptions {
  double wall_time = 0;  // seconds since the epoch for the file name and version event
  std::string host = "localhost";
  int64_t pid = 0;
};

class EventFileWriter {
 public:
  // Creates `dir` (and parents) and a new event file in it. Never overwrites a file.
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> Open(const std::string& dir,
                                                               const EventFileOptions& options);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One event at `step` with a simple_value per (tag, value).
  absl::Status AddScalars(int64_t step, double wall_time,
                          const std::vector<std::pair<std::string, float>>& scalars);
  // One event at `step` holding `summary`, an encoded tensorflow.Summary (hparams_summary.h).
  absl::Status AddSummary(int64_t step, double wall_time, const std::string& summary);
  const std::string& path() const { return path_; }

 private:
  EventFileWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteRecord(const std::string& event);

  std::string path_;
  std::FILE* file_;
};

}  // namespace qlora::tensorboard
