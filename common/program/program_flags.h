// The start of every absl-flags program (qlora-coordinator, qlora-worker, qlora-make-tiny-model):
// `--help` (or -h) prints the usage text and the program's own flags and exits 0; `--version`
// prints "PROGRAM VERSION" and exits 0; anything else goes to absl::ParseCommandLine. absl's own
// --help lists only flags defined in PROGRAM.cc or PROGRAM_main.cc, which these files are not
// named, and exits 1.
#pragma once

#include <string>
#include <vector>

namespace qlora {

struct ProgramFlagsOptions {
  std::string program;                   // "qlora-coordinator"
  std::string usage;                     // the lines before the flags
  std::vector<std::string> flag_files;   // list the flags defined in files ending so
  bool dashed_names = false;             // show --state-dir (the program accepts dashes)
};

// What --help prints: the usage, then each flag of `options.flag_files` with its help and default.
std::string ProgramHelp(const ProgramFlagsOptions& options);

// Handles --help and --version (both exit 0), then parses the flags; returns absl's positional
// arguments (argv[0] first). Only the arguments before a lone "--" are looked at for --help.
std::vector<char*> ParseProgramFlags(int argc, char** argv, const ProgramFlagsOptions& options);

}  // namespace qlora
