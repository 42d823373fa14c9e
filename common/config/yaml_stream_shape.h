// How many documents a YAML stream holds, found without yaml-cpp's LoadAll (internal to
// qlora_config). On some invalid streams (a ',' where a node should start, as in ", a") the
// yaml-cpp 0.7 parser reports an empty document at the same place again and again, so LoadAll
// never returns and allocates until the process runs out of memory (jbeder/yaml-cpp#1040, fixed
// upstream by #1319 after 0.8.0). This scan builds nothing and stops at such a place.
#pragma once

#include <string>

namespace qlora::config_internal {

struct YamlStreamShape {
  int documents = 0;
  int second_document_line = 0;  // 1-based line of the second document's first node; 0: none
  int stuck_line = 0;            // 1-based line where the parser stopped advancing; 0: it didn't
};

// Walks `text` with yaml-cpp's event parser. Throws YAML::Exception as YAML::Load does.
YamlStreamShape ScanYamlStream(const std::string& text);

}  // namespace qlora::config_internal
