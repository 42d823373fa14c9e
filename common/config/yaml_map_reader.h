// Typed, checked reads from one YAML mapping of the job file (internal to qlora_config).
//
// A MapReader is opened on a mapping together with its SchemaNode and dotted path. Opening it
// checks every key (scalar, unique, known, not refused); the typed Read* calls check the value's
// type and range. Every error is INVALID_ARGUMENT with the text
//   "<source>:<line>: <path>: <problem>"
// where <line> is 1-based (yaml-cpp's marks are 0-based). yaml-cpp never throws from here: values
// are decoded with YAML::convert<T>::decode, which reports failure by returning false.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/config_enums.h"
#include "common/config/job_config_schema.h"
#include "yaml-cpp/yaml.h"

namespace qlora::config_internal {

// The 1-based line of a node, or 0 when yaml-cpp has no mark for it.
int LineOf(const YAML::Node& node);

// Where errors point: the file's name and, for each dotted path read so far, its line.
class ErrorSite {
 public:
  explicit ErrorSite(std::string source_name) : source_(std::move(source_name)) {}

  // "<source>:<line>: <path>: <problem>"; line 0 and an empty path are left out.
  absl::Status Error(int line, const std::string& path, const std::string& problem) const;
  // Same, with the line recorded for `path` (0 when the path was not in the file).
  absl::Status ErrorAt(const std::string& path, const std::string& problem) const;

  void Record(const std::string& path, int line) { lines_[path] = line; }
  int Line(const std::string& path) const;

 private:
  std::string source_;
  std::map<std::string, int> lines_;
};

// An inclusive or exclusive bound for numeric reads.
struct Bound {
  double value;
  bool inclusive;
};

class MapReader {
 public:
  // `node` may be a mapping or null (absent / `key:` with no value: an empty mapping). Anything
  // else is an error naming `path`. `site` must outlive the reader.
  static absl::StatusOr<MapReader> Open(ErrorSite* site, const YAML::Node& node,
                                        const SchemaNode& schema, std::string path);

  const std::string& path() const { return path_; }
  ErrorSite* site() const { return site_; }
  // Present with a non-null value.
  bool Has(const std::string& key) const;
  // The value node (an undefined/null node when absent).
  YAML::Node Get(const std::string& key) const;
  std::string PathOf(const std::string& key) const;
  const SchemaNode& SchemaOf(const std::string& key) const;  // key must be in the schema
  // An error about `key`'s value, pointing at its line (the mapping's line when absent).
  absl::Status Error(const std::string& key, const std::string& problem) const;
  // An error about this mapping as a whole.
  absl::Status ErrorHere(const std::string& problem) const;

  // Typed reads. Absent or null keys leave *out unchanged and return OK.
  absl::Status ReadBool(const std::string& key, bool* out) const;
  absl::Status ReadString(const std::string& key, std::string* out) const;
  // One of `choices`; the message lists them.
  absl::Status ReadChoice(const std::string& key, const std::vector<std::string>& choices,
                          std::string* out) const;
  // One of the names of enum E (config_enums.h); `*out` is kept when the key is absent.
  template <typename E>
  absl::Status ReadEnum(const std::string& key, E* out) const {
    std::string name = EnumName(*out);
    absl::Status status = ReadChoice(key, EnumNames<E>(), &name);
    if (status.ok()) *out = *ParseEnumName<E>(name);
    return status;
  }
  // An integer (integral floats such as 5e8 are accepted) in [min, max].
  absl::Status ReadInt(const std::string& key, int64_t min, int64_t max, int64_t* out) const;
  absl::Status ReadInt(const std::string& key, int min, int max, int* out) const;
  absl::Status ReadUint(const std::string& key, uint64_t* out) const;
  // A finite number between the bounds.
  absl::Status ReadNumber(const std::string& key, Bound min, Bound max, double* out) const;
  // A mapping child, checked against its schema node.
  absl::StatusOr<MapReader> OpenMap(const std::string& key) const;

 private:
  MapReader(ErrorSite* site, YAML::Node node, const SchemaNode* schema, std::string path)
      : site_(site), node_(std::move(node)), schema_(schema), path_(std::move(path)) {}

  ErrorSite* site_;
  YAML::Node node_;
  const SchemaNode* schema_;
  std::string path_;
};

// Helpers shared with list reads (features, target_modules, betas).
// A scalar that was written unquoted (quoted scalars are strings, never numbers or booleans).
bool IsPlainScalar(const YAML::Node& node);
// How a value looks in a message: "the string \"x\"", "a list", "a mapping", "'3'".
std::string Describe(const YAML::Node& node);
// Decodes a number scalar; false when it is not one.
bool DecodeNumber(const YAML::Node& node, double* out);

}  // namespace qlora::config_internal
