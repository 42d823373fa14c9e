// Help and version handling before absl::ParseCommandLine (see program_flags.h).
#include "common/program/program_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/program/version.h"

namespace qlora {
namespace {

bool DefinedIn(const absl::CommandLineFlag& flag, const std::vector<std::string>& files) {
  return std::any_of(files.begin(), files.end(),
                     [&](const std::string& f) { return absl::EndsWith(flag.Filename(), f); });
}

}  // namespace

std::string ProgramHelp(const ProgramFlagsOptions& options) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (DefinedIn(*flag, options.flag_files)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat(options.usage, "\n\nFlags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string name = options.dashed_names ? absl::StrReplaceAll(flag->Name(), {{"_", "-"}})
                                                  : std::string(flag->Name());
    const std::string default_value = flag->DefaultValue();
    absl::StrAppend(&out, "  --", name, "\n      ", flag->Help(),
                    default_value.empty() ? "" : absl::StrCat(" (default: ", default_value, ")"), "\n");
  }
  absl::StrAppend(&out, "  --help, -h\n      this text\n  --version\n      print the version\n");
  return out;
}

std::vector<char*> ParseProgramFlags(int argc, char** argv, const ProgramFlagsOptions& options) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      printf("%s", ProgramHelp(options).c_str());
      std::exit(0);
    }
    if (std::strcmp(argv[i], "--version") == 0) {
      printf("%s %s\n", options.program.c_str(), ProjectVersion());
      std::exit(0);
    }
  }
  absl::SetProgramUsageMessage(options.usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace qlora
