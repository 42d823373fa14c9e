// Reads the log of the Ray launcher's driver (deploy/ray/qlora_ray_launcher.py), which carries
// everything the coordinator learns about a start's ranks on the cluster:
//   ... QLORA-LOG <rank> <text>      a line of that rank's output (Ray forwards the rank task's
//                                    output to the driver log with its own "(task pid=.., ip=..)"
//                                    prefix, so the marker may come after other text)
//   QLORA-EXIT <nonce> <json>        at the start of a line, printed by the driver itself: a
//                                    rank's end {"rank", "host", "pid", "code", "signal", "cause"};
//                                    rank -1 ends every rank (e.g. the placement group timed out)
// A rank's output cannot forge an end: its lines carry Ray's prefix before the marker, so they
// never start with QLORA-EXIT, and the nonce (random per start, in the driver's spec, never in a
// worker's environment) is not known to them. Pure; not thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

struct DriverLogNews {
  std::vector<std::pair<int, std::string>> output;   // (rank, line with its newline)
  std::vector<RankEnd> ends;                         // rank -1: every rank
  std::vector<std::string> driver_lines;             // the rest (the driver's own messages)
};

class DriverLogReader {
 public:
  explicit DriverLogReader(absl::string_view nonce);
  // `whole_log`: the driver's log from its start, as Ray's logs API returns it each time. Only
  // the complete lines after what earlier calls consumed are read.
  DriverLogNews Feed(const std::string& whole_log);

 private:
  std::string exit_prefix_;  // "QLORA-EXIT <nonce> "
  size_t consumed_ = 0;
};

}  // namespace qlora::coordinator
