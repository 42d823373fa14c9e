// Shared helpers of the coordinator tests: a temporary folder, file writing, bounded polling.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace qlora::coordinator::testing {

using TempDir = ::qlora::testing::TempDir;  // tests/util/temp_dir.h

using ::qlora::testing::ReadFile;   // tests/util/files.h
using ::qlora::testing::WriteFile;  // tests/util/files.h

// Calls `done` until it returns true or `timeout` passes; returns its last answer.
inline bool PollUntil(const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

}  // namespace qlora::coordinator::testing
