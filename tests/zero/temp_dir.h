// Test helpers of the ZeRO tests: the shared TempDir (tests/util/temp_dir.h) and a file check.
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "tests/util/temp_dir.h"

namespace qlora::testing {


inline bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace qlora::testing
