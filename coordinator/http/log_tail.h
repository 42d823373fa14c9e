// The last bytes of a worker's log file, for the status page. Opened without following a link
// and without blocking (O_NOFOLLOW | O_NONBLOCK) and read only when it is a regular file, so a
// log path swapped for a FIFO or a device cannot hang the reader. Call it without any lock.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace qlora::coordinator {

// At most `max_bytes` from the end of `path`, starting at a line's start when it was cut. ""
// for a file that does not exist (yet); FAILED_PRECONDITION for one that is not a regular file.
absl::StatusOr<std::string> ReadLogTail(const std::string& path, int64_t max_bytes);

}  // namespace qlora::coordinator
