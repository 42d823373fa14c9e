// Where the coordinator may listen. The API has no TLS and no client authentication yet, so
// anyone who reaches the port can submit, read and cancel every job: a non-loopback address is
// refused unless the operator says --insecure (and then the first log line says so).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace qlora::coordinator {

// True for 127.0.0.0/8, ::1 and "localhost" (host part of "host:port" or "[v6]:port").
bool IsLoopbackAddress(const std::string& address);

// OK for a loopback address, or any address when `insecure`; FAILED_PRECONDITION otherwise,
// saying what to do.
absl::Status CheckListenAddress(const std::string& address, bool insecure);

}  // namespace qlora::coordinator
