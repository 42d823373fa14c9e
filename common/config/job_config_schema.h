// The key schema of the job file: every mapping key the parser accepts, at every level, in one
// table. The parser checks each mapping it reads against its SchemaNode (unknown keys, keys that
// are known but refused) and builds "did you mean" suggestions from the same table, so adding a
// field means adding it here once.
//
// The same table is the job-file reference: each key's type, default and meaning, rendered by
// job_file_reference.h (`qloractl explain`, docs/job-file.md). Value types and ranges are
// checked by the parser itself (job_config_parser.cc); a test checks every documented default
// against what the parser resolves.
#pragma once

#include <string>
#include <vector>

namespace qlora::config_internal {

struct SchemaNode {
  std::string key;
  // Keys of the mapping this field holds (empty for scalars and lists of scalars). For a list
  // of mappings (input_features) these are the keys of each element.
  std::vector<SchemaNode> children;
  // Non-empty: the key is known (Ludwig or DeepSpeed defines it) but this service refuses it;
  // the text says why and what to use instead.
  std::string refused_because;
  // The reference: the values it takes, its default as the resolved job file writes it ("" when
  // it has none or it depends on the machine or job; then `default_note` says what it is), what
  // it does, and whose key it is ("Ludwig", "DeepSpeed", "PEFT", "bitsandbytes"; "" for this
  // service's own).
  std::string type;
  std::string default_value;
  std::string default_note;
  std::string doc;
  std::string origin;

  const SchemaNode* Child(const std::string& name) const;
};

// The root: the top-level keys of a job file.
const SchemaNode& JobFileSchema();

// The problem text for an unknown `key` inside the mapping `node` (at `path`, "" for the top
// level): "unknown field; did you mean 'batch_size'?" when a sibling is close, or the full path
// when the key exists elsewhere in the schema ("... belongs under backend.trainer"), else the
// list of valid keys.
std::string UnknownKeyProblem(const SchemaNode& node, const std::string& path,
                              const std::string& key);

// Edit distance (insert, delete, substitute; each costs 1).
int LevenshteinDistance(const std::string& a, const std::string& b);

// Of `candidates`, the first nearest to `typed` (lower-cased) by edit distance, and whether it
// is near enough to be a typo of it: at most 2 edits, or a third of a long name. An empty name
// when there are no candidates. Unknown keys and qloractl's commands are suggested with it.
struct NearestName {
  std::string name;
  bool typo = false;
};
NearestName Nearest(const std::string& typed, const std::vector<std::string>& candidates);

}  // namespace qlora::config_internal
