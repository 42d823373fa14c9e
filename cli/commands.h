// qloractl's subcommands as data: each one's usage, flags and examples. `qloractl CMD --help`
// prints CommandHelp(CMD); the argument reader accepts a flag only for the commands that list it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/cli_args.h"

namespace qlora::cli {

struct FlagSpec {
  std::string name;        // "--dataset"
  std::string alias;       // "-f", or ""
  std::string value_name;  // "PATH"; "" for a switch
  std::string help;
};

struct CommandSpec {
  std::string name;                 // "submit"
  std::string usage;                // "JOB.yaml [KEY.PATH=VALUE ...]"
  std::string summary;              // one line
  std::string description;          // a paragraph, or ""
  std::vector<FlagSpec> flags;      // its own flags
  bool connects = true;             // its help lists the connection flags
  std::vector<std::string> examples;
};

// Every subcommand, in the order of the overview.
const std::vector<CommandSpec>& Commands();
// The named subcommand; nullptr when there is none.
const CommandSpec* FindCommand(const std::string& name);

// `qloractl --help`: every subcommand with its summary.
std::string OverviewHelp();
// `qloractl CMD --help`: its usage, flags (its own, then the connection and output flags) and
// examples.
std::string CommandHelp(const CommandSpec& command);

// The flag sets and aliases for ParseArgs: the union over every command and the global flags.
std::set<std::string> AllValueFlags();
std::set<std::string> AllSwitchFlags();
std::map<std::string, std::string> AllAliases();

// INVALID_ARGUMENT naming the first flag in `args` that `command` does not take (its own, the
// common and the connection flags are taken).
absl::Status CheckFlagsFor(const CommandSpec& command, const ParsedArgs& args);

}  // namespace qlora::cli
