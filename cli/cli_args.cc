// qloractl argument reader (see cli_args.h).
#include "cli/cli_args.h"

#include "absl/strings/str_cat.h"

namespace qlora::cli {

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::set<std::string>& value_flags,
                                     const std::set<std::string>& switch_flags,
                                     const std::map<std::string, std::string>& aliases) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {
      out.positional.push_back(arg);
      continue;
    }
    std::string value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (auto a = aliases.find(arg); a != aliases.end()) arg = a->second;
    if (switch_flags.count(arg)) {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat(arg, " takes no value"));
      out.switches.insert(arg);
    } else if (value_flags.count(arg)) {
      if (!has_value) {
        if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
        value = args[++i];
      }
      out.values[arg] = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", arg));
    }
  }
  return out;
}

}  // namespace qlora::cli
