// A small argument reader for qloractl's subcommands: positional arguments, --flag VALUE,
// --flag=VALUE, and boolean switches, with an error for anything unknown.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace qlora::cli {

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;   // --name VALUE
  std::set<std::string> switches;              // --follow, -f

  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
  bool Has(const std::string& name) const { return switches.count(name) > 0; }
};

// `value_flags` take a value, `switch_flags` don't; aliases map short to long names ("-f" ->
// "--follow", "-o" -> "--output").
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::set<std::string>& value_flags,
                                     const std::set<std::string>& switch_flags,
                                     const std::map<std::string, std::string>& aliases);

}  // namespace qlora::cli
