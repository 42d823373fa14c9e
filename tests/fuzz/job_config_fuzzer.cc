// Fuzz target: job files. Feeds the bytes to ParseJobConfig (check_paths off, as the coordinator's
// parse before any file exists), and for every accepted file checks the documented round trip:
// EmitResolvedJobYaml's output parses again, both as a job file and as a stored resolved copy
// (ParseResolvedJobConfig), to an equal JobConfig.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/config/job_config_emit.h"
#include "common/config/job_config_parser.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& yaml, const std::string& error) {
  std::fprintf(stderr, "round trip broken: %s\n--- emitted:\n%s\n--- error: %s\n", what,
               yaml.c_str(), error.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qlora::ParseOptions options;
  options.check_paths = false;
  options.base_dir = "/fuzz";  // relative paths resolve here, without reading the cwd
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<qlora::JobConfig> config = qlora::ParseJobConfig(text, options);
  if (!config.ok()) return 0;

  const std::string emitted = qlora::EmitResolvedJobYaml(*config);
  absl::StatusOr<qlora::JobConfig> again = qlora::ParseJobConfig(emitted, options);
  if (!again.ok()) Fail("the emitted file does not parse", emitted, again.status().ToString());
  if (!(*again == *config)) Fail("the emitted file parses to another config", emitted, "");
  absl::StatusOr<qlora::JobConfig> stored = qlora::ParseResolvedJobConfig(emitted);
  if (!stored.ok()) Fail("the stored copy does not parse", emitted, stored.status().ToString());
  if (!(*stored == *config)) Fail("the stored copy parses to another config", emitted, "");
  return 0;
}
